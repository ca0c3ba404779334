# Every value a deployment chooses. Only project, github_app_id and source_archive have no
# default; docs/deploy.md walks through each one.

variable "project" {
  type        = string
  description = "Google Cloud project id to deploy into."
}

variable "region" {
  type        = string
  default     = "us-central1"
  description = "Region of the functions, the queue, the scheduler job and the source bucket."
}

variable "name_prefix" {
  type        = string
  default     = "looprelay"
  description = "Prefix of every resource name (functions, service accounts, queue, secrets)."

  validation {
    # Service account ids are 6-30 characters; the longest suffix added is "-scheduler".
    condition     = can(regex("^[a-z][a-z0-9-]{1,18}[a-z0-9]$", var.name_prefix))
    error_message = "name_prefix must be 3-20 characters of a-z, 0-9 and -, starting with a letter."
  }
}

variable "labels" {
  type        = map(string)
  default     = {}
  description = "Labels put on the functions, the bucket and the secrets."
}

variable "source_archive" {
  type        = string
  description = "Path of the functions source zip built by functions/build.sh (uploaded to the source bucket)."
}

variable "python_runtime" {
  type        = string
  default     = "python312"
  description = "Cloud Functions runtime of the five functions."
}

variable "build_service_account" {
  type        = string
  default     = null
  description = "Full resource name of the service account Cloud Build uses to build the functions (projects/P/serviceAccounts/EMAIL); null means the project's default."
}

# --- GitHub ---------------------------------------------------------------------------------

variable "github_app_id" {
  type        = number
  description = "The GitHub App's numeric id (App settings, General, \"App ID\")."
}

variable "github_api_url" {
  type        = string
  default     = "https://api.github.com"
  description = "GitHub REST API base URL (GitHub Enterprise Server: https://HOST/api/v3)."
}

variable "github_app_key_env" {
  type        = string
  default     = "GITHUB_APP_PRIVATE_KEY"
  description = "Environment variable the App's private key is wired into; its Secret Manager secret is {name_prefix}-{lower-cased name with _ as -}."

  validation {
    condition     = can(regex("^[A-Z][A-Z0-9_]*$", var.github_app_key_env))
    error_message = "github_app_key_env must be an upper-case environment-variable name."
  }
}

variable "webhook_secret_names" {
  type        = list(string)
  default     = ["GITHUB_WEBHOOK_SECRET"]
  description = "Environment variables holding webhook secrets, primary first (github.webhookSecrets). Each gets a Secret Manager secret {name_prefix}-{lower-cased name with _ as -}; list two during a rotation (docs/operations.md)."

  validation {
    condition = (
      length(var.webhook_secret_names) > 0
      && length(distinct(var.webhook_secret_names)) == length(var.webhook_secret_names)
      && alltrue([for name in var.webhook_secret_names : can(regex("^[A-Z][A-Z0-9_]*$", name))])
    )
    error_message = "webhook_secret_names must list at least one distinct upper-case environment-variable name."
  }
}

# --- Routing --------------------------------------------------------------------------------

variable "authorized_users" {
  type        = list(string)
  default     = []
  description = "GitHub logins or numeric user ids whose events and commands count (routing.authorizedUsers). Empty means nobody."
}

variable "bot_logins" {
  type        = list(string)
  default     = []
  description = "Logins of this App's own bot, e.g. [\"my-looprelay[bot]\"] (routing.botLogins); their events are dropped."
}

variable "extra_config_env" {
  type        = map(string)
  default     = {}
  description = "More config overrides for every function, as LOOPRELAY__section__key = YAML value (docs/config.md), e.g. { LOOPRELAY__routing__interaction__mode = \"cli\" }."

  validation {
    condition     = alltrue([for key in keys(var.extra_config_env) : can(regex("^LOOPRELAY__[A-Za-z]+(__[A-Za-z]+)*$", key))])
    error_message = "extra_config_env keys must look like LOOPRELAY__section__key."
  }
}

# --- Firestore ------------------------------------------------------------------------------

variable "firestore_database" {
  type        = string
  default     = "(default)"
  description = "Firestore database id (created here, native mode)."
}

variable "firestore_location" {
  type        = string
  default     = null
  description = "Firestore location (a region such as us-central1, or a multi-region such as nam5); null means var.region."
}

variable "collection_prefix" {
  type        = string
  default     = ""
  description = "Prefix of every collection name (store.firestore.collectionPrefix), to share a database."
}

