"""Run ``looprelay`` with a fault installed at an adapter boundary, for the fault suite.

``python -m tests.faults.boot up --data DIR ...`` is ``looprelay up ...`` after wrapping a few
adapter methods as the environment asks. Production code carries no fault hooks: the faults
live here, as monkeypatches of the adapter classes, in the child process only.

``LOOPRELAY_FAULT=<point>:<n>`` kills the process (``os._exit(137)``, like SIGKILL: no cleanup,
no flush) at the ``n``-th time (1-based, counted over all threads) the worker reaches
``<point>``:

- ``before_begin``: before ``SqliteStore.begin_delivery`` (the ledger's first write);
- ``after_dispatch_write``: after ``SqliteWorkItemStore.save_work_item`` committed a work item
  together with at least one dispatch;
- ``before_settle``: before ``SqliteStore.settle_delivery`` (the ledger's outcome write), with
  the handler's effects already written;
- ``before_response``: after ``settle_delivery`` returned, before the worker answers.

``LOOPRELAY_STORE_FAULT=<kind>:<every>:<budget>[:<latency>]`` makes every ``every``-th call of
the store adapters' methods (``SqliteStore`` and ``SqliteWorkItemStore``, the queue's
``SqliteQueue.enqueue_soon`` for ``queue``) fail, for the first ``budget`` calls, after sleeping
``latency`` seconds on every call. ``kind`` is ``locked`` (``sqlite3.OperationalError
"database is locked"``, translated by the adapter's own ``SqliteDatabase``, as the real error
would be: it is raised inside the connection), ``transient`` (``looprelay.errors.Transient``
from the adapter method) or ``queue`` (``Transient`` from the queue's enqueue of a
delivery; the worker's wakes are left alone, so the faults land on the webhook's tasks
whatever the timing).

``LOOPRELAY_QUEUE_FAULT=<write>:<every>:<budget>`` makes every ``every``-th transaction of the
embedded queue's bookkeeping write ``<write>`` (``claim``, ``finish`` or ``fail``:
``QUEUE_WRITES``), for the first ``budget`` of them, fail at its COMMIT with the error issue 24
saw: a write statement is left in progress on the queue's connection, so SQLite itself
refuses with "cannot commit transaction - SQL statements in progress".
"""

from __future__ import annotations

import functools
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from looprelay.adapters.sqlite.database import SqliteDatabase
from looprelay.adapters.sqlite.queue import SqliteQueue
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore
from looprelay.core.wake import parse_wake
from looprelay.errors import Transient
from looprelay.ports import Task

FAULT_ENV = "LOOPRELAY_FAULT"
STORE_FAULT_ENV = "LOOPRELAY_STORE_FAULT"
QUEUE_FAULT_ENV = "LOOPRELAY_QUEUE_FAULT"
QUEUE_WRITES = {
    "claim": "UPDATE tasks SET state = 'leased'",
    "finish": "UPDATE tasks SET state = 'done'",
    "fail": "UPDATE tasks SET state = ?, attempts = ?",
}
"""The embedded queue's bookkeeping writes, by how their SQL starts."""
KILLED_EXIT = 137
KILL_POINTS = ("before_begin", "after_dispatch_write", "before_settle", "before_response")
STORE_METHODS: dict[type, tuple[str, ...]] = {
    SqliteStore: ("begin_delivery", "settle_delivery", "get_delivery", "append_event"),
    SqliteWorkItemStore: ("get_work_item", "find_work_item_for_pull_request", "save_work_item"),
}


