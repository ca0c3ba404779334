"""The server's check on itself: ``GET /healthz`` on its own port from a thread.

A process that holds the data directory's lock but no longer answers (its listener failed,
its event loop is stuck) keeps a supervisor from starting a healthy one. So ``looprelay up``
asks itself every ``PERIOD_SECONDS``; after ``FAILURES`` answers missed in a row it stops
with a non-zero status, and if even stopping does not happen within ``EXIT_SECONDS`` the
process exits at once (every acked task is already synced to disk).
"""

from __future__ import annotations

import http.client
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger("looprelay.server")


class Watchdog:
    """Checks ``host:port`` answers ``GET /healthz`` from a daemon thread."""

    PERIOD_SECONDS = 5.0
    """How often the server is asked, and how long each answer may take."""
    FAILURES = 3
    """Missed answers in a row that mean the server stopped serving."""
    EXIT_SECONDS = 30.0
    """How long ``on_failure`` may take to stop the process before it exits at once."""

    def __init__(
        self, host: str, port: int, *, on_failure: Callable[[], None], period: float
    ) -> None:
        self._host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
        self._port = port
        self._on_failure = on_failure
        self._period = period
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def start(self) -> None:
        """Start asking."""
        self._thread.start()

    def stop(self) -> None:
        """Stop asking (the server is stopping on purpose)."""
        self._stopped.set()

    def _run(self) -> None:
        missed = 0
        while not self._stopped.wait(self._period):
            missed = 0 if self._answers() else missed + 1
            if missed < self.FAILURES or self._stopped.is_set():
                continue
            log.error("the server did not answer its health check %d times in a row", missed)
            self._on_failure()
            if not self._stopped.wait(self.EXIT_SECONDS):
                log.error("the server did not stop; exiting now")
                os._exit(1)
            return

    def _answers(self) -> bool:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=self._period)
        try:
            connection.request("GET", "/healthz")
            return connection.getresponse().status < 500
        except (OSError, http.client.HTTPException) as exc:
            log.warning("health check failed: %s", exc)
            return False
        finally:
            connection.close()