variable "retention_days" {
  type        = number
  default     = 7
  description = "Days ledger records and events are kept before Firestore's TTL deletes them (store.retentionDays)."

  validation {
    # GitHub lets an App redeliver deliveries of the past 3 days; the ledger must outlive that.
    condition     = var.retention_days >= 3
    error_message = "retention_days must be at least 3, GitHub's redelivery window."
  }
}

# --- Cloud Tasks ----------------------------------------------------------------------------

variable "queue_max_attempts" {
  type        = number
  default     = 25
  description = "Attempts of one task before Cloud Tasks gives up (also queue.retry.maxAttempts)."
}

variable "queue_min_backoff_seconds" {
  type        = number
  default     = 1
  description = "Wait before the first retry of a task."
}

variable "queue_max_backoff_seconds" {
  type        = number
  default     = 300
  description = "Longest wait between two attempts of a task."
}

variable "queue_max_doublings" {
  type        = number
  default     = 16
  description = "Times the wait doubles before it grows linearly."
}

variable "queue_max_retry_duration_seconds" {
  type        = number
  default     = 86400
  description = "Retrying stops only once both this age and queue_max_attempts are reached."

  validation {
    # Past GitHub's 3-day window neither a retry nor the sweeper can still help.
    condition     = var.queue_max_retry_duration_seconds > 0 && var.queue_max_retry_duration_seconds <= 259200
    error_message = "queue_max_retry_duration_seconds must be between 1 and 259200 (3 days)."
  }
}

variable "queue_max_dispatches_per_second" {
  type        = number
  default     = 200
  description = "Tasks the queue starts per second (Cloud Tasks allows at most 500). Twice 100 deliveries a second, so retries and GitHub's bursts drain."

  validation {
    condition     = var.queue_max_dispatches_per_second > 0 && var.queue_max_dispatches_per_second <= 500
    error_message = "queue_max_dispatches_per_second must be in (0, 500]."
  }
}

variable "queue_max_concurrent_dispatches" {
  type        = number
  default     = 500
  description = "Tasks in flight at once (Cloud Tasks allows at most 5,000): the rate times the worker's time per task, 100/s x up to 5 s. Keep it at most max_instances.worker x request_concurrency.worker, or the excess waits in Cloud Run and fails with 429."

  validation {
    condition     = var.queue_max_concurrent_dispatches >= 1 && var.queue_max_concurrent_dispatches <= 5000
    error_message = "queue_max_concurrent_dispatches must be in [1, 5000]."
  }
}

variable "worker_dispatch_deadline_seconds" {
  type        = number
  default     = 60
  description = "How long a task waits for the worker (queue.cloudtasks.dispatchDeadlineSeconds); below worker_timeout_seconds."

  validation {
    condition     = var.worker_dispatch_deadline_seconds >= 15 && var.worker_dispatch_deadline_seconds <= 1800
    error_message = "worker_dispatch_deadline_seconds must be in [15, 1800] (Cloud Tasks' bounds)."
  }
}

# --- Function sizing ------------------------------------------------------------------------
# Defaults are sized for 100 deliveries a second and 1,000 runners (docs/scaling.md shows the
# arithmetic). A limit is a ceiling, not a reservation: with no minimum instances nothing is
# billed while idle, so a small deployment pays nothing for the headroom.

variable "runner_poll_wait_seconds" {
  type        = number
  default     = 300
  description = "Longest a runner's long poll is held (runners.pollWaitSeconds): the longer, the fewer requests (and request-log lines) an idle runner costs."
}

variable "runner_timeout_seconds" {
  type        = number
  default     = 360
  description = "Request timeout of the runner API; at least 30 s longer than runner_poll_wait_seconds, so a held poll is answered before the platform cuts it off."
}

variable "worker_timeout_seconds" {
  type        = number
  default     = 120
  description = "Request timeout of the worker; longer than worker_dispatch_deadline_seconds so the queue gives up first."
}

variable "max_instances" {
  type = object({
    webhook = number
    worker  = number
    runners = number
    sweeper = number
  })
  default = {
    webhook = 20
    worker  = 40
    runners = 10
    sweeper = 1
  }
  description = "Most instances of each function. worker x request_concurrency.worker should reach queue_max_concurrent_dispatches, and runners x request_concurrency.runners the runner agents' open polls (one per unit of each agent's --capacity, 2 by default) plus heartbeats. The sweeper must stay at 1: two sweeps at once would redeliver the same failures twice."

  validation {
    condition = (
      var.max_instances.sweeper == 1
      && alltrue([for fn in ["webhook", "worker", "runners"] : var.max_instances[fn] >= 1 && var.max_instances[fn] <= 1000])
    )
    error_message = "max_instances.sweeper must be 1, and the others between 1 and 1000."
  }
}

