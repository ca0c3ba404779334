# Identities and least privilege. One service account per function, plus two that only sign
# OIDC tokens: "tasks" (Cloud Tasks -> worker) and "scheduler" (Cloud Scheduler -> sweeper,
# poller).
#
#   webhook  may enqueue on the queue, and act as "tasks" to put its OIDC token on each task
#   worker   Firestore (this database only); may enqueue its wakes, acting as "tasks"; the
#            App key
#   runners  Firestore (this database only); the App key
#   sweeper  Firestore (this database only); the App key
#   poller   Firestore (this database only); may enqueue, acting as "tasks"; the App key
#   status   Firestore read-only (this database only); no secret
#   tasks    the only invoker of the worker
#   scheduler the only invoker of the sweeper and the poller
#   operator_members the only invokers of the status page
# Each function reads only its own secrets (secrets.tf). No identity gets a project-wide role
# without a condition naming the database.

resource "google_service_account" "fn" {
  for_each = local.functions

  project      = var.project
  account_id   = "${var.name_prefix}-${each.key}"
  display_name = "looprelay ${each.key} function"
  depends_on   = [google_project_service.enabled]
}

resource "google_service_account" "tasks" {
  project      = var.project
  account_id   = "${var.name_prefix}-tasks"
  display_name = "looprelay Cloud Tasks OIDC identity (invokes the worker)"
  depends_on   = [google_project_service.enabled]
}

resource "google_service_account" "scheduler" {
  project      = var.project
  account_id   = "${var.name_prefix}-scheduler"
  display_name = "looprelay Cloud Scheduler OIDC identity (invokes the sweeper and the poller)"
  depends_on   = [google_project_service.enabled]
}

# --- webhook: enqueue only ------------------------------------------------------------------

resource "google_cloud_tasks_queue_iam_member" "webhook_enqueuer" {
  project  = var.project
  location = google_cloud_tasks_queue.deliveries.location
  name     = google_cloud_tasks_queue.deliveries.name
  role     = "roles/cloudtasks.enqueuer"
  member   = google_service_account.fn["webhook"].member
}

# A task with an oidc_token needs iam.serviceAccounts.actAs on the token's account; granted on
# that one account, not on the project.
resource "google_service_account_iam_member" "webhook_acts_as_tasks" {
  service_account_id = google_service_account.tasks.name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.fn["webhook"].member
}

# --- poller: enqueues as the webhook does ---------------------------------------------------

resource "google_cloud_tasks_queue_iam_member" "poller_enqueuer" {
  project  = var.project
  location = google_cloud_tasks_queue.deliveries.location
  name     = google_cloud_tasks_queue.deliveries.name
  role     = "roles/cloudtasks.enqueuer"
  member   = google_service_account.fn["poller"].member
}

resource "google_service_account_iam_member" "poller_acts_as_tasks" {
  service_account_id = google_service_account.tasks.name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.fn["poller"].member
}

# --- worker: enqueues the wakes of turns not ready yet (core/wake.py) -----------------------

resource "google_cloud_tasks_queue_iam_member" "worker_enqueuer" {
  project  = var.project
  location = google_cloud_tasks_queue.deliveries.location
  name     = google_cloud_tasks_queue.deliveries.name
  role     = "roles/cloudtasks.enqueuer"
  member   = google_service_account.fn["worker"].member
}

resource "google_service_account_iam_member" "worker_acts_as_tasks" {
  service_account_id = google_service_account.tasks.name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.fn["worker"].member
}

# --- worker, runners, sweeper, poller: Firestore --------------------------------------------

resource "google_project_iam_member" "firestore_user" {
  for_each = toset(["worker", "runners", "sweeper", "poller"])

  project = var.project
  role    = "roles/datastore.user"
  member  = google_service_account.fn[each.key].member

  # Firestore checks IAM per database; this grant reaches looprelay's database only.
  condition {
    title       = "looprelay-database-only"
    description = "Only the looprelay Firestore database."
    expression  = "resource.name == \"projects/${var.project}/databases/${google_firestore_database.main.name}\""
  }
}

# The status page reads the store and writes nothing (service/status.py): viewer, not user.
resource "google_project_iam_member" "status_firestore_viewer" {
  project = var.project
  role    = "roles/datastore.viewer"
  member  = google_service_account.fn["status"].member

  condition {
    title       = "looprelay-database-only"
    description = "Only the looprelay Firestore database."
    expression  = "resource.name == \"projects/${var.project}/databases/${google_firestore_database.main.name}\""
  }
}

