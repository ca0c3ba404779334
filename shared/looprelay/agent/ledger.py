"""The agent's local ledger: each dispatch applied at most once, and the sessions it holds.

One SQLite file in the agent's state directory, WAL, ``synchronous=FULL``: a claim is on disk
before the side effect it guards starts (apply each dispatch at most once).

Scenario, for a paste:
  1. ``claim`` writes ``applying``   -> the paste happens -> ``record_result`` writes the result.
  2. Crash after 1, restart, the same dispatch again -> ``claim`` returns the entry with its
     result, which is reported again; nothing is pasted twice.
  3. Crash between the paste and ``record_result`` -> the entry is stuck in ``applying``; the
     caller reports it ``interrupted`` and not retryable (at most once beats at least once).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprelay.wire.runner_api import Dispatch

APPLYING = "applying"
RECORDED = "recorded"

ResultRecord = Mapping[str, Any]
"""A result as stored: the applier's result as a flat JSON object, read back raw."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS dispatches (
    dispatch_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    result TEXT
);
CREATE TABLE IF NOT EXISTS sessions (
    session_name TEXT PRIMARY KEY,
    work_item TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    session_id TEXT NOT NULL,
    checkout TEXT NOT NULL,
    created_checkout INTEGER NOT NULL,
    harness TEXT NOT NULL,
    runner_kind TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_work_item ON sessions (work_item);
"""


@dataclass(frozen=True)
class LedgerEntry:
    """A dispatch this agent has seen: ``applying`` (no result yet) or ``recorded``."""

    dispatch_id: str
    state: str
    result: ResultRecord | None


@dataclass(frozen=True)
class LocalSession:
    """A session this agent hosts, and where: what cleanup needs after a restart."""

    session_name: str
    work_item: str
    endpoint: str
    session_id: str
    checkout: str
    created_checkout: bool
    harness: str
    runner_kind: str

    @classmethod
    def from_dispatch(
        cls, dispatch: Dispatch, *, session_id: str, checkout: Path, created_checkout: bool
    ) -> LocalSession:
        """Return the record of the session ``dispatch`` names, as it now runs here."""
        return cls(
            session_name=dispatch.session_name,
            work_item=dispatch.work_item,
            endpoint=dispatch.endpoint,
            session_id=session_id,
            checkout=str(checkout),
            created_checkout=created_checkout,
            harness=dispatch.harness,
            runner_kind=dispatch.runner_kind,
        )


class Ledger:
    """The ledger file at ``path`` (created with its directory); safe to share across threads.

    Raises ``sqlite3.Error`` when the file cannot be opened: the agent cannot run without it.
    SQLite waits up to 10 s for a lock another process holds.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            path, timeout=10.0, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def claim(self, dispatch_id: str) -> LedgerEntry | None:
        """Record ``dispatch_id`` as ``applying``; return None if this call claimed it.

        Returns the earlier entry instead when the dispatch was seen before: the caller reports
        that entry and applies nothing. The claim is durable before this returns.
        """
        with self._lock:
            inserted = self._db.execute(
                "INSERT INTO dispatches (dispatch_id, state) VALUES (?, ?) "
                "ON CONFLICT (dispatch_id) DO NOTHING",
                (dispatch_id, APPLYING),
            ).rowcount
            if inserted:
                return None
            state, result = self._db.execute(
                "SELECT state, result FROM dispatches WHERE dispatch_id = ?", (dispatch_id,)
            ).fetchone()
        return LedgerEntry(
            dispatch_id=dispatch_id,
            state=state,
            result=json.loads(result) if result is not None else None,
        )

    def record_result(self, dispatch_id: str, result: ResultRecord) -> None:
        """Store the result of a claimed dispatch, durably, replacing any earlier one."""
        with self._lock:
            self._db.execute(
                "INSERT INTO dispatches (dispatch_id, state, result) VALUES (?, ?, ?) "
                "ON CONFLICT (dispatch_id) DO UPDATE SET state = excluded.state, "
                "result = excluded.result",
                (dispatch_id, RECORDED, json.dumps(dict(result), sort_keys=True)),
            )

    def remember(self, session: LocalSession) -> None:
        """Store (or replace) the local record of ``session.session_name``."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session.session_name,
                    session.work_item,
                    session.endpoint,
                    session.session_id,
                    session.checkout,
                    int(session.created_checkout),
                    session.harness,
                    session.runner_kind,
                ),
            )

    def session(self, session_name: str) -> LocalSession | None:
        """Return the local record of ``session_name``, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM sessions WHERE session_name = ?", (session_name,)
            ).fetchone()
        return None if row is None else _session(row)

    def sessions_for(self, work_item: str) -> list[LocalSession]:
        """Return every local session of ``work_item`` (its own and its pull requests')."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM sessions WHERE work_item = ? ORDER BY session_name", (work_item,)
            ).fetchall()
        return [_session(row) for row in rows]

    def all_sessions(self) -> list[LocalSession]:
        """Return every session this agent hosts, by name."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM sessions ORDER BY session_name").fetchall()
        return [_session(row) for row in rows]

    def session_count(self) -> int:
        """Return how many sessions this agent hosts."""
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM sessions").fetchone()
        return int(count)

    def forget(self, session_name: str) -> None:
        """Drop the local record of ``session_name``; a missing one is fine."""
        with self._lock:
            self._db.execute("DELETE FROM sessions WHERE session_name = ?", (session_name,))

    def close(self) -> None:
        """Close the file; the ledger is unusable afterwards."""
        with self._lock:
            self._db.close()


def _session(row: tuple[str, str, str, str, str, int, str, str]) -> LocalSession:
    name, work_item, endpoint, session_id, checkout, created, harness, runner_kind = row
    return LocalSession(
        session_name=name,
        work_item=work_item,
        endpoint=endpoint,
        session_id=session_id,
        checkout=checkout,
        created_checkout=bool(created),
        harness=harness,
        runner_kind=runner_kind,
    )