variable "request_concurrency" {
  type = object({
    webhook = number
    worker  = number
    runners = number
  })
  default = {
    webhook = 32
    worker  = 16
    runners = 1000
  }
  description = "Requests one instance serves at once; the sweeper serves one. Each function is an ASGI application whose waits hold no thread, but its blocking store and GitHub calls share a pool of 32 threads, so the webhook and the worker gain nothing above 32. Runner long polls mostly wait: one instance holds 1,000 (Cloud Run's most), and Cloud Run adds an instance at 60% of it (docs/scaling.md)."

  validation {
    condition = alltrue([
      for fn in ["webhook", "worker", "runners"] : var.request_concurrency[fn] >= 1 && var.request_concurrency[fn] <= 1000
    ])
    error_message = "request_concurrency values must be between 1 and 1000 (Cloud Run's per-instance maximum)."
  }
}

variable "function_resources" {
  type = object({
    webhook = object({ memory = string, cpu = string })
    worker  = object({ memory = string, cpu = string })
    runners = object({ memory = string, cpu = string })
    sweeper = object({ memory = string, cpu = string })
  })
  default = {
    webhook = { memory = "1Gi", cpu = "1" }
    worker  = { memory = "1Gi", cpu = "1" }
    runners = { memory = "1Gi", cpu = "1" }
    sweeper = { memory = "512Mi", cpu = "1" }
  }
  description = "Memory and vCPU of one instance of each function. A concurrency above 1 needs at least 1 vCPU. The webhook holds each request body (up to webhook.maxBodyBytes) while it checks it, so its memory bounds request_concurrency.webhook times that size."
}

variable "queue_log_sampling_ratio" {
  type        = number
  default     = 1.0
  description = "Share of Cloud Tasks attempts written to Cloud Logging (0 to 1). Every attempt is logged by default; at 100 deliveries a second that is about 240 GiB a month of Cloud Logging (docs/scaling.md), so lower it there."

  validation {
    condition     = var.queue_log_sampling_ratio >= 0 && var.queue_log_sampling_ratio <= 1
    error_message = "queue_log_sampling_ratio must be between 0 and 1."
  }
}

# --- Public access ---------------------------------------------------------------------------

variable "public_invoker_binding" {
  type        = bool
  default     = true
  description = "Grant roles/run.invoker to allUsers on the webhook and the runner API. Set false where the organisation policy iam.allowedPolicyMemberDomains (domain restricted sharing) refuses allUsers, and disable those two services' invoker IAM check instead (docs/deploy.md)."
}

# --- Sweeper --------------------------------------------------------------------------------

variable "sweeper_schedule" {
  type        = string
  default     = "*/5 * * * *"
  description = "Cron schedule of the redelivery sweep. Each run pages GitHub's delivery list (100 a page) back to the previous run: at 100 deliveries a second a 5-minute gap is 300 pages (docs/scaling.md)."
}

variable "sweeper_time_zone" {
  type        = string
  default     = "Etc/UTC"
  description = "Time zone of sweeper_schedule and poller_schedule."
}

variable "poll_repositories" {
  type        = list(string)
  default     = []
  description = "Repositories (owner/repo) the poller reads GitHub's listings of, instead of or beside the webhook (github.poll.repositories, docs/polling.md). Empty: the poller's schedule is paused."

  validation {
    condition     = alltrue([for r in var.poll_repositories : can(regex("^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$", r))])
    error_message = "poll_repositories entries must be owner/repo."
  }
}

variable "poller_schedule" {
  type        = string
  default     = "* * * * *"
  description = "Cron schedule of the poller: each run reads every listing of every repository in poll_repositories (a 304 when nothing changed costs no rate limit)."
}

# --- Operators ------------------------------------------------------------------------------

variable "operator_members" {
  type        = list(string)
  default     = []
  description = "IAM members (user:, group:, serviceAccount:) who run the looprelay CLI against the cloud: Firestore access, enqueue + act-as for `looprelay deliveries replay`, and the status function's invoker role for the status page (GET /status)."
}