# --- invokers -------------------------------------------------------------------------------

# The worker is invoked by the queue's OIDC identity and nobody else (SPEC §4). It verifies
# the token's audience and email itself too (worker.oidc).
resource "google_cloud_run_service_iam_member" "worker_invoker" {
  project  = var.project
  location = google_cloudfunctions2_function.fn["worker"].location
  service  = google_cloudfunctions2_function.fn["worker"].name
  role     = "roles/run.invoker"
  member   = google_service_account.tasks.member
}

resource "google_cloud_run_service_iam_member" "sweeper_invoker" {
  project  = var.project
  location = google_cloudfunctions2_function.fn["sweeper"].location
  service  = google_cloudfunctions2_function.fn["sweeper"].name
  role     = "roles/run.invoker"
  member   = google_service_account.scheduler.member
}

resource "google_cloud_run_service_iam_member" "poller_invoker" {
  project  = var.project
  location = google_cloudfunctions2_function.fn["poller"].location
  service  = google_cloudfunctions2_function.fn["poller"].name
  role     = "roles/run.invoker"
  member   = google_service_account.scheduler.member
}

# Operators read the status page (GET /status) on its own function, closed by IAM to them
# alone (docs/operations.md, "The status page"). Never public: the page names runners, repositories
# and sessions.
resource "google_cloud_run_service_iam_member" "operator_status_reader" {
  for_each = toset(var.operator_members)

  project  = var.project
  location = google_cloudfunctions2_function.fn["status"].location
  service  = google_cloudfunctions2_function.fn["status"].name
  role     = "roles/run.invoker"
  member   = each.value
}

# Public on purpose: GitHub cannot present a Google identity, so the webhook authenticates each
# delivery at the application layer (HMAC-SHA256 X-Hub-Signature-256 with the webhook secrets)
# and refuses anything unsigned before reading it further. Where domain restricted sharing
# refuses allUsers, public_invoker_binding = false leaves both bindings out and the operator
# turns off the two services' invoker IAM check instead (docs/deploy.md).
resource "google_cloud_run_service_iam_member" "webhook_public" {
  #checkov:skip=CKV_GCP_102:GitHub cannot send a Google ID token; every delivery is authenticated by its HMAC-SHA256 signature in the function
  count = var.public_invoker_binding ? 1 : 0

  project  = var.project
  location = google_cloudfunctions2_function.fn["webhook"].location
  service  = google_cloudfunctions2_function.fn["webhook"].name
  role     = "roles/run.invoker"
  member   = "allUsers"
}

# Public on purpose: runner agents run on operators' machines without Google identities; the
# runner API authenticates every call with a single-use registration token (register) or the
# runner's id and secret (everything else), stored only as hashes.
resource "google_cloud_run_service_iam_member" "runners_public" {
  #checkov:skip=CKV_GCP_102:runner agents have no Google identity; the runner API authenticates each call with the runner's secret or a registration token
  count = var.public_invoker_binding ? 1 : 0

  project  = var.project
  location = google_cloudfunctions2_function.fn["runners"].location
  service  = google_cloudfunctions2_function.fn["runners"].name
  role     = "roles/run.invoker"
  member   = "allUsers"
}

# --- operators (the looprelay CLI against the cloud) ----------------------------------------

resource "google_project_iam_member" "operator_firestore" {
  for_each = toset(var.operator_members)

  project = var.project
  role    = "roles/datastore.user"
  member  = each.value

  condition {
    title       = "looprelay-database-only"
    description = "Only the looprelay Firestore database."
    expression  = "resource.name == \"projects/${var.project}/databases/${google_firestore_database.main.name}\""
  }
}

resource "google_cloud_tasks_queue_iam_member" "operator_enqueuer" {
  for_each = toset(var.operator_members)

  project  = var.project
  location = google_cloud_tasks_queue.deliveries.location
  name     = google_cloud_tasks_queue.deliveries.name
  role     = "roles/cloudtasks.enqueuer"
  member   = each.value
}

resource "google_service_account_iam_member" "operator_acts_as_tasks" {
  for_each = toset(var.operator_members)

  service_account_id = google_service_account.tasks.name
  role               = "roles/iam.serviceAccountUser"
  member             = each.value
}
