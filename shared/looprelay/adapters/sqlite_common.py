"""One SQLite database as every embedded adapter uses it: WAL, fully synced commits, a
busy timeout, and ``sqlite3.OperationalError`` translated to ``Transient`` once, here.

Writes that must be durable before an answer goes out (a webhook's enqueue) can share one
commit: :meth:`SqliteDatabase.submit_grouped` hands the statement to a committer thread, which
commits everything submitted since its last commit in one transaction and one fsync (group
commit), so durable acks are not capped at one per fsync, and resolves a future per statement.
:meth:`SqliteDatabase.execute_grouped` is the same write for a caller that can wait."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from looprelay.errors import Transient

log = logging.getLogger("looprelay.sqlite")

BUSY_TIMEOUT_MS = 5000
"""How long a write waits for another connection's lock before ``Transient``."""
CLOSE_TIMEOUT_SECONDS = 10.0
"""How long ``close()`` waits for the committer to commit what was submitted before it."""


def utc_text(moment: datetime) -> str:
    """Fixed-width UTC ISO text; it sorts in time order."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def parse_utc_text(text: str) -> datetime:
    """The moment ``utc_text`` wrote; raises ``ValueError`` for text that is not ISO 8601."""
    return datetime.fromisoformat(text)


Synchronous = Literal["FULL", "NORMAL"]


@dataclass
class _Grouped:
    """One statement waiting for a group commit, and the future its submitter holds."""

    sql: str
    params: tuple[Any, ...]
    future: Future[int] = field(default_factory=Future)


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

        ``synchronous="NORMAL"`` is for writes whose loss in a power cut is harmless (WAL mode
        keeps them safe from a process crash, and the next fully synced commit on the file
        makes them durable too). Raises ``Transient`` when the file cannot be opened.
        """
        self._what = what
        self._synchronous = synchronous
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        # Guards the three below; the committer waits on it for submissions.
        self._submitted = threading.Condition()
        self._pending: list[_Grouped] = []
        self._committer: threading.Thread | None = None
        self._closing = False
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
                self._db.executescript(schema)
            except sqlite3.Error as exc:
                raise Transient(f"cannot create tables in the {self._what}: {exc}") from exc

    def close(self) -> None:
        """Commit every grouped write already submitted, then close the connections.

        Waits up to ``CLOSE_TIMEOUT_SECONDS`` for the committer; a write it has not committed
        by then fails as ``Transient`` on the closed connection rather than hanging. A write
        submitted after this started fails as ``Transient`` at once. Closing again is harmless:
        adapters sharing the connection each close it.
        """
        with self._submitted:
            self._closing = True
            committer = self._committer
            self._submitted.notify_all()
        if committer is not None:
            committer.join(CLOSE_TIMEOUT_SECONDS)
            if committer.is_alive():
                log.warning(
                    "the %s committer did not finish within %.0fs; closing under it",
                    self._what,
                    CLOSE_TIMEOUT_SECONDS,
                )
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
        relaxed = not synced and self._synchronous == "FULL"
        with self._lock:
            try:
                if relaxed:
                    self._db.execute("PRAGMA synchronous=NORMAL")
                try:
                    self._db.execute("BEGIN IMMEDIATE")
                    try:
                        yield self._db
                        self._db.execute("COMMIT")
                    finally:
                        if self._db.in_transaction:
                            self._db.execute("ROLLBACK")
                finally:
                    if relaxed:
                        self._db.execute("PRAGMA synchronous=FULL")
            except sqlite3.OperationalError as exc:
                raise Transient(f"{self._what} busy or unavailable: {exc}") from exc

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        """Run one statement on its own (autocommit)."""
        with self._lock:
            try:
                return self._db.execute(sql, params)
            except sqlite3.OperationalError as exc:
                raise Transient(f"{self._what} busy or unavailable: {exc}") from exc

    def submit_grouped(self, sql: str, params: tuple[Any, ...] = ()) -> Future[int]:
        """Queue one write for the next group commit and return its future at once.

        The committer thread (started by the first grouped write) takes everything submitted
        since its last commit as one batch, so a lone writer waits for one commit and a crowd
        shares one fsync per batch. The future resolves with the statement's row count once
        the transaction carrying it is committed (synced as ``synchronous`` says). A
        statement's own error (``sqlite3.IntegrityError``, a constraint) reaches its future
        only and the rest of the batch still commits; a failed BEGIN or COMMIT reaches every
        future in the batch as ``Transient`` and nothing of the batch is kept. After
        :meth:`close` the future fails as ``Transient`` at once. Cancelling the future before
        its batch is taken withdraws the write.

        Done-callbacks run on the committer thread, after the database lock is released: a
        slow one delays every later commit, and one that waits for a grouped write
        (``execute_grouped``) waits forever for itself.
        """
        grouped = _Grouped(sql, params)
        with self._submitted:
            if not self._closing:
                self._pending.append(grouped)
                if self._committer is None:
                    self._committer = threading.Thread(
                        target=self._commit_loop, name="sqlite-committer", daemon=True
                    )
                    self._committer.start()
                self._submitted.notify()
                return grouped.future
        grouped.future.set_exception(
            Transient(f"the {self._what} is closed: a write submitted after close() is not made")
        )
        return grouped.future

    def execute_grouped(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        """Run one write in the next group commit and return its row count once committed.

        See :meth:`submit_grouped` for the batching and what is raised when.
        """
        return self.submit_grouped(sql, params).result()

    def _commit_loop(self) -> None:
        """Commit batch after batch until closed and drained; writes arriving while a batch
        commits form the next one."""
        while (batch := self._next_batch()) is not None:
            try:
                outcomes = self._commit_batch(batch)
            except Exception as exc:  # a bug here must not leave submitters waiting forever
                log.exception("group commit on the %s failed unexpectedly", self._what)
                outcomes = [
                    _failure(f"group commit on the {self._what} failed ({exc!r}); retry", exc)
                    for _ in batch
                ]
            # Outside the database lock: callbacks may read or write it themselves.
            for grouped, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    grouped.future.set_exception(outcome)
                else:
                    grouped.future.set_result(outcome)

    def _next_batch(self) -> list[_Grouped] | None:
        """Wait for submissions and take them all; None once closed with nothing left."""
        with self._submitted:
            self._submitted.wait_for(lambda: self._pending or self._closing)
            taken, self._pending = self._pending, []
        if not taken:
            return None
        # A future marked running can no longer be cancelled, so only the committer settles it.
        return [grouped for grouped in taken if grouped.future.set_running_or_notify_cancel()]

    def _commit_batch(self, batch: list[_Grouped]) -> list[int | Exception]:
        outcomes: list[int | Exception] = []
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for grouped in batch:
                        try:
                            cursor = self._db.execute(grouped.sql, grouped.params)
                            outcomes.append(cursor.rowcount)
                        except sqlite3.IntegrityError as exc:
                            outcomes.append(exc)
                    self._db.execute("COMMIT")
                finally:
                    # A failed COMMIT (or a bug mid-batch) leaves the transaction open.
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
            except sqlite3.Error as exc:
                return [_failure(f"{self._what} busy or unavailable: {exc}", exc) for _ in batch]
        return outcomes

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """Run a read-only query and return its rows, addressable by column name."""
        with self._read_lock:
            try:
                return list(self._reader.execute(sql, params).fetchall())
            except sqlite3.OperationalError as exc:
                raise Transient(f"{self._what} busy or unavailable: {exc}") from exc


def open_database(source: str | Path | SqliteDatabase, *, schema: str, what: str) -> SqliteDatabase:
    """Open the file at ``source`` with ``schema``'s tables, or add them to a database that
    another adapter already opened, so adapters on one file share one connection and lock
    (separate connections would contend through SQLite's sleeping busy handler)."""
    if isinstance(source, SqliteDatabase):
        source.ensure_schema(schema)
        return source
    return SqliteDatabase(source, schema=schema, what=what)


def _failure(message: str, cause: BaseException) -> Transient:
    """A ``Transient`` of its own for each future (raising one shared instance from several
    threads would tangle their tracebacks), chained as ``raise ... from cause`` would."""
    failure = Transient(message)
    failure.__cause__ = cause
    return failure
