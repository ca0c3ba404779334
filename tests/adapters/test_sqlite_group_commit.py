"""Group commit: concurrent durable writes share a transaction without sharing each other's fate."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

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
