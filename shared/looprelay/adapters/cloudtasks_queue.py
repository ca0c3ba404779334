"""The Cloud Tasks adapter of the ``Queue`` port: one named HTTP task per ``Task``.

The task name is the deduplication key: Cloud Tasks refuses a name it has held within about an
hour (ALREADY_EXISTS). google-cloud-tasks is imported only when a queue is built, off the
webhook's cold path.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from looprelay.errors import ConfigError, Permanent, Transient
from looprelay.ports import MAX_TASK_BYTES, Task

if TYPE_CHECKING:
    from google.api_core.retry import Retry
    from google.cloud.tasks_v2 import CloudTasksClient

    from looprelay.config import CloudTasksConfig

ATTEMPT_TIMEOUT_SECONDS = 2.0
"""Socket timeout of one CreateTask attempt (the client's own default is 20 s)."""
RETRY_WINDOW_SECONDS = 3.5
"""A retry starts only within this many seconds of the first attempt (GitHub waits 10 s)."""
_FIRST_BACKOFF_SECONDS = 0.2
_MAX_BACKOFF_SECONDS = 1.0
_TASK_NAME = re.compile(r"^[A-Za-z0-9_-]{1,500}$")  # CreateTaskRequest: the task id's alphabet
_TASK_HEADERS = {"Content-Type": "application/json"}
_FIXES = {  # what an operator does about a refusal, by HTTP status
    400: "the task is invalid; check queue.cloudtasks.workerUrl and .serviceAccountEmail",
    401: "the credentials were refused; check the identity the function runs as",
    403: "permission denied; grant the function's identity roles/cloudtasks.enqueuer on the "
    "queue and roles/iam.serviceAccountUser on the OIDC service account",
    404: "no such queue; create it (gcloud tasks queues create) or fix "
    "queue.cloudtasks.project, .location and .queue",
}


class CloudTasksQueue:
    """Queues each ``Task`` as an OIDC-authenticated POST to the worker through Cloud Tasks."""

    def __init__(
        self,
        *,
        project: str,
        location: str,
        queue: str,
        worker_url: str,
        service_account_email: str,
        audience: str | None = None,
        dispatch_deadline_seconds: int = 60,
        client: CloudTasksClient | None = None,
        retry_window_seconds: float = RETRY_WINDOW_SECONDS,
    ) -> None:
        """Expects the queue's coordinates and the worker's URL; ``audience`` defaults to it.

        Without ``client`` one is built with the environment's default credentials.
        ``retry_window_seconds`` bounds retries (0 turns them off). Raises ``ConfigError`` when
        google-cloud-tasks is missing or there are no default credentials.
        """
        self._client = client if client is not None else _client_for(api_endpoint=None)
        self._queue_path = f"projects/{project}/locations/{location}/queues/{queue}"
        self._worker_url = worker_url
        self._service_account_email = service_account_email
        self._audience = audience or worker_url
        self._dispatch_deadline_seconds = dispatch_deadline_seconds
        self._retry = _retry_policy(retry_window_seconds)

    @classmethod
    def from_config(
        cls, cfg: CloudTasksConfig, *, retry_window_seconds: float = RETRY_WINDOW_SECONDS
    ) -> CloudTasksQueue:
        """Build the queue from ``queue.cloudtasks``.

        With ``api_endpoint`` set (tests), the client speaks REST to that URL without
        credentials; otherwise it uses the environment's default credentials. Raises
        ``ConfigError`` when google-cloud-tasks is missing or there are no credentials.
        """
        return cls(
            project=cfg.project,
            location=cfg.location,
            queue=cfg.queue,
            worker_url=cfg.worker_url,
            service_account_email=cfg.service_account_email,
            dispatch_deadline_seconds=cfg.dispatch_deadline_seconds,
            client=_client_for(api_endpoint=cfg.api_endpoint),
            retry_window_seconds=retry_window_seconds,
        )

    def enqueue(self, task: Task) -> bool:
        """Create ``task`` as an HTTP task; return False when its name is already taken.

        Timeout budget: each attempt waits at most 2 s to connect and 2 s for the answer; a 429,
        5xx or failed connection is retried with jittered backoff (0.2 s doubling to 1 s) while
        a retry can start within 3.5 s. So a dead service fails in about 3.5 s, a silent one in
        2 s, and no call outlasts 7.5 s (GitHub waits 10 s). Raises ``Permanent`` unsent when
        the body is over ``MAX_TASK_BYTES`` or the name is no task id, and when Cloud Tasks
        refuses (400, 401, 403, 404); ``Transient`` on 429, 5xx or network once retries end.
        """
        _check(task)
        from google.api_core import exceptions as api
        from google.auth.exceptions import GoogleAuthError

        request = {"parent": self._queue_path, "task": self._http_task(task)}
        try:
            self._client.create_task(
                request=request, retry=self._retry, timeout=ATTEMPT_TIMEOUT_SECONDS
            )
        except api.Aborted as exc:  # a Conflict subclass, but a retryable one
            raise Transient(f"Cloud Tasks aborted the task in {self._queue_path}") from exc
        except api.Conflict:  # REST says 409 Conflict where gRPC says AlreadyExists
            return False
        except (api.GoogleAPIError, GoogleAuthError, OSError) as exc:  # requests: OSError
            raise _translate(exc, self._queue_path) from exc
        return True

    def _http_task(self, task: Task) -> dict[str, object]:
        return {
            "name": f"{self._queue_path}/tasks/{task.name}",
            "http_request": {
                "url": self._worker_url,
                "http_method": "POST",
                "headers": _TASK_HEADERS,
                "body": task.body,
                "oidc_token": {
                    "service_account_email": self._service_account_email,
                    "audience": self._audience,
                },
            },
            "dispatch_deadline": {"seconds": self._dispatch_deadline_seconds},
        }


def _check(task: Task) -> None:
    if len(task.body) > MAX_TASK_BYTES:
        raise Permanent(
            f"task {task.name[:80]!r} is {len(task.body)} bytes; Cloud Tasks holds at most "
            f"{MAX_TASK_BYTES} bytes per task, so shrink the payload"
        )
    if not _TASK_NAME.match(task.name):
        raise Permanent(
            f"task name {task.name[:80]!r} is not 1-500 of A-Z a-z 0-9 _ -; "
            "derive it with core.tasknames.delivery_task_name"
        )


def _translate(exc: Exception, queue_path: str) -> Transient | Permanent:
    """Classify a failure of CreateTask once, by class and status code (STYLE: errors)."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    where = f"Cloud Tasks queue {queue_path}"
    transient = (OSError, auth.TransportError, api.RetryError, api.TooManyRequests)
    if isinstance(exc, (api.ServerError, *transient)):
        return Transient(f"{where} is unavailable now ({exc}); try again later")
    code = exc.code if isinstance(exc, api.GoogleAPICallError) else 401  # google.auth: 401
    return Permanent(f"{where}: {_FIXES.get(code or 0, 'see the error')} ({exc})")


def _retry_policy(window_seconds: float) -> Retry:
    """Retry 429, 5xx and connection failures; a name already taken comes back as 409."""
    from google.api_core import exceptions as api
    from google.api_core.retry import Retry, if_exception_type
    from requests.exceptions import ConnectionError as Unreachable

    # Not a read timeout: that attempt may yet succeed, and it has spent the budget anyway.
    return Retry(
        predicate=if_exception_type(api.TooManyRequests, api.ServerError, Unreachable),
        initial=_FIRST_BACKOFF_SECONDS,
        maximum=_MAX_BACKOFF_SECONDS,
        multiplier=2.0,
        timeout=window_seconds,
    )


def _client_for(*, api_endpoint: str | None) -> CloudTasksClient:
    """A REST client without credentials for ``api_endpoint`` (tests), else the default one."""
    try:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import tasks_v2
    except ImportError as exc:
        raise ConfigError("google-cloud-tasks is missing: pip install google-cloud-tasks") from exc
    if api_endpoint:
        return tasks_v2.CloudTasksClient(
            transport="rest",
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options=ClientOptions(api_endpoint=api_endpoint),
        )
    try:
        return tasks_v2.CloudTasksClient()
    except DefaultCredentialsError as exc:
        raise ConfigError(
            "Cloud Tasks needs Google credentials: run as a service account in the cloud, or "
            "`gcloud auth application-default login` / GOOGLE_APPLICATION_CREDENTIALS locally"
        ) from exc
