output "webhook_url" {
  description = "Set as the GitHub App's webhook URL (content type application/json)."
  value       = google_cloudfunctions2_function.fn["webhook"].service_config[0].uri
}

output "runner_api_url" {
  description = "Pass to `looprelay runner register --server`."
  value       = google_cloudfunctions2_function.fn["runners"].service_config[0].uri
}

output "sweeper_url" {
  description = "The sweeper function, Cloud Scheduler's target (behind IAM)."
  value       = google_cloudfunctions2_function.fn["sweeper"].service_config[0].uri
}

output "status_url" {
  description = "The status page's function: `<url>/status` for operator_members (behind IAM: docs/operations.md)."
  value       = google_cloudfunctions2_function.fn["status"].service_config[0].uri
}

output "worker_url" {
  description = "Where Cloud Tasks posts, and the audience of its OIDC tokens."
  value       = local.worker_url
}

output "queue" {
  description = "The Cloud Tasks queue's full name."
  value       = google_cloud_tasks_queue.deliveries.id
}

output "secret_ids" {
  description = "Secret Manager secret per environment variable; add each value with `gcloud secrets versions add`."
  value       = { for env, secret in google_secret_manager_secret.env : env => secret.secret_id }
}

output "operator_config" {
  description = "YAML config for the looprelay CLI against this deployment (`terraform output -raw operator_config > looprelay-cloud.yaml`)."
  value       = yamlencode(local.operator_config)
}
