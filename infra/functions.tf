# The six Cloud Functions (2nd gen), built from one source archive (functions/build.sh).

resource "google_storage_bucket" "source" {
  #checkov:skip=CKV_GCP_62:holds only the build archive, uploaded by terraform and read by Cloud Build; Cloud Audit Logs record access, a second access-log bucket adds nothing
  project                     = var.project
  name                        = "${var.project}-${var.name_prefix}-source"
  location                    = var.region
  labels                      = var.labels
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"

  versioning {
    enabled = true
  }

  # Archives are named by content hash; old ones are only needed to roll back a build.
  lifecycle_rule {
    condition {
      age = 90
    }
    action {
      type = "Delete"
    }
  }

  depends_on = [google_project_service.enabled]
}

resource "google_storage_bucket_object" "source" {
  # A new name per archive content, so a new build redeploys the functions.
  name   = "functions-${filemd5(var.source_archive)}.zip"
  bucket = google_storage_bucket.source.name
  source = var.source_archive
}

resource "google_cloudfunctions2_function" "fn" {
  #checkov:skip=CKV_GCP_124:the webhook and the runner API must be reachable from GitHub and from runner machines; the worker, the sweeper, the poller and the status page are closed by Cloud Run IAM instead (only their OIDC identities, or the operators, may invoke: iam.tf)
  for_each = local.functions

  project     = var.project
  location    = var.region
  name        = "${var.name_prefix}-${each.key}"
  description = each.value.description
  labels      = var.labels

  build_config {
    runtime         = var.python_runtime
    entry_point     = each.value.entry_point
    service_account = var.build_service_account

    source {
      storage_source {
        bucket = google_storage_bucket.source.name
        object = google_storage_bucket_object.source.name
      }
    }
  }

  service_config {
    service_account_email            = google_service_account.fn[each.key].email
    available_memory                 = each.value.memory
    available_cpu                    = each.value.cpu
    timeout_seconds                  = each.value.timeout_seconds
    min_instance_count               = 0
    max_instance_count               = each.value.max_instances
    max_instance_request_concurrency = each.value.concurrency
    all_traffic_on_latest_revision   = true
    # Reachable from the internet; who may invoke is IAM's job (iam.tf): the worker and the
    # sweeper only by their OIDC identities, the status page only by operator_members.
    ingress_settings = "ALLOW_ALL"

    # functions-framework serves the entry points in its ASGI mode (uvicorn): a request waits
    # on the event loop, and blocking store and GitHub calls run on looprelay's own bounded
    # thread pool (shared/looprelay/app/asgi.py), so no thread count is set here.
    environment_variables = merge(
      local.config_env,
      var.extra_config_env,
    )

    # Secret values are resolved when an instance starts ("latest"): a new value reaches new
    # instances; `terraform apply` after a rotation rolls a new revision.
    dynamic "secret_environment_variables" {
      for_each = toset(each.value.secret_env)
      content {
        key        = secret_environment_variables.value
        project_id = var.project
        secret     = google_secret_manager_secret.env[secret_environment_variables.value].secret_id
        version    = "latest"
      }
    }
  }

  lifecycle {
    precondition {
      condition     = var.worker_dispatch_deadline_seconds < var.worker_timeout_seconds
      error_message = "worker_dispatch_deadline_seconds must be below worker_timeout_seconds: the queue must give up on an attempt before the worker does."
    }
  }

  # A function cannot start before its identity may read its secrets.
  depends_on = [google_secret_manager_secret_iam_member.access]
}
