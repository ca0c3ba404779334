"""A loopback Cloud Tasks REST endpoint that records what the real client sends.

It speaks the one call ``CloudTasksQueue`` makes, ``POST /v2/{queue path}/tasks``, the way the
service does (offline-toolchain.md §3c): a task name it holds, or held until
``reserve_seconds`` (an hour) ago, gets 409 ALREADY_EXISTS; a new one is kept and echoed back.
:meth:`CloudTasksRecorder.end` ends a task (it ran, or its retries ran out) as the service
does: gone from the queue, its name still reserved. Tests script failures with
:meth:`CloudTasksRecorder.fail_next`.
Both ``CloudTasksQueue`` and Google's own client (the oracle for the request's shape) talk to it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import pytest

from looprelay.adapters.gcp.cloud_tasks import CloudTasksQueue
from looprelay.config.model import CloudTasksConfig
from tests.loopback import LoopbackServer

PROJECT = "demo-lab"
LOCATION = "us-central1"
QUEUE = "work"
QUEUE_PATH = f"projects/{PROJECT}/locations/{LOCATION}/queues/{QUEUE}"
WORKER_URL = "https://worker-xyz.a.run.app/worker"
SERVICE_ACCOUNT = "tasks@demo-lab.iam.gserviceaccount.com"

_CREATE_TASK = re.compile(r"^/v2/(projects/[^/]+/locations/[^/]+/queues/[^/]+)/tasks$")
# google.rpc.Code names the service puts in error.status, by HTTP status.
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


@dataclass(frozen=True)
class RecordedRequest:
    """One request as it arrived: path, raw query string, headers and JSON body."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any


class CloudTasksRecorder:
    """The server's state: every request received, the tasks held, scripted failures."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.tasks: dict[str, dict[str, Any]] = {}
        self.reserve_seconds = 3600.0  # how long an ended task's name stays taken
        self.clock: Callable[[], float] = time.monotonic
        self._ended: dict[str, float] = {}  # full task name -> when it ended
        self._failures: list[tuple[int, str | None, str | None]] = []
        self._stalls: list[float] = []
        self._lock = threading.Lock()
        self._loopback = LoopbackServer(_handler_for(self))
        self.on_created: list[Callable[[str, dict[str, Any]], None]] = []
        """Called with each task's short name and body as it is created: a dispatcher."""

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, the ``api_endpoint`` to give the client."""
        return self._loopback.url

    def fail_next(
        self, count: int, *, status: int, code: str | None = None, text: str | None = None
    ) -> None:
        """Answer the next ``count`` calls with an error of HTTP ``status``.

        The body is Google's JSON error with ``code`` as its ``status`` (default: the usual name
        for the HTTP status), or ``text`` as a plain-text body, as a proxy in between would send.
        """
        with self._lock:
            self._failures.extend([(status, code, text)] * count)

    def stall_next(self, count: int, *, seconds: float) -> None:
        """Hold the next ``count`` calls for ``seconds`` before answering them as usual."""
        with self._lock:
            self._stalls.extend([seconds] * count)

    def end(self, short_name: str) -> None:
        """End the held task ``short_name``: it ran or died; its name stays reserved."""
        with self._lock:
            [name] = [n for n in self.tasks if n.rsplit("/", 1)[-1] == short_name]
            del self.tasks[name]
            self._ended[name] = self.clock()

    def take_stall(self) -> float:
        """Seconds the call arriving now must wait (0 when none is scripted)."""
        with self._lock:
            return self._stalls.pop(0) if self._stalls else 0.0

    def held(self) -> dict[str, bytes]:
        """Short task name -> decoded body of every task accepted."""
        with self._lock:
            return {
                name.rsplit("/", 1)[-1]: base64.b64decode(task["httpRequest"].get("body", ""))
                for name, task in self.tasks.items()
            }

    def start(self) -> None:
        """Serve in a background thread."""
        self._loopback.start()

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._loopback.stop()

    def answer(self, request: RecordedRequest) -> tuple[int, dict[str, Any] | str]:
        """Record ``request`` and decide the response, as Cloud Tasks' CreateTask would."""
        with self._lock:
            self.requests.append(request)
            if self._failures:
                status, code, text = self._failures.pop(0)
                return status, text if text is not None else _error(status, "failure", code)
            match = _CREATE_TASK.match(request.path)
            if request.method != "POST" or match is None:
                return 404, _error(404, f"no such method: {request.method} {request.path}")
            task = dict(request.body.get("task") or {})
            name = task.setdefault("name", f"{match.group(1)}/tasks/{len(self.tasks) + 1}")
            if not name.startswith(f"{match.group(1)}/tasks/"):
                return 400, _error(400, f"task name {name} is not in the queue of the URL")
            ended = self._ended.get(name)
            if name in self.tasks or (
                ended is not None and self.clock() < ended + self.reserve_seconds
            ):
                return 409, _error(409, "Requested entity already exists")
            self.tasks[name] = task
            return 200, task


