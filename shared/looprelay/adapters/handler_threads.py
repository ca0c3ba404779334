"""Threads for the HTTP handlers that block (a runner's long poll, the worker's routing).

A fixed pool could starve: every runner agent holds a long poll for up to 30 s, and the queue's
dispatchers must still reach the worker. So a job takes an idle thread when one exists and
starts a new one otherwise; a thread idle for a minute exits. Threads are daemons, like the
connection threads they replace: stopping ``looprelay up`` never waits for a long poll.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("looprelay.server")

IDLE_SECONDS = 60.0
"""A thread without a job this long exits."""


class HandlerThreads:
    """Runs jobs on daemon threads, reusing idle ones."""

    def __init__(self, *, name: str, idle_seconds: float = IDLE_SECONDS) -> None:
        self._name = name
        self._idle_seconds = idle_seconds
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # idle threads not yet promised a job
        self._started = 0

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job`` on an idle thread, or a new one; exceptions are logged, not raised."""
        with self._lock:
            reuse = self._idle > 0
            if reuse:
                self._idle -= 1
            else:
                self._started += 1
                number = self._started
        self._jobs.put(job)
        if not reuse:
            threading.Thread(target=self._serve, name=f"{self._name}-{number}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody promised this thread a job: leave
                        self._idle -= 1
                        return
                continue  # a job was promised to an idle thread; this one takes it
            try:
                job()
            except Exception:
                log.exception("unhandled error in %s", self._name)
            with self._lock:
                self._idle += 1
