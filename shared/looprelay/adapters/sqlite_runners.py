"""Registration tokens and runners in the embedded SQLite database."""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from looprelay.errors import Transient
from looprelay.ports import RunnerStatus
from looprelay.records import RegistrationToken, RunnerRecord

_SCHEMA = """
CREATE TABLE IF NOT EXISTS registration_tokens (
    token_hash TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    used_at TEXT
);
CREATE TABLE IF NOT EXISTS runners (
    runner_id TEXT PRIMARY KEY,
    registered_at TEXT NOT NULL,
    doc TEXT NOT NULL
);
"""


def _ts(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


class SqliteRunnerRegistry:
    """The ``RunnerRegistry`` port on SQLite; one small JSON document per runner."""

    def __init__(self, path: str | Path) -> None:
        """Open (creating) the tables in the database at ``path``; ``Transient`` on failure."""
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise Transient(f"cannot open the runner registry at {path}: {exc}") from exc

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    def _run(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Cursor:
        with self._lock:
            try:
                return self._db.execute(sql, params)
            except sqlite3.OperationalError as exc:
                raise Transient(f"SQLite runner registry busy or unavailable: {exc}") from exc

    def add_registration_token(self, token: RegistrationToken) -> None:
        """See ``RunnerRegistry.add_registration_token``."""
        self._run(
            "INSERT INTO registration_tokens (token_hash, created_at, expires_at) VALUES (?,?,?)",
            (token.token_hash, _ts(token.created_at), _ts(token.expires_at)),
        )

    def consume_registration_token(self, token_hash: str, *, at: datetime) -> bool:
        """See ``RunnerRegistry.consume_registration_token``."""
        cursor = self._run(
            "UPDATE registration_tokens SET used_at = ?"
            " WHERE token_hash = ? AND used_at IS NULL AND expires_at > ?",
            (_ts(at), token_hash, _ts(at)),
        )
        return cursor.rowcount == 1

    def add_runner(self, runner: RunnerRecord) -> None:
        """See ``RunnerRegistry.add_runner``."""
        try:
            self._run(
                "INSERT INTO runners (runner_id, registered_at, doc) VALUES (?,?,?)",
                (runner.runner_id, _ts(runner.registered_at), runner.model_dump_json()),
            )
        except sqlite3.IntegrityError as exc:
            raise ValueError(f"runner {runner.runner_id} already exists") from exc

    def get_runner(self, runner_id: str) -> RunnerRecord | None:
        """See ``RunnerRegistry.get_runner``."""
        row = self._run("SELECT doc FROM runners WHERE runner_id = ?", (runner_id,)).fetchone()
        return None if row is None else RunnerRecord.model_validate_json(row[0])

    def list_runners(self) -> list[RunnerRecord]:
        """See ``RunnerRegistry.list_runners``."""
        rows = self._run("SELECT doc FROM runners ORDER BY registered_at, runner_id", ()).fetchall()
        return [RunnerRecord.model_validate_json(row[0]) for row in rows]

    def _change(self, runner_id: str, **fields: Any) -> bool:
        # One statement: json_patch applies only while the runner is not revoked.
        cursor = self._run(
            "UPDATE runners SET doc = json_patch(doc, ?)"
            " WHERE runner_id = ? AND json_extract(doc, '$.revoked_at') IS NULL",
            (json.dumps(fields), runner_id),
        )
        return cursor.rowcount == 1

    def revoke_runner(self, runner_id: str, *, at: datetime) -> bool:
        """See ``RunnerRegistry.revoke_runner``."""
        return self._change(runner_id, revoked_at=at.astimezone(UTC).isoformat())

    def rotate_runner_secret(self, runner_id: str, *, secret_hash: str) -> bool:
        """See ``RunnerRegistry.rotate_runner_secret``."""
        return self._change(runner_id, secret_hash=secret_hash)

    def record_heartbeat(self, runner_id: str, *, at: datetime, status: RunnerStatus) -> bool:
        """See ``RunnerRegistry.record_heartbeat``."""
        return self._change(
            runner_id,
            last_seen_at=at.astimezone(UTC).isoformat(),
            **_status_fields(status),
        )


def _status_fields(status: RunnerStatus) -> dict[str, Any]:
    return {
        "version": status.version,
        "capacity": status.capacity,
        "repositories": list(status.repositories),
        "workspace": status.workspace,
        "sessions": status.sessions,
    }
