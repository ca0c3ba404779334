# The redelivery sweep: GitHub never retries a failed delivery by itself, so the sweeper asks it
# to, on a schedule. Cloud Scheduler signs each call as the "scheduler" account, the sweeper's
# only invoker (iam.tf).

resource "google_cloud_scheduler_job" "sweeper" {
  project     = var.project
  region      = var.region
  name        = "${var.name_prefix}-sweeper"
  description = "Ask GitHub to redeliver the App's failed deliveries the ledger lacks."
  schedule    = var.sweeper_schedule
  time_zone   = var.sweeper_time_zone
  # Above the sweeper's 300 s timeout, so a slow sweep is not cut off by the scheduler.
  attempt_deadline = "320s"

  # A sweep is idempotent and the next run comes soon: no retry of a failed run.
  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = google_cloudfunctions2_function.fn["sweeper"].url

    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloudfunctions2_function.fn["sweeper"].url
    }
  }

  depends_on = [google_cloud_run_service_iam_member.sweeper_invoker]
}

# The poll ingress (docs/polling.md): GitHub's listings of poll_repositories, read once a
# minute (Cloud Scheduler's finest schedule), queued as webhook deliveries. Paused while
# poll_repositories is empty: the webhook alone serves.
resource "google_cloud_scheduler_job" "poller" {
  project     = var.project
  region      = var.region
  name        = "${var.name_prefix}-poller"
  description = "Poll GitHub's issue, comment, review and issue-event listings of poll_repositories."
  schedule    = var.poller_schedule
  time_zone   = var.sweeper_time_zone
  paused      = length(var.poll_repositories) == 0
  # Above the poller's 120 s timeout.
  attempt_deadline = "140s"

  # The cursors stay where the failed run left them: the next run reads that stretch again.
  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = google_cloudfunctions2_function.fn["poller"].url

    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloudfunctions2_function.fn["poller"].url
    }
  }

  depends_on = [google_cloud_run_service_iam_member.poller_invoker]
}
