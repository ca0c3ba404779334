"""The runners whose records changed, from the embedded SQLite database, behind
``RunnerChanges``.

Scenario: ``looprelay up`` serves 3,000 agents; the runner API keeps the runners it
authenticated in a bounded cache (``service.runner_cache.RunnerRecords``). The registry adds
a row to ``runner_changes`` in the same transaction as each change to a runner; one thread
reads the rows newer than the last it saw, every ``LOOK_SECONDS``, and tells the cache. A
read of an idle table finds nothing and costs microseconds, not one per runner.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from looprelay.adapters.sqlite.database import SqliteDatabase, open_database
from looprelay.adapters.sqlite.runners import SCHEMA
from looprelay.errors import Transient
from looprelay.ports import RunnerChanged

log = logging.getLogger("looprelay.adapters.sqlite.runner_changes")

LOOK_SECONDS = 0.1
"""How often the change rows are read: a revocation holds within this."""


class SqliteRunnerChanges:
    """The ``RunnerChanges`` port on the registry's ``runner_changes`` rows."""

    def __init__(self, path: str | Path | SqliteDatabase, *, look_seconds: float = LOOK_SECONDS):
        """Read the change rows of the database at ``path`` (sharing its connection when
        given one)."""
        self._db = open_database(path, schema=SCHEMA, what="SQLite runner registry")
        self._look_seconds = look_seconds
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._live_in: int | None = None
        """The process whose thread read the rows last without failing: the only one live."""
        self._started_in: int | None = None

    def start(self, on_change: RunnerChanged) -> None:
        """See ``RunnerChanges.start``."""
        with self._lock:
            if self._started_in == os.getpid():
                return
            self._started_in, self._live_in = os.getpid(), None
        threading.Thread(
            target=self._follow, args=(on_change,), name="looprelay-runner-changes", daemon=True
        ).start()

    def live(self) -> bool:
        """See ``RunnerChanges.live``."""
        with self._lock:
            return self._live_in == os.getpid() and not self._stop.is_set()

    def close(self) -> None:
        """See ``RunnerChanges.close``."""
        self._stop.set()

    def _follow(self, on_change: RunnerChanged) -> None:
        seen: int | None = None
        while not self._stop.is_set():
            try:
                seen = self._look(seen, on_change)
            except Transient as exc:
                log.warning("cannot read runner changes (%s); runners are read until it can", exc)
                with self._lock:
                    self._live_in = None
                on_change(None)
                seen = None
            self._stop.wait(self._look_seconds)

    def _look(self, seen: int | None, on_change: RunnerChanged) -> int:
        if seen is None:  # the first look: changes from now on
            rows = self._db.rows("SELECT COALESCE(MAX(seq), 0) AS seq FROM runner_changes")
            with self._lock:
                self._live_in = os.getpid()
            return int(rows[0]["seq"])
        rows = self._db.rows(
            "SELECT seq, runner_id FROM runner_changes WHERE seq > ? ORDER BY seq", (seen,)
        )
        if not rows:
            return seen
        if rows[0]["seq"] != seen + 1 and self._pruned_past(seen):
            on_change(None)  # fell behind what is kept: anything may have changed
        else:
            on_change({row["runner_id"] for row in rows})
        return int(rows[-1]["seq"])

    def _pruned_past(self, seen: int) -> bool:
        rows = self._db.rows("SELECT MIN(seq) AS seq FROM runner_changes")
        return rows[0]["seq"] is not None and int(rows[0]["seq"]) > seen + 1