class _Counter:
    """Counts calls over all threads; ``hit()`` tells whether this call is the chosen one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def next(self) -> int:
        with self._lock:
            self.count += 1
            return self.count


def _die(point: str) -> None:
    sys.stderr.write(f"FAULT: killed at {point}\n")
    sys.stderr.flush()
    os._exit(KILLED_EXIT)


def _wrap(
    cls: type, name: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
    original = getattr(cls, name)
    setattr(cls, name, functools.wraps(original)(wrapper(original)))


def install_kill(point: str, occurrence: int) -> None:
    """Exit the process at the ``occurrence``-th time the worker reaches ``point``."""
    if point not in KILL_POINTS:
        raise SystemExit(f"{FAULT_ENV}: unknown point {point!r}; one of {KILL_POINTS}")
    counter = _Counter()

    def reached() -> None:
        if counter.next() == occurrence:
            _die(point)

    def before(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            reached()
            return original(*args, **kwargs)

        return call

    def after_settle(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            reached()
            return result

        return call

    def after_dispatch_write(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            saved = original(*args, **kwargs)
            if saved and kwargs.get("dispatches"):
                reached()
            return saved

        return call

    if point == "before_begin":
        _wrap(SqliteStore, "begin_delivery", before)
    elif point == "before_settle":
        _wrap(SqliteStore, "settle_delivery", before)
    elif point == "before_response":
        _wrap(SqliteStore, "settle_delivery", after_settle)
    else:
        _wrap(SqliteWorkItemStore, "save_work_item", after_dispatch_write)


def install_store_errors(kind: str, every: int, budget: int, latency: float) -> None:
    """Fail every ``every``-th store (or queue) call of the first ``budget`` with ``kind``."""
    counter = _Counter()

    def failing(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            number = counter.next()
            if latency:
                time.sleep(latency)
            if number <= budget and number % every == 0:
                if kind == "locked":
                    return _locked(self, original, *args, **kwargs)
                raise Transient(f"injected store fault on call {number}")
            return original(self, *args, **kwargs)

        return call

    def failing_soon(original: Callable[..., Any]) -> Callable[..., Any]:
        # The webhook enqueues without blocking: the fault arrives as the future's outcome.
        def call(self: Any, task: Task, *args: Any, **kwargs: Any) -> Any:
            if parse_wake(task.body) is not None:  # the worker's own wakes: not the webhook's
                return original(self, task, *args, **kwargs)
            number = counter.next()
            if number <= budget and number % every == 0:
                failed: Future[bool] = Future()
                failed.set_exception(Transient(f"injected queue fault on call {number}"))
                return failed
            return original(self, task, *args, **kwargs)

        return call

    if kind == "queue":
        _wrap(SqliteQueue, "enqueue_soon", failing_soon)
        return
    if kind == "locked":
        _lockable_databases()
    for cls, names in STORE_METHODS.items():
        for name in names:
            _wrap(cls, name, failing)


_LOCKED = threading.local()


class _LockableConnection:
    """A connection that raises "database is locked" on the next statement of a thread that
    asked for it; everything else goes to the real connection."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self._real = real

    def execute(self, *args: Any) -> Any:
        if getattr(_LOCKED, "armed", False):
            _LOCKED.armed = False
            raise sqlite3.OperationalError("database is locked")
        return self._real.execute(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _lockable_databases() -> None:
    original = SqliteDatabase.__init__

    def init(self: SqliteDatabase, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._db = _LockableConnection(self._db)  # type: ignore[assignment]

    SqliteDatabase.__init__ = init  # type: ignore[method-assign]


def _locked(adapter: Any, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``original`` with its first statement failing "database is locked" inside the
    connection, so the adapter's own translation (``SqliteDatabase``) turns it into
    ``Transient`` as it would the real error."""
    _LOCKED.armed = True
    try:
        return original(adapter, *args, **kwargs)
    finally:
        _LOCKED.armed = False


class _FailingCommits:
    """The queue's connection, whose COMMIT of a chosen bookkeeping write fails as issue 24's
    did: another statement, a write with rows left to read (the committer's checkpoint was
    one), is in progress on the connection, and SQLite refuses the COMMIT. Its owner finishes
    it right after, so the ROLLBACK that follows goes through."""

    def __init__(self, real: sqlite3.Connection, write: str, fails: Callable[[], bool]) -> None:
        self._real = real
        self._prefix = QUEUE_WRITES[write]
        self._write = write
        self._fails = fails
        self._chosen = False

    def execute(self, sql: str, *args: Any) -> Any:
        text = sql.strip()
        if text == "BEGIN IMMEDIATE":
            self._chosen = False
        elif text.startswith(self._prefix):
            self._chosen = self._fails()
        elif text == "COMMIT" and self._chosen:
            self._chosen = False
            sys.stderr.write(f"FAULT: a {self._write} commit fails\n")
            self._real.execute("CREATE TEMP TABLE IF NOT EXISTS fault (n)")
            in_progress = self._real.execute("INSERT INTO temp.fault VALUES (1), (2) RETURNING n")
            try:
                return self._real.execute(sql, *args)
            finally:
                in_progress.close()
        return self._real.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def install_queue_errors(write: str, every: int, budget: int) -> None:
    """Fail the COMMIT of every ``every``-th ``write`` of the first ``budget``."""
    if write not in QUEUE_WRITES:
        raise SystemExit(f"{QUEUE_FAULT_ENV}: unknown write {write!r}; one of {list(QUEUE_WRITES)}")
    counter = _Counter()

    def fails() -> bool:
        number = counter.next()
        return number <= budget and number % every == 0

    original_init = SqliteQueue.__init__

    def init(self: SqliteQueue, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        books = self._books
        books._db = _FailingCommits(books._db, write, fails)  # type: ignore[assignment]

    SqliteQueue.__init__ = init  # type: ignore[method-assign]


def install_from_environment() -> None:
    """Install what ``LOOPRELAY_FAULT``, ``LOOPRELAY_STORE_FAULT`` and
    ``LOOPRELAY_QUEUE_FAULT`` ask for."""
    fault = os.environ.get(FAULT_ENV, "")
    if fault:
        point, _, occurrence = fault.partition(":")
        install_kill(point, int(occurrence or "1"))
    store_fault = os.environ.get(STORE_FAULT_ENV, "")
    if store_fault:
        kind, every, budget, *rest = store_fault.split(":")
        install_store_errors(kind, int(every), int(budget), float(rest[0]) if rest else 0.0)
    queue_fault = os.environ.get(QUEUE_FAULT_ENV, "")
    if queue_fault:
        write, every, budget = queue_fault.split(":")
        install_queue_errors(write, int(every), int(budget))


if __name__ == "__main__":
    install_from_environment()
    from looprelay.cli import main

    sys.argv[0] = "looprelay"
    main()
