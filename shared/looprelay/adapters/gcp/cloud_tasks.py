"""The Cloud Tasks adapter of the ``Queue`` port: one named HTTP task per ``Task``.

The task name is the deduplication key: Cloud Tasks refuses a name it has held within about an
hour (409 ALREADY_EXISTS). CreateTask is one REST call, built here and sent through google-auth's
``AuthorizedSession``; google-cloud-tasks would load gRPC and protobuf on the webhook's cold
start for the same call (docs/decisions/0003-cloud-tasks-over-rest.md). A test sends each task
through Google's client too and keeps the two requests equal.
"""

from __future__ import annotations

import base64
import json
import random
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from looprelay.errors import ConfigError, Permanent, Transient
from looprelay.ports import MAX_TASK_BYTES, Task

if TYPE_CHECKING:
    from google.auth.transport.requests import AuthorizedSession
    from requests import Response

    from looprelay.config.model import CloudTasksConfig

_DEFAULT_HOST = "cloudtasks.googleapis.com"
DEFAULT_ENDPOINT = f"https://{_DEFAULT_HOST}"
ATTEMPT_TIMEOUT_SECONDS = 2.0
"""Socket timeout of one CreateTask attempt (Google's client defaults to 20 s)."""
RETRY_WINDOW_SECONDS = 3.5
"""A retry starts only within this many seconds of the first attempt (GitHub waits 10 s)."""
_FIRST_BACKOFF_SECONDS = 0.2
_MAX_BACKOFF_SECONDS = 1.0
_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)  # the client's AUTH_SCOPES
_TASK_NAME = re.compile(r"^[A-Za-z0-9_-]{1,500}$")  # CreateTaskRequest: the task id's alphabet
_TASK_HEADERS = {"Content-Type": "application/json"}
# As google-cloud-tasks' REST transport asks: enums as numbers, so HttpMethod.POST is 1.
_QUERY = {"$alt": "json;enum-encoding=int"}
_HTTP_METHOD_POST = 1
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
        api_endpoint: str | None = None,
        retry_window_seconds: float = RETRY_WINDOW_SECONDS,
    ) -> None:
        """Expects the queue's coordinates and the worker's URL; ``audience`` defaults to it.

        With ``api_endpoint`` (tests) requests go there without credentials; otherwise to
        Cloud Tasks with the environment's default credentials. ``retry_window_seconds`` bounds
        retries (0 turns them off). Raises ``ConfigError`` when there are no default credentials.
        """
        self._session = _session_for(api_endpoint)
        self._queue_path = f"projects/{project}/locations/{location}/queues/{queue}"
        self._url = f"{_base_url(api_endpoint)}/v2/{self._queue_path}/tasks"
        self._headers = _TASK_HEADERS | {
            "x-goog-request-params": urlencode({"parent": self._queue_path}, safe="/")
        }
        self._worker_url = worker_url
        self._service_account_email = service_account_email
        self._audience = audience or worker_url
        self._dispatch_deadline_seconds = dispatch_deadline_seconds
        self._retry_window_seconds = retry_window_seconds

    @classmethod
    def from_config(
        cls, cfg: CloudTasksConfig, *, retry_window_seconds: float = RETRY_WINDOW_SECONDS
    ) -> CloudTasksQueue:
        """Build the queue from ``queue.cloudtasks``; raises ``ConfigError`` as ``__init__``."""
        return cls(
            project=cfg.project,
            location=cfg.location,
            queue=cfg.queue,
            worker_url=cfg.worker_url,
            service_account_email=cfg.service_account_email,
            dispatch_deadline_seconds=cfg.dispatch_deadline_seconds,
            api_endpoint=cfg.api_endpoint,
            retry_window_seconds=retry_window_seconds,
        )

    def enqueue(self, task: Task) -> bool:
        """Create ``task`` as an HTTP task; return False when its name is already taken.

        Timeout budget: each attempt waits at most 2 s to connect and 2 s for the answer; a 429,
        5xx or failed connection is retried with jittered backoff (0.2 s doubling to 1 s) while
        a retry can start within 3.5 s. So a dead service fails in about 3.5 s, a silent one in
        2 s, and no call outlasts 7.5 s (GitHub waits 10 s). Raises ``Permanent`` unsent when
        the whole task (body, name, URL, headers) is over ``MAX_TASK_BYTES`` or the name is no
        task id, and when Cloud Tasks
        refuses (400, 401, 403, 404, other 4xx); ``Transient`` on 429, 5xx, 409 ABORTED or
        network once retries end.
        """
        _check(task)
        self._check_size(task)
        from google.auth.exceptions import GoogleAuthError, TransportError

        where = f"Cloud Tasks queue {self._queue_path}"
        try:
            response = self._post(json.dumps(self._create_task_request(task)).encode())
        except (TransportError, OSError) as exc:  # requests' exceptions are OSErrors
            raise Transient(f"{where} is unavailable now ({exc}); try again later") from exc
        except GoogleAuthError as exc:
            raise Permanent(f"{where}: {_FIXES[401]} ({exc})") from exc
        if response.ok:
            return True
        status, (code, message) = response.status_code, _google_error(response)
        detail = f"HTTP {status} {code}: {message}"
        # 409 is ALREADY_EXISTS (the name is held, or was deleted or run within about an
        # hour) or ABORTED (a concurrency conflict, worth another try); google.rpc.Code.
        if status == 409 and code != "ABORTED":
            return False
        if status == 409 or _retryable(status):
            raise Transient(f"{where} is unavailable now ({detail}); try again later")
        raise Permanent(f"{where}: {_FIXES.get(status, 'see the error')} ({detail})")

    def _check_size(self, task: Task) -> None:
        """Refuse, unsent, a task over Cloud Tasks' 1 MB: the body with the task's name, the
        worker's URL, the headers and the OIDC fields it carries."""
        size = len(task.body) + sum(
            len(part.encode())
            for part in (
                f"{self._queue_path}/tasks/{task.name}",
                self._worker_url,
                self._service_account_email,
                self._audience,
                *(name + value for name, value in _TASK_HEADERS.items()),
            )
        )
        if size > MAX_TASK_BYTES:
            raise Permanent(
                f"task {task.name[:80]!r} is {size} bytes with its name, URL and headers "
                f"({len(task.body)} of body); Cloud Tasks holds at most {MAX_TASK_BYTES} bytes "
                "per task, so shrink the payload"
            )

    def _create_task_request(self, task: Task) -> dict[str, object]:
        """CreateTaskRequest's JSON body (the parent travels in the URL)."""
        scheduled = {} if task.not_before is None else {"scheduleTime": _rfc3339(task.not_before)}
        return {
            "task": scheduled
            | {
                "name": f"{self._queue_path}/tasks/{task.name}",
                "httpRequest": {
                    "url": self._worker_url,
                    "httpMethod": _HTTP_METHOD_POST,
                    "headers": _TASK_HEADERS,
                    "body": base64.b64encode(task.body).decode("ascii"),
                    "oidcToken": {
                        "serviceAccountEmail": self._service_account_email,
                        "audience": self._audience,
                    },
                },
                "dispatchDeadline": f"{self._dispatch_deadline_seconds}s",
            }
        }

    def _post(self, body: bytes) -> Response:
        """POST ``body``, retrying 429, 5xx and failed connections within the retry window.

        A read timeout is not retried: that attempt may yet succeed, and it has spent the
        budget anyway. Returns the last response; raises the last connection failure.
        """
        from requests.exceptions import ConnectionError as Unreachable

        deadline = time.monotonic() + self._retry_window_seconds
        delays = _backoff()
        while True:
            delay = next(delays)  # the pause before a retry, if this attempt needs one
            try:
                response = self._session.post(
                    self._url,
                    params=_QUERY,
                    data=body,
                    headers=self._headers,
                    timeout=ATTEMPT_TIMEOUT_SECONDS,
                )
                if not _retryable(response.status_code) or time.monotonic() + delay > deadline:
                    return response
            except Unreachable:
                if time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)


