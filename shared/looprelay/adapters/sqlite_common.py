"""One SQLite database as every embedded adapter uses it: WAL, fully synced commits, a
busy timeout, and ``sqlite3.OperationalError`` translated to ``Transient`` once, here."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from looprelay.errors import Transient

BUSY_TIMEOUT_MS = 5000
"""How long a write waits for another connection's lock before ``Transient``."""


def utc_text(moment: datetime) -> str:
    """Fixed-width UTC ISO text; it sorts in time order."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def parse_utc_text(text: str) -> datetime:
    """The moment ``utc_text`` wrote; raises ``ValueError`` for text that is not ISO 8601."""
    return datetime.fromisoformat(text)


class SqliteDatabase:
    """A thread-safe connection to one database file, with the tables of ``schema``."""

    def __init__(self, path: str | Path, *, schema: str, what: str) -> None:
        """Open (creating tables) the file; ``what`` names it in errors.

        Raises ``Transient`` when the file cannot be opened.
        """
        self._what = what
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._db.executescript(schema)
        except sqlite3.Error as exc:
            raise Transient(f"cannot open the {what} at {path}: {exc}") from exc

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Run a read-check-write atomically: ``BEGIN IMMEDIATE`` takes the write lock up
        front, and anything left open (an exception, a failed COMMIT) is rolled back."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                finally:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
            except sqlite3.OperationalError as exc:
                raise Transient(f"{self._what} busy or unavailable: {exc}") from exc

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        """Run one statement on its own (autocommit)."""
        with self._lock:
            try:
                return self._db.execute(sql, params)
            except sqlite3.OperationalError as exc:
                raise Transient(f"{self._what} busy or unavailable: {exc}") from exc

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """Run a query and return its rows, addressable by column name."""
        with self._lock:
            try:
                cursor = self._db.execute(sql, params)
                cursor.row_factory = sqlite3.Row
                return list(cursor.fetchall())
            except sqlite3.OperationalError as exc:
                raise Transient(f"{self._what} busy or unavailable: {exc}") from exc
