"""The server's check on itself: its event loop, asked from a thread.

A process that holds the data directory's lock but no longer serves (its event loop is stuck)
keeps a supervisor from starting a healthy one. So ``looprelay up`` asks its own loop to run
a callback every ``PERIOD_SECONDS``; after ``FAILURES`` callbacks missed in a row it stops
with a non-zero status, and if even stopping does not happen within ``EXIT_SECONDS`` the
process exits at once (every acked task is already synced to disk).

The check never goes through the public listener: a server whose connection table is full
(issue 24: a flood of slow heads) is still serving, and must not count as stopped. A listener
that fails ends the server by itself, which exits non-zero too (``server.LocalServer``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger("looprelay.server")


class Watchdog:
    """Checks that ``loop`` runs callbacks, from a daemon thread."""

    PERIOD_SECONDS = 5.0
    """How often the loop is asked, and how long each answer may take."""
    FAILURES = 3
    """Missed answers in a row that mean the server stopped serving."""
    EXIT_SECONDS = 30.0
    """How long ``on_failure`` may take to stop the process before it exits at once."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        on_failure: Callable[[], None],
        period: float,
    ) -> None:
        self._loop = loop
        self._on_failure = on_failure
        self._period = period
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def start(self) -> None:
        """Start asking."""
        self._thread.start()

    def stop(self) -> None:
        """Stop asking (the server is stopping on purpose); again is harmless."""
        self._stopped.set()

    def _run(self) -> None:
        missed = 0
        while not self._stopped.wait(self._period):
            missed = 0 if self._answers() else missed + 1
            if missed < self.FAILURES or self._stopped.is_set():
                continue
            log.error("the event loop did not run its health check %d times in a row", missed)
            self._on_failure()
            if not self._stopped.wait(self.EXIT_SECONDS):
                log.error("the server did not stop; exiting now")
                os._exit(1)
            return

    def _answers(self) -> bool:
        answered = threading.Event()
        try:
            self._loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # the loop is closed: stopping, on purpose or not
            return self._stopped.is_set()
        if answered.wait(self._period) or self._stopped.is_set():
            return True
        log.warning("the event loop did not run a callback within %.1fs", self._period)
        return False
