"""A dispatcher with Cloud Tasks' semantics, for the loopback recorder's tasks.

Cloud Tasks pushes each task as soon as it is created (or at its ``scheduleTime``), with no
order among them and many at once, and retries a task whose answer is not 2xx after
``min_backoff x 2^n`` (n = the retries so far, capped at ``max_backoff``), or after the
answer's ``Retry-After`` when that is longer
(docs: "Configure Cloud Tasks queues", RetryConfig; "Create HTTP Target tasks"). This one does
the same for every task the ``CloudTasksRecorder`` accepts: a thread per task, POSTing the
task's body to the worker with the ``X-CloudTasks-*`` headers and a bearer token.
"""

from __future__ import annotations

import base64
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from looprelay.core.backoff import backoff_seconds
from tests.cloudtasks_recorder import scheduled_for

MAX_DOUBLINGS = 16
"""Cloud Tasks' default ``maxDoublings``."""


@dataclass
class CloudTasksDispatcher:
    """Pushes each task the recorder accepts to ``worker_url``, retrying as Cloud Tasks does."""

    worker_url: str
    token: str
    min_backoff: float = 1.0
    max_backoff: float = 3600.0
    attempts: dict[str, int] = field(default_factory=dict)
    """Task name -> the attempts made so far."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def push(self, name: str, task: dict[str, Any]) -> None:
        """Start delivering ``task`` (as the recorder holds it), at once or at its
        ``scheduleTime``, in a thread of its own."""
        body = base64.b64decode(task["httpRequest"].get("body", ""))
        due = scheduled_for(task)
        thread = threading.Thread(target=self._deliver, args=(name, body, due), daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def retries(self) -> int:
        """How many attempts past the first were made, over every task."""
        with self._lock:
            return sum(count - 1 for count in self.attempts.values())

    def stop(self) -> None:
        """Stop retrying; attempts in flight finish."""
        self._stop.set()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(60)

    def _deliver(self, name: str, body: bytes, due: float | None) -> None:
        if due is not None and self._stop.wait(max(0.0, due - time.time())):
            return
        for retry in itertools.count():
            with self._lock:
                self.attempts[name] = retry + 1
            answer = self._post(name, body, retry)
            if answer is not None and 200 <= answer.status_code < 300:
                return
            wait = backoff_seconds(
                retry + 1,
                min_backoff=self.min_backoff,
                max_backoff=self.max_backoff,
                max_doublings=MAX_DOUBLINGS,
            )
            later = _retry_after(answer)
            if self._stop.wait(max(wait, later)):
                return

    def _post(self, name: str, body: bytes, retry: int) -> requests.Response | None:
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {self.token}",
            "X-CloudTasks-QueueName": "work",
            "X-CloudTasks-TaskName": name,
            "X-CloudTasks-TaskRetryCount": str(retry),
        }
        try:
            return requests.post(self.worker_url, data=body, headers=headers, timeout=60)
        except requests.RequestException:
            return None


def _retry_after(answer: requests.Response | None) -> float:
    value = answer.headers.get("Retry-After") if answer is not None else None
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0
