"""Group commit: concurrent durable writes share a transaction without sharing each other's fate.

The blocking form (``execute_grouped``) is driven from many threads at once; the non-blocking
form (``submit_grouped``) from one, with the moment of the commit pinned down by holding the
file's write lock from another connection, or by submitting from a callback the committer runs
between two commits.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from looprelay.adapters.sqlite_common import SqliteDatabase
from looprelay.errors import Transient

SCHEMA = """
CREATE TABLE IF NOT EXISTS parents (id INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS items (
    name TEXT PRIMARY KEY,
    parent INTEGER REFERENCES parents(id) DEFERRABLE INITIALLY DEFERRED
);
"""
WRITERS = 24
WAIT_SECONDS = 10.0
INSERT = "INSERT INTO items (name) VALUES (?)"

T = TypeVar("T")


@pytest.fixture
def database(tmp_path: Path) -> Iterator[SqliteDatabase]:
    db = SqliteDatabase(tmp_path / "group.db", schema=SCHEMA, what="test database")
    yield db
    db.close()


def _together(count: int, write: Callable[[int], int]) -> list[int | Exception]:
    """Run ``write(i)`` in ``count`` threads released at once; return results or errors."""
    results: list[int | Exception] = [-1] * count
    start = threading.Barrier(count)

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = write(index)
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@contextmanager
def _write_locked(path: Path) -> Iterator[None]:
    """Hold the file's write lock from another connection: nothing commits until it is let go
    (well inside the database's busy timeout, so the waiting commit then goes through)."""
    with closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            other.execute("ROLLBACK")


def _names_on_disk(path: Path) -> set[str]:
    """The names committed to the file, as a fresh connection sees them."""
    with closing(sqlite3.connect(path)) as other:
        return {name for (name,) in other.execute("SELECT name FROM items")}


def _between_commits(database: SqliteDatabase, path: Path, action: Callable[[], T]) -> T:
    """Run ``action`` on the committer between two commits, so the writes it submits form
    exactly the next batch (the committer takes every pending write once its callbacks ran)."""
    outcome: list[T] = []
    ran = threading.Event()

    def run(_: Future[int]) -> None:
        try:
            outcome.append(action())
        finally:
            ran.set()

    with _write_locked(path):  # the callback is in place before the earlier write commits
        database.submit_grouped("INSERT INTO parents DEFAULT VALUES").add_done_callback(run)
    assert ran.wait(WAIT_SECONDS), "the committer never ran the callback"
    [result] = outcome
    return result


def test_every_concurrent_writer_gets_its_own_row_count_and_every_row_is_on_disk(
    database: SqliteDatabase, tmp_path: Path
) -> None:
    results = _together(
        WRITERS,
        lambda i: database.execute_grouped(
            "INSERT INTO items (name) VALUES (?) ON CONFLICT(name) DO NOTHING", (f"n{i % 12}",)
        ),
    )

    # Twelve names, each written twice: exactly one writer of each name inserted it.
    assert sorted(r for r in results if isinstance(r, int)) == [0] * 12 + [1] * 12
    with sqlite3.connect(tmp_path / "group.db") as other:
        assert other.execute("SELECT COUNT(*) FROM items").fetchone() == (12,)


def test_a_statement_that_breaks_a_constraint_fails_alone(database: SqliteDatabase) -> None:
    database.execute_grouped("INSERT INTO items (name) VALUES ('taken')")

    results = _together(
        WRITERS,
        lambda i: database.execute_grouped(
            "INSERT INTO items (name) VALUES (?)", ("taken" if i == 0 else f"free-{i}",)
        ),
    )

    assert isinstance(results[0], sqlite3.IntegrityError)
    assert results[1:] == [1] * (WRITERS - 1)
    assert len(database.rows("SELECT name FROM items")) == WRITERS


def test_when_the_commit_fails_no_writer_in_the_batch_is_told_it_succeeded(
    database: SqliteDatabase,
) -> None:
    database.execute("PRAGMA foreign_keys=ON")
    # A deferred foreign key is checked at COMMIT: one bad row fails the whole batch.
    results = _together(
        WRITERS,
        lambda i: database.execute_grouped(
            "INSERT INTO items (name, parent) VALUES (?, ?)", (f"n{i}", 99 if i == 3 else None)
        ),
    )

    committed = [r for r in results if r == 1]
    failed = [r for r in results if isinstance(r, Transient)]
    assert len(committed) + len(failed) == WRITERS
    assert 3 in [i for i, r in enumerate(results) if isinstance(r, Transient)]
    # Whatever was reported committed is on disk, and nothing else is.
    assert len(database.rows("SELECT name FROM items")) == len(committed)


class TestSubmitGrouped:
    def test_submitting_does_not_wait_for_the_commit_and_each_future_gets_its_own_row_count(
        self, database: SqliteDatabase, tmp_path: Path
    ) -> None:
        path = tmp_path / "group.db"
        with _write_locked(path):
            futures = [
                database.submit_grouped(
                    "INSERT INTO items (name) VALUES (?) ON CONFLICT(name) DO NOTHING",
                    (f"n{i % 12}",),
                )
                for i in range(WRITERS)
            ]
            assert not any(future.done() for future in futures)
            assert _names_on_disk(path) == set()

        # Writes commit in the order submitted: the first of each name inserted it.
        assert [f.result(WAIT_SECONDS) for f in futures] == [1] * 12 + [0] * 12
        assert _names_on_disk(path) == {f"n{i}" for i in range(12)}

    def test_a_constraint_error_fails_only_its_own_future(
        self, database: SqliteDatabase, tmp_path: Path
    ) -> None:
        path = tmp_path / "group.db"
        database.execute_grouped(INSERT, ("taken",))

        futures = _between_commits(
            database,
            path,
            lambda: [
                database.submit_grouped(INSERT, ("taken" if i == 5 else f"free-{i}",))
                for i in range(WRITERS)
            ],
        )

        assert isinstance(futures[5].exception(WAIT_SECONDS), sqlite3.IntegrityError)
        assert [f.result(WAIT_SECONDS) for i, f in enumerate(futures) if i != 5] == [1] * 23
        assert _names_on_disk(path) == {"taken"} | {f"free-{i}" for i in range(WRITERS) if i != 5}

    def test_a_failed_commit_fails_every_future_in_the_batch_and_keeps_none_of_it(
        self, database: SqliteDatabase, tmp_path: Path
    ) -> None:
        path = tmp_path / "group.db"
        database.execute("PRAGMA foreign_keys=ON")

        # A deferred foreign key is checked at COMMIT: one bad row fails the whole batch.
        futures = _between_commits(
            database,
            path,
            lambda: [
                database.submit_grouped(
                    "INSERT INTO items (name, parent) VALUES (?, ?)",
                    (f"n{i}", 99 if i == 3 else None),
                )
                for i in range(WRITERS)
            ],
        )

        errors = [f.exception(WAIT_SECONDS) for f in futures]
        assert all(isinstance(error, Transient) for error in errors), errors
        assert _names_on_disk(path) == set()
        # Rolled back, not left open: the next batch commits.
        assert database.execute_grouped(INSERT, ("after",)) == 1

    def test_a_bug_while_committing_fails_the_batch_as_transient_and_commits_go_on(
        self, database: SqliteDatabase, tmp_path: Path
    ) -> None:
        path = tmp_path / "group.db"

        class Unbindable:
            """A parameter whose adaptation raises what no sqlite3 handler expects."""

            def __conform__(self, protocol: object) -> object:
                raise RuntimeError("a bug while binding")

        futures = _between_commits(
            database,
            path,
            lambda: [
                database.submit_grouped(INSERT, ("good",)),
                database.submit_grouped(INSERT, (Unbindable(),)),
            ],
        )

        assert [type(f.exception(WAIT_SECONDS)) for f in futures] == [Transient, Transient]
        assert database.execute_grouped(INSERT, ("after",)) == 1
        assert _names_on_disk(path) == {"after"}

    def test_a_callback_runs_once_its_write_is_on_disk(
        self, database: SqliteDatabase, tmp_path: Path
    ) -> None:
        path = tmp_path / "group.db"
        seen: list[set[str]] = []
        ran = threading.Event()

        def look(_: Future[int]) -> None:
            seen.append(_names_on_disk(path))
            ran.set()

        with _write_locked(path):  # the callback is in place before the write commits
            database.submit_grouped(INSERT, ("called-back",)).add_done_callback(look)

        assert ran.wait(WAIT_SECONDS)
        assert seen == [{"called-back"}]

    def test_a_callback_that_raises_is_logged_and_later_writes_still_commit(
        self, database: SqliteDatabase, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        def broken(_: Future[int]) -> None:
            raise RuntimeError("a caller's bug")

        with _write_locked(tmp_path / "group.db"):
            first = database.submit_grouped(INSERT, ("first",))
            first.add_done_callback(broken)

        assert first.result(WAIT_SECONDS) == 1
        assert database.execute_grouped(INSERT, ("second",)) == 1
        # concurrent.futures logs a callback's exception and goes on.
        logged = [str(r.exc_info[1]) for r in caplog.records if r.exc_info]
        assert logged == ["a caller's bug"]

    def test_a_write_cancelled_before_its_batch_is_taken_is_not_made(
        self, database: SqliteDatabase, tmp_path: Path
    ) -> None:
        path = tmp_path / "group.db"

        def submit_and_cancel() -> tuple[bool, Future[int]]:
            withdrawn = database.submit_grouped(INSERT, ("withdrawn",))
            return withdrawn.cancel(), database.submit_grouped(INSERT, ("kept",))

        cancelled, kept = _between_commits(database, path, submit_and_cancel)

        assert cancelled
        assert kept.result(WAIT_SECONDS) == 1
        assert _names_on_disk(path) == {"kept"}


class TestClose:
    def test_close_commits_every_write_submitted_before_it(
        self, database: SqliteDatabase, tmp_path: Path
    ) -> None:
        path = tmp_path / "group.db"

        def submit_then_close() -> tuple[list[Future[int]], threading.Thread]:
            futures = [database.submit_grouped(INSERT, (f"n{i}",)) for i in range(WRITERS)]
            closer = threading.Thread(target=database.close)
            closer.start()
            closer.join(0.3)  # close() has begun while the writes wait for this callback
            return futures, closer

        futures, closer = _between_commits(database, path, submit_then_close)
        closer.join(WAIT_SECONDS)

        assert not closer.is_alive()
        assert [f.result(0) for f in futures] == [1] * WRITERS
        assert _names_on_disk(path) == {f"n{i}" for i in range(WRITERS)}

    def test_a_write_submitted_after_close_fails_at_once_as_transient(
        self, database: SqliteDatabase, tmp_path: Path
    ) -> None:
        database.execute_grouped(INSERT, ("before",))
        database.close()
        started = time.monotonic()

        assert isinstance(database.submit_grouped(INSERT, ("late",)).exception(1), Transient)
        with pytest.raises(Transient, match="closed"):
            database.execute_grouped(INSERT, ("later",))
        assert time.monotonic() - started < 1
        database.close()  # again, as adapters sharing the connection each do: harmless
        assert _names_on_disk(tmp_path / "group.db") == {"before"}
