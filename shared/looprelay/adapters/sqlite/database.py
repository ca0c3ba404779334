"""One SQLite database as every embedded adapter uses it: WAL, fully synced commits, a
busy timeout, and ``sqlite3.OperationalError`` translated to ``Transient`` once, here.

(The durable enqueues of the embedded queue share their commits: ``enqueue_committer``.)"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from looprelay.errors import Transient
from looprelay.filemodes import private_file

BUSY_TIMEOUT_MS = 5000
"""How long a write waits for another connection's lock before ``Transient``."""
KEYS_PER_QUERY = 500
"""Keys bound in one ``IN`` list: well under SQLite's limit on a statement's parameters."""


def utc_text(moment: datetime) -> str:
    """Fixed-width UTC ISO text; it sorts in time order."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def parse_utc_text(text: str) -> datetime:
    """The moment ``utc_text`` wrote; raises ``ValueError`` for text that is not ISO 8601."""
    return datetime.fromisoformat(text)


Synchronous = Literal["FULL", "NORMAL"]


@dataclass(frozen=True, slots=True)
class Executed:
    """What one autocommitted statement did: its row count and every row it returned."""

    rowcount: int
    rows: list[Any]


_COMPANIONS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside a database; it creates them with the database file's mode."""


class SqliteDatabase:
    """A thread-safe connection to one database file, with the tables of ``schema``."""

    def __init__(
        self,
        path: str | Path,
        *,
        schema: str,
        what: str,
        synchronous: Synchronous = "FULL",
    ) -> None:
        """Open (creating tables) the file; ``what`` names it in errors.

        The file is created with mode 0600 (it holds comment bodies), and an existing one that
        others can read is made private (``filemodes.private_file``).

        ``synchronous="NORMAL"`` is for writes whose loss in a power cut is harmless (WAL mode
        keeps them safe from a process crash, and the next fully synced commit on the file
        makes them durable too). Raises ``Transient`` when the file cannot be opened.
        """
        self._what = what
        self._synchronous = synchronous
        self._mode: Synchronous = synchronous
        """What the writing connection is set to now: it stays as the last write left it."""
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        private_file(Path(path), companions=_COMPANIONS)
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._db.executescript(schema)
            # Reads get a connection of their own: in WAL mode they see every commit without
            # waiting behind a writer's fsync (a long poll must not queue behind a settle).
            self._reader = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._reader.execute("PRAGMA query_only=ON")
            self._reader.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._reader.row_factory = sqlite3.Row
        except sqlite3.Error as exc:
            raise Transient(f"cannot open the {what} at {path}: {exc}") from exc

    def ensure_schema(self, schema: str) -> None:
        """Create the tables of another adapter sharing this connection (idempotent)."""
        with self._lock:
            try:
                self._switch(self._synchronous)
                self._db.executescript(schema)
            except sqlite3.Error as exc:
                raise Transient(f"cannot create tables in the {self._what}: {exc}") from exc

    def add_columns(self, table: str, columns: Mapping[str, str]) -> None:
        """Add the ``columns`` (name -> SQL type and default) that ``table`` lacks: a file made
        by an older version gets them, with their defaults, when it is opened. Raises
        ``Transient`` when the table cannot be altered."""
        with self._lock:
            try:
                self._switch(self._synchronous)
                # table_xinfo: table_info leaves generated columns out.
                have = {row[1] for row in self._db.execute(f"PRAGMA table_xinfo({table})")}
                for name, declaration in columns.items():
                    if name not in have:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
            except sqlite3.Error as exc:
                raise Transient(f"cannot add columns to the {self._what}: {exc}") from exc

    def close(self) -> None:
        """Close the connection (again is harmless: adapters sharing it each close it)."""
        with self._lock, self._read_lock:
            self._db.close()
            self._reader.close()

    @contextmanager
    def transaction(self, *, synced: bool = True) -> Iterator[sqlite3.Connection]:
        """Run a read-check-write atomically: ``BEGIN IMMEDIATE`` takes the write lock up
        front, and anything left open (an exception, a failed COMMIT) is rolled back.

        ``synced=False`` skips the fsync for a write whose loss in a power cut is harmless
        because a later synced commit stands behind it (in WAL mode that commit makes every
        earlier one durable too); a process crash loses nothing either way.
        """
        mode: Synchronous = self._synchronous if synced else "NORMAL"
        with self._lock:
            try:
                self._switch(mode)
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                finally:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
            except sqlite3.OperationalError as exc:
                raise Transient(f"{self._what} busy or unavailable: {exc}") from exc

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Executed:
        """Run one statement on its own (autocommit) and return its rows and row count.

        The statement is stepped to its end while the lock is held. A cursor handed out
        unfinished (a ``PRAGMA wal_checkpoint`` has a row to read) would keep its statement in
        progress on the shared connection after the lock is released, and another thread's
        ``COMMIT`` then fails with "cannot commit transaction - SQL statements in progress".
        Raises ``Transient`` when the database is busy or unavailable.
        """
        with self._lock:
            try:
                self._switch(self._synchronous)
                cursor = self._db.execute(sql, params)
                try:
                    rows = cursor.fetchall()
                finally:
                    cursor.close()
                return Executed(rowcount=cursor.rowcount, rows=rows)
            except sqlite3.OperationalError as exc:
                raise Transient(f"{self._what} busy or unavailable: {exc}") from exc

    def _switch(self, mode: Synchronous) -> None:
        """Set the writing connection to ``mode`` unless it is already (expects the lock held):
        a run of unsynced transactions (a dispatcher's claims, the worker's notes) switches
        once, not twice each, and a synced one after them switches back first."""
        if self._mode != mode:
            self._db.execute(f"PRAGMA synchronous={mode}")
            self._mode = mode

    def rows(self, sql: str, params: tuple[Any, ...] | Mapping[str, Any] = ()) -> list[sqlite3.Row]:
        """Run a read-only query and return its rows, addressable by column name."""
        with self._read_lock:
            try:
                return list(self._reader.execute(sql, params).fetchall())
            except sqlite3.OperationalError as exc:
                raise Transient(f"{self._what} busy or unavailable: {exc}") from exc

    def rows_among(self, sql: str, keys: Collection[str]) -> list[sqlite3.Row]:
        """The rows of ``sql``, whose ``{marks}`` stands for an ``IN`` list, for ``keys``:
        one query per ``KEYS_PER_QUERY`` of them (none for no keys)."""
        wanted = sorted(set(keys))
        found: list[sqlite3.Row] = []
        for start in range(0, len(wanted), KEYS_PER_QUERY):
            chunk = tuple(wanted[start : start + KEYS_PER_QUERY])
            found += self.rows(sql.format(marks=",".join("?" * len(chunk))), chunk)
        return found


def open_database(source: str | Path | SqliteDatabase, *, schema: str, what: str) -> SqliteDatabase:
    """Open the file at ``source`` with ``schema``'s tables, or add them to a database that
    another adapter already opened, so adapters on one file share one connection and lock
    (separate connections would contend through SQLite's sleeping busy handler)."""
    if isinstance(source, SqliteDatabase):
        source.ensure_schema(schema)
        return source
    return SqliteDatabase(source, schema=schema, what=what)
