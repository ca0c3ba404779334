# The Cloud Tasks queue between the webhook and the worker. Every value is explicit; none is
# left to Cloud Tasks' defaults (100 attempts, 0.1 s to 3600 s backoff, 500 dispatches/s).

resource "google_cloud_tasks_queue" "deliveries" {
  project  = var.project
  name     = "${var.name_prefix}-deliveries"
  location = var.region

  # The worker answers 503 for what a retry can fix and 2xx for everything settled (including
  # dead letters, recorded in the ledger), so only transient failures are retried here.
  retry_config {
    max_attempts       = var.queue_max_attempts
    min_backoff        = "${var.queue_min_backoff_seconds}s"
    max_backoff        = "${var.queue_max_backoff_seconds}s"
    max_doublings      = var.queue_max_doublings
    max_retry_duration = "${var.queue_max_retry_duration_seconds}s"
  }

  rate_limits {
    max_dispatches_per_second = var.queue_max_dispatches_per_second
    max_concurrent_dispatches = var.queue_max_concurrent_dispatches
  }

  # Attempts in Cloud Logging, for reading a delivery's retries next to its delivery_id: all of
  # them by default; a share at scale, where the log volume costs (docs/scaling.md).
  stackdriver_logging_config {
    sampling_ratio = var.queue_log_sampling_ratio
  }

  depends_on = [google_project_service.enabled]
}
