"""The embedded queue of ``looprelay up``: durable in SQLite, dispatched by threads.

It behaves like Cloud Tasks towards the worker: a POST per task with the ``X-CloudTasks-*``
headers, retries with the same backoff curve, dedup by task name, and a dead letter after the
last attempt. A task leased when the process died is dispatched again on restart; the worker's
delivery ledger turns that second delivery into a no-op.

Like Cloud Tasks it keeps no order: the worker's inbox hands the deliveries of an issue off
in order whichever queue brings them (``service.inbox``), so ``looprelay up`` and the cloud
share that one code path.
"""

from __future__ import annotations

import http.client
import itertools
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from looprelay.adapters.sqlite.database import SqliteDatabase
from looprelay.adapters.sqlite.enqueue_committer import Enqueue, EnqueueCommitter
from looprelay.adapters.sqlite.queue_sql import (
    ADDED_COLUMNS,
    CLAIM,
    LEASE_MARGIN_SECONDS,
    RELEASE_EXPIRED,
    SCHEMA,
)
from looprelay.adapters.sqlite.worker_connection import WorkerConnection
from looprelay.config.model import EmbeddedQueueConfig, RetryConfig
from looprelay.core.backoff import backoff_seconds
from looprelay.errors import Permanent, Transient
from looprelay.ports import MAX_TASK_BYTES, Task

log = logging.getLogger("looprelay.queue")

_TASK_NAME = re.compile(r"^[A-Za-z0-9_-]{1,500}$")
_BOOKS_RETRY_SECONDS = (0.01, 0.05, 0.2, 1.0)
"""Waits between tries of a delivery's outcome write that failed; the last one repeats until
the write lands or the lease expires."""
# Queues a new name, or takes an old one back only once its task is done and its dedup
# window over; a row count of 0 means the name is taken.
_IDLE_WAIT_SECONDS = 1.0
_MAX_YIELD_SECONDS = 0.5
"""Longest a dispatcher defers a task to more urgent work; bounds how slowly a backlog
drains while webhooks keep arriving (4 dispatchers: 8 tasks/s at the very least)."""


@dataclass(frozen=True)
class QueuedTask:
    """A task as the embedded queue holds it, for listings."""

    name: str
    state: str
    attempts: int
    eta: float
    created_at: float
    last_status: int | None
    last_error: str | None
    body: bytes