def _error(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    code = code or _STATUS_NAMES.get(status, HTTPStatus(status).phrase.upper().replace(" ", "_"))
    return {"error": {"code": status, "status": code, "message": message}}


def _handler_for(recorder: CloudTasksRecorder) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self._respond()

        def do_GET(self) -> None:
            self._respond()

        def _respond(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            url = urlsplit(self.path)
            request = RecordedRequest(
                method=self.command,
                path=url.path,
                query=url.query,
                headers=dict(self.headers.items()),
                body=json.loads(raw) if raw else {},
            )
            time.sleep(recorder.take_stall())
            status, payload = recorder.answer(request)
            if status == 200 and isinstance(payload, dict) and "httpRequest" in payload:
                for created in recorder.on_created:
                    created(str(payload["name"]).rsplit("/", 1)[-1], payload)
            if isinstance(payload, str):
                data, kind = payload.encode(), "text/plain"
            else:
                data, kind = json.dumps(payload).encode(), "application/json"
            # After a stall the client may have hung up; the task is created all the same.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(status)
                self.send_header("Content-Type", f"{kind}; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Keep test output quiet; the recorder's ``requests`` is the log."""

    return _Handler


@dataclass
class CloudTasksQueueHarness:
    """A ``CloudTasksQueue`` wired to a recorder, for the queue contract suite."""

    queue: CloudTasksQueue
    recorder: CloudTasksRecorder

    def held(self) -> dict[str, bytes]:
        """Task name -> body of every task the recorder accepted."""
        return self.recorder.held()

    def due(self, name: str) -> float | None:
        """When the task ``name`` is scheduled for (its ``scheduleTime``); None: at once."""
        return scheduled_for(self.recorder.tasks[f"{QUEUE_PATH}/tasks/{name}"])


def scheduled_for(task: dict[str, Any]) -> float | None:
    """A held task's ``scheduleTime`` in epoch seconds; None when it has none (due at once)."""
    value = task.get("scheduleTime")
    return None if value is None else datetime.fromisoformat(value).timestamp()


def recorder_config(recorder: CloudTasksRecorder, **overrides: Any) -> CloudTasksConfig:
    """The test queue's configuration, pointed at ``recorder``."""
    fields: dict[str, Any] = {
        "project": PROJECT,
        "location": LOCATION,
        "queue": QUEUE,
        "worker_url": WORKER_URL,
        "service_account_email": SERVICE_ACCOUNT,
        "api_endpoint": recorder.url,
    }
    return CloudTasksConfig(**(fields | overrides))


@pytest.fixture
def cloudtasks_recorder() -> Iterator[CloudTasksRecorder]:
    """A running recorder on a free loopback port, stopped after the test."""
    recorder = CloudTasksRecorder()
    recorder.start()
    yield recorder
    recorder.stop()


@pytest.fixture
def cloudtasks_queue_harness(cloudtasks_recorder: CloudTasksRecorder) -> CloudTasksQueueHarness:
    """A ``CloudTasksQueue`` built by ``from_config`` against the recorder."""
    queue = CloudTasksQueue.from_config(recorder_config(cloudtasks_recorder))
    return CloudTasksQueueHarness(queue=queue, recorder=cloudtasks_recorder)
