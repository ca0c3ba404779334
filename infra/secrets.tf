# Secret Manager: one secret per environment variable a function reads a secret from. Terraform
# creates the secrets but never their values (so no value is in a file or in the state): add
# each value with `gcloud secrets versions add` (docs/deploy.md) before the functions deploy.

locals {
  secret_env = toset(concat(var.webhook_secret_names, [var.github_app_key_env]))

  # Which function may read which secret: exactly the ones wired into it.
  secret_grants = merge([
    for fn, settings in local.functions : {
      for env in settings.secret_env : "${fn}/${env}" => { function = fn, env = env }
    }
  ]...)
}

resource "google_secret_manager_secret" "env" {
  for_each = local.secret_env

  project   = var.project
  secret_id = "${var.name_prefix}-${lower(replace(each.value, "_", "-"))}"
  labels    = var.labels

  replication {
    auto {}
  }

  depends_on = [google_project_service.enabled]
}

resource "google_secret_manager_secret_iam_member" "access" {
  for_each = local.secret_grants

  project   = var.project
  secret_id = google_secret_manager_secret.env[each.value.env].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.fn[each.value.function].member
}
