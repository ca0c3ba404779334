# looprelay on Google Cloud: six Cloud Functions (2nd gen), a Cloud Tasks queue, Firestore,
# Secret Manager and two Cloud Scheduler jobs. docs/architecture.md has the picture.

locals {
  firestore_location = coalesce(var.firestore_location, var.region)

  # The worker's address, known before it exists: Cloud Tasks posts here and the worker checks
  # that its OIDC tokens carry it as the audience. (Its run.app URI is only known after deploy,
  # and the worker's own settings cannot refer to the worker.)
  worker_url = "https://${var.region}-${var.project}.cloudfunctions.net/${var.name_prefix}-worker"

  # One entry per @functions_framework.aio.http entry point in functions/main.py
  # (tests/infra/test_terraform.py keeps the two equal). secret_env lists the environment
  # variables each function gets from Secret Manager, and no others: the webhook verifies
  # signatures and never calls GitHub; the status page only reads Firestore; the others call
  # GitHub as the App.
  functions = {
    webhook = {
      entry_point     = "webhook"
      description     = "GitHub deliveries: verify the signature, enqueue, answer 202."
      memory          = var.function_resources.webhook.memory
      cpu             = var.function_resources.webhook.cpu
      timeout_seconds = 30
      concurrency     = var.request_concurrency.webhook
      max_instances   = var.max_instances.webhook
      secret_env      = var.webhook_secret_names
    }
    worker = {
      entry_point     = "worker"
      description     = "Cloud Tasks target: route one delivery and settle it in the ledger."
      memory          = var.function_resources.worker.memory
      cpu             = var.function_resources.worker.cpu
      timeout_seconds = var.worker_timeout_seconds
      concurrency     = var.request_concurrency.worker
      max_instances   = var.max_instances.worker
      secret_env      = [var.github_app_key_env]
    }
    runners = {
      entry_point = "runners"
      description = "Runner API (/runner/v1/...): registration, long polls, leases, results."
      memory      = var.function_resources.runners.memory
      cpu         = var.function_resources.runners.cpu
      # Long polls are held up to runner_poll_wait_seconds (runners.pollWaitSeconds), and
      # answered before the platform cuts the request off (tests/infra checks the margin).
      timeout_seconds = var.runner_timeout_seconds
      concurrency     = var.request_concurrency.runners
      max_instances   = var.max_instances.runners
      secret_env      = [var.github_app_key_env]
    }
    sweeper = {
      entry_point     = "sweeper"
      description     = "Cloud Scheduler target: redeliver failed GitHub deliveries the ledger lacks."
      memory          = var.function_resources.sweeper.memory
      cpu             = var.function_resources.sweeper.cpu
      timeout_seconds = 300
      concurrency     = 1
      max_instances   = var.max_instances.sweeper
      secret_env      = [var.github_app_key_env]
    }
    # The poll ingress (docs/polling.md): one round over poll_repositories per scheduled call.
    # One at a time on one instance: a repository's cursors have one writer.
    poller = {
      entry_point     = "poller"
      description     = "Cloud Scheduler target: poll GitHub's listings of poll_repositories, queue what is new."
      memory          = "512Mi"
      cpu             = "1"
      timeout_seconds = 120
      concurrency     = 1
      max_instances   = 1
      secret_env      = [var.github_app_key_env]
    }
    # The operators' status page, apart from the sweeper: the sweeper serves one request on one
    # instance, so a page view there waited out a sweep and could make a scheduled one be
    # skipped (issue 22). A few operators at a time: one instance's blocking pool serves them
    # (each view is a handful of Firestore reads), and two instances bound what a stuck
    # browser tab reloading every 10 s can cost.
    status = {
      entry_point     = "status"
      description     = "Operators' status page and its JSON (GET /status), behind IAM; reads only."
      memory          = "512Mi"
      cpu             = "1"
      timeout_seconds = 60
      concurrency     = 16
      max_instances   = 2
      secret_env      = []
    }
  }

  # The configuration every function loads (looprelay.config.model, LOOPRELAY__section__key = YAML
  # value). Values are JSON, which YAML reads back unchanged ("" stays a string).
  config_env = {
    LOOPRELAY__github__apiUrl                             = jsonencode(var.github_api_url)
    LOOPRELAY__github__appId                              = jsonencode(var.github_app_id)
    LOOPRELAY__github__privateKeyEnv                      = jsonencode(var.github_app_key_env)
    LOOPRELAY__github__webhookSecrets                     = jsonencode(var.webhook_secret_names)
    LOOPRELAY__github__poll__repositories                 = jsonencode(var.poll_repositories)
    LOOPRELAY__routing__authorizedUsers                   = jsonencode(var.authorized_users)
    LOOPRELAY__routing__botLogins                         = jsonencode(var.bot_logins)
    LOOPRELAY__runners__pollWaitSeconds                   = jsonencode(var.runner_poll_wait_seconds)
    LOOPRELAY__store__backend                             = jsonencode("firestore")
    LOOPRELAY__store__retentionDays                       = jsonencode(var.retention_days)
    LOOPRELAY__store__firestore__project                  = jsonencode(var.project)
    LOOPRELAY__store__firestore__database                 = jsonencode(var.firestore_database)
    LOOPRELAY__store__firestore__collectionPrefix         = jsonencode(var.collection_prefix)
    LOOPRELAY__queue__backend                             = jsonencode("cloudtasks")
    LOOPRELAY__queue__retry__maxAttempts                  = jsonencode(var.queue_max_attempts)
    LOOPRELAY__queue__retry__minBackoffSeconds            = jsonencode(var.queue_min_backoff_seconds)
    LOOPRELAY__queue__retry__maxBackoffSeconds            = jsonencode(var.queue_max_backoff_seconds)
    LOOPRELAY__queue__retry__maxDoublings                 = jsonencode(var.queue_max_doublings)
    LOOPRELAY__queue__cloudtasks__project                 = jsonencode(var.project)
    LOOPRELAY__queue__cloudtasks__location                = jsonencode(var.region)
    LOOPRELAY__queue__cloudtasks__queue                   = jsonencode(google_cloud_tasks_queue.deliveries.name)
    LOOPRELAY__queue__cloudtasks__workerUrl               = jsonencode(local.worker_url)
    LOOPRELAY__queue__cloudtasks__serviceAccountEmail     = jsonencode(google_service_account.tasks.email)
    LOOPRELAY__queue__cloudtasks__dispatchDeadlineSeconds = jsonencode(var.worker_dispatch_deadline_seconds)
    LOOPRELAY__worker__oidc__serviceAccountEmail          = jsonencode(google_service_account.tasks.email)
    LOOPRELAY__worker__oidc__audience                     = jsonencode(local.worker_url)
    # Cloud Run's IAM check (tasks SA only, iam.tf) verifies the token and strips its
    # signature before the request reaches the worker, which then checks the claims.
    LOOPRELAY__worker__oidc__platformVerifiesSignature = "true"
  }

  # The config an operator's `looprelay` CLI needs against this deployment (output
  # operator_config): runners token/list/revoke/rotate, deliveries (and replay), events.
  operator_config = {
    store = {
      backend       = "firestore"
      retentionDays = var.retention_days
      firestore = {
        project          = var.project
        database         = var.firestore_database
        collectionPrefix = var.collection_prefix
      }
    }
    queue = {
      backend = "cloudtasks"
      cloudtasks = {
        project                 = var.project
        location                = var.region
        queue                   = google_cloud_tasks_queue.deliveries.name
        workerUrl               = local.worker_url
        serviceAccountEmail     = google_service_account.tasks.email
        dispatchDeadlineSeconds = var.worker_dispatch_deadline_seconds
      }
    }
  }

  services = toset([
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    # Project IAM grants (iam.tf) read and write the project's policy through Resource Manager.
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "cloudtasks.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
  ])
}

resource "google_project_service" "enabled" {
  for_each = local.services

  project = var.project
  service = each.value
  # Other workloads in the project may use these APIs too.
  disable_on_destroy = false
}
