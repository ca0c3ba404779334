"""SqliteWorkItemStore on a file an older version made: it opens, serves the heads, and
opens again."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore
from tests.dispatches import make_dispatch

OLD_DISPATCHES = """
CREATE TABLE dispatches (
    dispatch_id TEXT PRIMARY KEY,
    work_item TEXT NOT NULL,
    seq INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    lease_holder TEXT,
    lease_expires_at TEXT,
    doc TEXT NOT NULL
);
"""
"""The table before each dispatch's endpoint and repository had columns of their own."""


def test_a_file_without_the_endpoint_and_repository_columns_serves_its_heads(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    made = datetime(2026, 11, 1, tzinfo=UTC)
    mine = make_dispatch(repository="Octo/Demo", number=7, created_at=made)
    other = make_dispatch(repository="octo/other", number=8, created_at=made)
    with sqlite3.connect(path) as old:
        old.executescript(OLD_DISPATCHES)
        for dispatch in (mine, other):
            old.execute(
                "INSERT INTO dispatches VALUES (?,?,?,?,?,?,?,?)",
                (
                    dispatch.dispatch_id,
                    dispatch.work_item,
                    dispatch.seq,
                    "pending",
                    made.isoformat(),
                    None,
                    None,
                    dispatch.model_dump_json(),
                ),
            )
    old.close()

    store = SqliteWorkItemStore(path)
    try:
        heads = store.list_dispatch_heads(statuses=("pending",), repositories=["octo/demo"])
        everything = store.list_dispatch_heads(statuses=("pending",))
    finally:
        store.close()

    reopened = SqliteWorkItemStore(path)  # as the next `looprelay up` opens it
    try:
        assert reopened.list_dispatch_heads(statuses=("pending",), repositories=["octo/other"])
    finally:
        reopened.close()
    assert [head.dispatch_id for head in heads] == [mine.dispatch_id]
    assert heads[0].endpoint == mine.endpoint
    assert {head.dispatch_id for head in everything} == {mine.dispatch_id, other.dispatch_id}
