"""SqliteDatabase: synced and unsynced writes on one real SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from looprelay.adapters.sqlite.database import SqliteDatabase

FULL, NORMAL = 2, 1
SCHEMA = "CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT NOT NULL);"


def _setting(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA synchronous").fetchone()[0])


class TestSynced:
    def test_each_write_runs_at_the_setting_it_asked_for_whatever_ran_before(
        self, tmp_path: Path
    ) -> None:
        database = SqliteDatabase(tmp_path / "s.db", schema=SCHEMA, what="test store")
        seen = []
        for synced in (False, False, True, True, False, True):
            with database.transaction(synced=synced) as db:
                seen.append(_setting(db))
                db.execute("INSERT INTO t (v) VALUES (?)", ("x",))
        assert seen == [NORMAL, NORMAL, FULL, FULL, NORMAL, FULL]
        with database.transaction(synced=False):
            pass
        assert database.execute("PRAGMA synchronous").rows[0][0] == FULL  # autocommit
        database.close()

    def test_a_run_of_unsynced_writes_switches_the_setting_once(self, tmp_path: Path) -> None:
        database = SqliteDatabase(tmp_path / "s.db", schema=SCHEMA, what="test store")
        statements: list[str] = []
        with database.transaction() as db:
            db.set_trace_callback(statements.append)
        for _ in range(3):
            with database.transaction(synced=False) as db:
                db.execute("INSERT INTO t (v) VALUES (?)", ("x",))
        with database.transaction() as db:
            db.execute("INSERT INTO t (v) VALUES (?)", ("y",))
        switches = [s for s in statements if s.startswith("PRAGMA synchronous")]
        assert switches == ["PRAGMA synchronous=NORMAL", "PRAGMA synchronous=FULL"]
        database.close()

    def test_a_database_opened_normal_never_switches(self, tmp_path: Path) -> None:
        database = SqliteDatabase(
            tmp_path / "s.db", schema=SCHEMA, what="test store", synchronous="NORMAL"
        )
        for synced in (True, False):
            with database.transaction(synced=synced) as db:
                assert _setting(db) == NORMAL
        database.close()


class TestSharedConnection:
    def test_a_statement_with_rows_run_on_its_own_leaves_nothing_in_progress_for_a_commit(
        self, tmp_path: Path
    ) -> None:
        # The embedded queue's committer checkpoints with ``execute`` while a dispatcher
        # commits its bookkeeping on the same connection (issue 24: "cannot commit
        # transaction - SQL statements in progress" left a task leased for good).
        database = SqliteDatabase(tmp_path / "s.db", schema=SCHEMA, what="test store")
        checkpoint = database.execute("PRAGMA wal_checkpoint(PASSIVE)")
        with database.transaction(synced=False) as db:
            db.execute("INSERT INTO t (v) VALUES (?)", ("x",))
        assert len(checkpoint.rows) == 1
        assert database.execute("INSERT INTO t (v) VALUES (?)", ("y",)).rowcount == 1
        assert database.rows("SELECT COUNT(*) FROM t")[0][0] == 2
        database.close()
