"""Registration tokens and runners in the embedded SQLite database."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection
from datetime import datetime
from pathlib import Path
from typing import Any

from looprelay.adapters.sqlite.database import (
    SqliteDatabase,
    open_database,
    parse_utc_text,
    utc_text,
)
from looprelay.core.model import RegistrationToken, RunnerRecord
from looprelay.core.slots import WORKSPACE_LABEL
from looprelay.ports import RunnerStatus

SCHEMA = """
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
CREATE TABLE IF NOT EXISTS runner_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    runner_id TEXT NOT NULL
);
"""

KEPT_CHANGES = 10_000
"""Change rows kept (``runner_changes.py`` reads the newer ones): a feed further behind than
this says it missed changes."""


class SqliteRunnerRegistry:
    """The ``RunnerRegistry`` port on SQLite; one small JSON document per runner."""

    def __init__(self, path: str | Path | SqliteDatabase) -> None:
        """Open (creating) the tables in the database at ``path``; ``Transient`` on failure."""
        self._db = open_database(path, schema=SCHEMA, what="SQLite runner registry")

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def add_registration_token(self, token: RegistrationToken) -> None:
        """See ``RunnerRegistry.add_registration_token``."""
        self._db.execute(
            "INSERT INTO registration_tokens (token_hash, created_at, expires_at) VALUES (?,?,?)",
            (token.token_hash, utc_text(token.created_at), utc_text(token.expires_at)),
        )

    def consume_registration_token(self, token_hash: str, *, at: datetime) -> bool:
        """See ``RunnerRegistry.consume_registration_token``."""
        cursor = self._db.execute(
            "UPDATE registration_tokens SET used_at = ?"
            " WHERE token_hash = ? AND used_at IS NULL AND expires_at > ?",
            (utc_text(at), token_hash, utc_text(at)),
        )
        return cursor.rowcount == 1

    def add_runner(self, runner: RunnerRecord) -> None:
        """See ``RunnerRegistry.add_runner``."""
        try:
            self._db.execute(
                "INSERT INTO runners (runner_id, registered_at, doc) VALUES (?,?,?)",
                (runner.runner_id, utc_text(runner.registered_at), runner.model_dump_json()),
            )
        except sqlite3.IntegrityError as exc:
            raise ValueError(f"runner {runner.runner_id} already exists") from exc

    def get_runner(self, runner_id: str) -> RunnerRecord | None:
        """See ``RunnerRegistry.get_runner``."""
        rows = self._db.rows("SELECT doc FROM runners WHERE runner_id = ?", (runner_id,))
        return RunnerRecord.model_validate_json(rows[0]["doc"]) if rows else None

    def get_runners(self, runner_ids: Collection[str]) -> dict[str, RunnerRecord]:
        """See ``RunnerRegistry.get_runners``."""
        query = "SELECT doc FROM runners WHERE runner_id IN ({marks})"
        runners = (
            RunnerRecord.model_validate_json(row["doc"])
            for row in self._db.rows_among(query, runner_ids)
        )
        return {runner.runner_id: runner for runner in runners}

    def list_runners(self) -> list[RunnerRecord]:
        """See ``RunnerRegistry.list_runners``."""
        rows = self._db.rows("SELECT doc FROM runners ORDER BY registered_at, runner_id")
        return [RunnerRecord.model_validate_json(row["doc"]) for row in rows]

    def find_checkout_runner(self) -> str | None:
        """See ``RunnerRegistry.find_checkout_runner``."""
        rows = self._db.rows(
            "SELECT runner_id FROM runners WHERE json_extract(doc, '$.revoked_at') IS NULL"
            " AND (json_extract(doc, '$.workspace') = 1"
            " OR json_extract(doc, '$.labels.' || ?) = 'true') LIMIT 1",
            (WORKSPACE_LABEL,),
        )
        return rows[0]["runner_id"] if rows else None

    def list_last_seen(self, runner_ids: Collection[str]) -> dict[str, datetime]:
        """See ``RunnerRegistry.list_last_seen``."""
        rows = self._db.rows_among(
            "SELECT runner_id, json_extract(doc, '$.last_seen_at') AS seen FROM runners"
            " WHERE runner_id IN ({marks}) AND seen IS NOT NULL",
            runner_ids,
        )
        return {row["runner_id"]: parse_utc_text(row["seen"]) for row in rows}

    def _change(self, runner_id: str, *, announce: bool = True, **fields: Any) -> bool:
        # json_patch applies only while the runner is not revoked; a change is announced
        # (``RunnerChanges``) in the same transaction.
        update = (
            "UPDATE runners SET doc = json_patch(doc, ?)"
            " WHERE runner_id = ? AND json_extract(doc, '$.revoked_at') IS NULL"
        )
        if not announce:
            return self._db.execute(update, (json.dumps(fields), runner_id)).rowcount == 1
        with self._db.transaction() as db:
            if db.execute(update, (json.dumps(fields), runner_id)).rowcount != 1:
                return False
            seq = db.execute("INSERT INTO runner_changes (runner_id) VALUES (?)", (runner_id,))
            db.execute(
                "DELETE FROM runner_changes WHERE seq <= ?", ((seq.lastrowid or 0) - KEPT_CHANGES,)
            )
        return True

    def revoke_runner(self, runner_id: str, *, at: datetime) -> bool:
        """See ``RunnerRegistry.revoke_runner``."""
        return self._change(runner_id, revoked_at=utc_text(at))

    def rotate_runner_secret(self, runner_id: str, *, secret_hash: str) -> bool:
        """See ``RunnerRegistry.rotate_runner_secret``."""
        return self._change(runner_id, secret_hash=secret_hash)

    def record_heartbeat(self, runner_id: str, *, at: datetime, status: RunnerStatus) -> bool:
        """See ``RunnerRegistry.record_heartbeat``."""
        return self._change(runner_id, last_seen_at=utc_text(at), **status.record_fields())

    def record_alive(self, runner_id: str, *, at: datetime) -> None:
        """See ``RunnerRegistry.record_alive``: the same update, of ``last_seen_at`` alone."""
        self._change(runner_id, announce=False, last_seen_at=utc_text(at))