def _check(task: Task) -> None:
    if not _TASK_NAME.match(task.name):
        raise Permanent(
            f"task name {task.name[:80]!r} is not 1-500 of A-Z a-z 0-9 _ -; "
            "derive it with core.tasknames.delivery_task_name"
        )


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


def _backoff() -> Iterator[float]:
    """Truncated exponential backoff with full jitter, as google-api-core's ``Retry``."""
    ceiling = _FIRST_BACKOFF_SECONDS
    while True:
        yield random.uniform(0.0, ceiling)  # noqa: S311 - jitter, not a secret
        ceiling = min(ceiling * 2, _MAX_BACKOFF_SECONDS)


def _google_error(response: Response) -> tuple[str, str]:
    """``(status, message)`` of Google's error body ``{"error": {code, status, message}}``;
    ``("", start of the body)`` when a proxy or load balancer answered instead."""
    try:
        error = response.json()["error"]
        return str(error.get("status", "")), str(error.get("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):  # not Google's JSON error
        return "", response.text[:200]


def _base_url(api_endpoint: str | None) -> str:
    """The endpoint with a scheme; a bare host means HTTPS, as in Google's client."""
    endpoint = (api_endpoint or DEFAULT_ENDPOINT).rstrip("/")
    return endpoint if re.match(r"^https?://", endpoint) else f"https://{endpoint}"


def _session_for(api_endpoint: str | None) -> AuthorizedSession:
    """A session without credentials for ``api_endpoint`` (tests), else the default one."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError
    from google.auth.transport.requests import AuthorizedSession

    if api_endpoint:
        return AuthorizedSession(AnonymousCredentials())  # type: ignore[no-untyped-call]
    try:
        credentials, _project = google.auth.default(default_scopes=_SCOPES)
    except DefaultCredentialsError as exc:
        raise ConfigError(
            "Cloud Tasks needs Google credentials: run as a service account in the cloud, or "
            "`gcloud auth application-default login` / GOOGLE_APPLICATION_CREDENTIALS locally"
        ) from exc
    return AuthorizedSession(credentials, default_host=_DEFAULT_HOST)  # type: ignore[no-untyped-call]


def _rfc3339(moment: datetime) -> str:
    """A protobuf Timestamp's JSON form: UTC, ``Z``-suffixed, microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