class SqliteQueue:
    """A durable queue in one SQLite file that POSTs each task to the worker."""

    def __init__(
        self,
        path: str | Path,
        *,
        retry: RetryConfig,
        settings: EmbeddedQueueConfig,
        queue_name: str = "looprelay",
        now: Callable[[], float] = time.time,
    ) -> None:
        """Open the queue at ``path`` for enqueueing and listing; :meth:`start` dispatches.

        Opening changes no task, so the CLI may open the file while ``looprelay up`` runs.
        Enqueues are committed by a thread of the queue (``enqueue_committer``) started with
        the first one. Raises ``Transient`` when the file cannot be opened.
        """
        self._worker_url = ""
        self._auth_token = ""
        self._retry = retry
        self._settings = settings
        self._queue_name = queue_name
        self._now = now
        self._wake = threading.Condition()
        self._yield_to: Callable[[float], None] | None = None
        self._arrivals = 0  # counts enqueues, so a dispatcher never sleeps through one
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        # Enqueues are acked to GitHub, so they are fully synced (one fsync per batch). The
        # dispatch bookkeeping is not: a lost "leased" or "done" only sends a task again,
        # which the worker's ledger turns into a no-op, and it is written after the worker's
        # own synced commit. Both share one connection, so they wait on one lock.
        self._books = SqliteDatabase(path, schema=SCHEMA, what="embedded queue")
        self._books.add_columns("tasks", ADDED_COLUMNS)
        self._committer = EnqueueCommitter(self._books)

    # -- the Queue port -------------------------------------------------------------------

    def enqueue(self, task: Task) -> bool:
        """See ``Queue.enqueue``; the task is on disk before this returns True."""
        return self.enqueue_soon(task).result()

    def enqueue_soon(self, task: Task) -> Future[bool]:
        """Start enqueueing ``task`` and return at once: the non-blocking ``enqueue``.

        The webhook of ``looprelay up`` awaits it, so its event loop never waits for an fsync:
        the ack goes out when the future resolves. The future resolves once the task is on disk:
        True when it was queued (a dispatcher is woken before any callback of the caller
        runs), False when the name is taken (still queued, or done within the dedup window).
        Its exception is ``Permanent`` for a task that can never be queued (checked before
        anything is written) and ``Transient`` when the database failed or the queue is closed.
        """
        try:
            _validate(task)
        except Permanent as exc:
            refused: Future[bool] = Future()
            refused.set_exception(exc)
            return refused
        now = self._now()
        window_start = now - self._settings.dedup_window_seconds
        due = now if task.not_before is None else max(now, task.not_before.timestamp())
        item = Enqueue(now, window_start, task.name, task.body, due)
        landed = self._committer.submit(item)
        landed.add_done_callback(self._landed)  # first, so dispatchers hear before callers
        return landed

    def _landed(self, landed: Future[bool]) -> None:
        if not landed.exception() and landed.result():
            self._arrived()

    # -- lifecycle --------------------------------------------------------------------------

    def start(
        self,
        *,
        worker_url: str,
        auth_token: str,
        yield_to: Callable[[float], None] | None = None,
    ) -> None:
        """Start the dispatcher threads, POSTing to ``worker_url`` with ``auth_token``.

        ``yield_to(seconds)``, when given, is called before each task and may block up to
        ``seconds`` while more urgent work runs in this process (``looprelay up`` lets webhook
        acks go first); a task never waits longer than that for it.

        Tasks left leased by a dead process become pending first; only the one dispatching
        process (``looprelay up`` holds the data directory's lock) may do that, since opening
        the file elsewhere would resend tasks still in flight.
        """
        self._worker_url = worker_url
        self._auth_token = auth_token
        self._yield_to = yield_to
        self._write(
            "UPDATE tasks SET state = 'pending', lease_expires = NULL WHERE state = 'leased'"
        )
        self._committer.start()
        self._stopping.clear()
        for index in range(self._settings.concurrency):
            thread = threading.Thread(
                target=self._dispatch_loop, name=f"queue-dispatch-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        log.info(
            "embedded queue dispatching to %s",
            self._worker_url,
            extra={"fields": {"concurrency": self._settings.concurrency}},
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop dispatching; a task in flight finishes or stays leased for the next start."""
        self._stopping.set()
        with self._wake:
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(timeout)
        self._threads.clear()

    def close(self) -> None:
        """Stop dispatching, commit what was submitted, close the database."""
        self.stop()
        self._committer.close()
        self._books.close()

    # -- operator views ---------------------------------------------------------------------

    def list_tasks(self, state: str | None = None, limit: int = 1000) -> list[QueuedTask]:
        """Return tasks, oldest first, optionally in one ``state``."""
        sql = "SELECT name, state, attempts, eta, created_at, last_status, last_error, body"
        sql += " FROM tasks" + (" WHERE state = ?" if state else "")
        sql += " ORDER BY created_at, name LIMIT ?"
        params = (state, limit) if state else (limit,)
        return [QueuedTask(*row) for row in self._books.rows(sql, params)]

    def retry_dead(self, name: str) -> bool:
        """Put a dead task back in line for another full set of attempts."""
        changed = self._write(
            "UPDATE tasks SET state = 'pending', attempts = 0, executions = 0, eta = ?"
            " WHERE name = ? AND state = 'dead'",
            (self._now(), name),
        )
        self._arrived()
        return bool(changed)

    def purge_finished(self) -> int:
        """Forget done tasks whose dedup window has passed; return how many."""
        cutoff = self._now() - self._settings.dedup_window_seconds
        return self._write("DELETE FROM tasks WHERE state = 'done' AND finished_at < ?", (cutoff,))

    def _write(self, sql: str, params: tuple[object, ...] = ()) -> int:
        """Run one bookkeeping write, unsynced (see ``__init__``); return its row count."""
        with self._books.transaction(synced=False) as db:
            return db.execute(sql, params).rowcount

    # -- dispatching ------------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        worker = WorkerConnection(self._worker_url, self._settings.dispatch_deadline_seconds)
        while not self._stopping.is_set():
            try:
                if self._yield_to is not None:
                    self._yield_to(_MAX_YIELD_SECONDS)
                seen = self._arrivals
                claimed = self._claim()
                if claimed is None:
                    # Nothing due: sleep until the next due task or an arrival since the look
                    # (the counter catches one that came between the look and the wait).
                    timeout = self._seconds_until_due()
                    self._wait_for_arrival(seen, timeout)
                    continue
                self._deliver(worker, claimed)
            except (sqlite3.Error, Transient):
                # A busy or failing database must not kill the dispatcher. A claim that failed
                # was rolled back; a task claimed before the failure keeps its lease, which
                # expires (``LEASE_MARGIN_SECONDS``) so that any dispatcher takes it again.
                log.exception("embedded queue database error; dispatcher pauses and goes on")
                self._stopping.wait(_IDLE_WAIT_SECONDS)
        worker.close()

    def _wait_for_arrival(self, seen: int, timeout: float) -> None:
        with self._wake:
            self._wake.wait_for(lambda: self._arrivals != seen or self._stopping.is_set(), timeout)

    def _arrived(self) -> None:
        with self._wake:
            self._arrivals += 1
            self._wake.notify()

    def _claim(self) -> _Claimed | None:
        now = self._now()
        expires = now + 2 * self._settings.dispatch_deadline_seconds + LEASE_MARGIN_SECONDS
        with self._books.transaction(synced=False) as db:
            db.execute(RELEASE_EXPIRED, {"now": now})
            rows = db.execute(CLAIM, {"now": now, "expires": expires}).fetchall()
        return _Claimed(*rows[0]) if rows else None

    def _seconds_until_due(self) -> float:
        """How long until a task may become claimable without an arrival (which wakes a
        dispatcher): the next retry falling due, or the next lease running out."""
        now = self._now()
        [row] = self._books.rows(
            "SELECT MIN(at) FROM (SELECT eta AS at FROM tasks WHERE state = 'pending'"
            " AND eta > :now UNION ALL"
            " SELECT lease_expires FROM tasks WHERE state = 'leased' AND lease_expires > :now)",
            {"now": now},
        )
        due: float | None = row[0]
        if due is None:
            return _IDLE_WAIT_SECONDS
        return max(0.0, min(_IDLE_WAIT_SECONDS, due - now))

    def _deliver(self, worker: WorkerConnection, claimed: _Claimed) -> None:
        name, body, attempts, executions, eta = (
            claimed.name,
            claimed.body,
            claimed.attempts,
            claimed.executions,
            claimed.eta,
        )
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {self._auth_token}",
            "X-CloudTasks-QueueName": self._queue_name,
            "X-CloudTasks-TaskName": name,
            "X-CloudTasks-TaskRetryCount": str(attempts),
            "X-CloudTasks-TaskExecutionCount": str(executions),
            "X-CloudTasks-TaskETA": f"{eta:.6f}",
        }
        status: int | None = None
        retry_after: float | None = None
        error = ""
        try:
            status, retry_header, text = worker.post(body, headers)
            retry_after = _retry_after(retry_header)
            error = "" if status < 300 else text[:500]
        except (OSError, http.client.HTTPException) as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        if status is not None and 200 <= status < 300:
            self._finish(claimed, status)
        else:
            self._fail(
                claimed,
                attempts=attempts + 1,
                executions=executions,
                status=status,
                error=error,
                retry_after=retry_after,
            )

    def _finish(self, claimed: _Claimed, status: int) -> None:
        self._book(
            claimed,
            "UPDATE tasks SET state = 'done', finished_at = ?, last_status = ?,"
            " attempts = attempts + 1, lease_expires = NULL"
            " WHERE name = ? AND state = 'leased' AND lease_expires = ?",
            (self._now(), status, claimed.name, claimed.lease_expires),
        )
        # No dispatcher is woken: this one claims next itself (``_dispatch_loop``); waking
        # another only added a claim that found nothing, a write transaction per task.

    def _fail(
        self,
        claimed: _Claimed,
        *,
        attempts: int,
        executions: int,
        status: int | None,
        error: str,
        retry_after: float | None,
    ) -> None:
        # Cloud Tasks counts an execution only when the handler answered, and not for 5xx.
        executions += 1 if status is not None and status < 500 else 0
        dead = attempts >= self._retry.max_attempts
        wait = backoff_seconds(
            attempts,
            min_backoff=self._retry.min_backoff_seconds,
            max_backoff=self._retry.max_backoff_seconds,
            max_doublings=self._retry.max_doublings,
        )
        wait = max(wait, retry_after or 0.0)
        name = claimed.name
        self._book(
            claimed,
            "UPDATE tasks SET state = ?, attempts = ?, executions = ?, eta = ?,"
            " last_status = ?, last_error = ?, finished_at = ?, lease_expires = NULL"
            " WHERE name = ? AND state = 'leased' AND lease_expires = ?",
            (
                "dead" if dead else "pending",
                attempts,
                executions,
                self._now() + wait,
                status,
                error,
                self._now() if dead else None,
                name,
                claimed.lease_expires,
            ),
        )
        level = logging.ERROR if dead else logging.WARNING
        log.log(
            level,
            "task %s failed (attempt %d, status %s)%s",
            name,
            attempts,
            status,
            " and is now a dead letter" if dead else f"; retrying in {wait:.1f}s",
            extra={"task": name, "fields": {"error": error}},
        )

    def _book(self, claimed: _Claimed, sql: str, params: tuple[object, ...]) -> None:
        """Write a delivery's outcome while its lease lasts.

        ``sql`` changes the row only under this claim's lease (``lease_expires`` as the
        claim wrote it), so a dispatcher whose lease expired and was taken again writes
        nothing.

        A write that fails (a busy or failing database: ``Transient`` or ``sqlite3.Error``) is
        tried again after each of ``_BOOKS_RETRY_SECONDS``, then every second, so the group
        is held only while the database fails. Once the lease has expired, or the queue
        stops, the task is left to the lease: any dispatcher takes it again (the worker's
        ledger makes the repeat a no-op). Raises nothing.
        """
        for attempt in itertools.count():
            try:
                self._write(sql, params)
                return
            except (sqlite3.Error, Transient) as exc:
                if self._stopping.is_set() or self._now() >= claimed.lease_expires:
                    log.error(
                        "could not record the outcome of task %s (%s); it is sent again"
                        " when its lease expires",
                        claimed.name,
                        exc,
                        extra={"task": claimed.name},
                    )
                    return
                wait = _BOOKS_RETRY_SECONDS[min(attempt, len(_BOOKS_RETRY_SECONDS) - 1)]
                log.warning(
                    "could not record the outcome of task %s (%s); trying again in %.2fs",
                    claimed.name,
                    exc,
                    wait,
                    extra={"task": claimed.name},
                )
                self._stopping.wait(wait)


@dataclass(frozen=True, slots=True)
class _Claimed:
    """A task a dispatcher holds, and when its lease expires."""

    name: str
    body: bytes
    attempts: int
    executions: int
    eta: float
    lease_expires: float


def _validate(task: Task) -> None:
    if not _TASK_NAME.match(task.name):
        raise Permanent(f"task name {task.name[:60]!r} must match [A-Za-z0-9_-]{{1,500}}")
    if len(task.body) > MAX_TASK_BYTES:
        raise Permanent(f"task body of {len(task.body)} bytes exceeds {MAX_TASK_BYTES} bytes")


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
