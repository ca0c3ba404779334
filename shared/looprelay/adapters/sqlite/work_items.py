"""Work items and their dispatches in the embedded SQLite database, behind ``WorkItemStore``.

Each record is kept whole as its pydantic JSON in ``doc``; the columns beside it are copies of
the fields the queries filter and order on, written in the same statement so they never drift.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from looprelay.adapters.sqlite.database import SqliteDatabase, open_database, utc_text
from looprelay.core.model import DISPATCH_EXPIRED as EXPIRED
from looprelay.core.model import DispatchRecord, WorkItemRecord
from looprelay.ports import SessionSlot

_SCHEMA = """
CREATE TABLE IF NOT EXISTS work_items (
    ref TEXT PRIMARY KEY, version INTEGER NOT NULL, doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS work_item_pull_requests (
    pr_ref TEXT NOT NULL, work_item TEXT NOT NULL, PRIMARY KEY (pr_ref, work_item)
);
CREATE INDEX IF NOT EXISTS work_item_pull_requests_by_item
    ON work_item_pull_requests (work_item);
CREATE TABLE IF NOT EXISTS dispatches (
    dispatch_id TEXT PRIMARY KEY,
    work_item TEXT NOT NULL,
    seq INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    lease_holder TEXT,
    lease_expires_at TEXT,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS dispatches_by_status ON dispatches (status, created_at, seq);
CREATE INDEX IF NOT EXISTS dispatches_by_work_item ON dispatches (work_item, created_at, seq);
CREATE TABLE IF NOT EXISTS runner_sessions (
    runner_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    work_item TEXT NOT NULL,
    since TEXT NOT NULL,
    PRIMARY KEY (runner_id, endpoint)
);
"""
_ENDPOINT_COLUMN = {"endpoint": "TEXT NOT NULL DEFAULT ''"}
"""A file made before each endpoint had its own line lacks it; opening fills it from the doc."""
_REPOSITORY_COLUMN = {
    "repository": "TEXT GENERATED ALWAYS AS (lower(json_extract(doc, '$.repository'))) VIRTUAL"
}
"""The dispatch's repository in lower case, for the heads' index (computed, never written)."""
_HEADS_INDEX = (
    "CREATE INDEX IF NOT EXISTS dispatches_heads ON dispatches"
    " (status, repository, work_item, endpoint, seq, created_at, dispatch_id)"
)
"""Covers the heads' grouping (``list_dispatch_heads``): a backlog of thousands is read from
the index alone, no document parsed, until the heads themselves."""
_ENDPOINT_FILL = (
    "UPDATE dispatches SET endpoint = json_extract(doc, '$.endpoint') WHERE endpoint = ''"
)

_FINISHED_STATUSES = ("pending", "succeeded", "failed")
"""What a lease holder may leave a dispatch as; ``pending`` offers it to the next runner."""

_HELD_BY = "status = 'leased' AND lease_holder = ?"
"""Only the runner holding the lease now may change it; a lapsed and retaken lease is not its."""


PARSED_WORK_ITEMS = 4096
"""Parsed work-item versions kept in memory (``get_work_items``): far above the heads a poll
reads."""


class _Parsed:
    """The latest parsed work-item versions, least recently used dropped first; threadsafe."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._records: OrderedDict[tuple[str, int], WorkItemRecord] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> WorkItemRecord | None:
        with self._lock:
            record = self._records.get(key)
            if record is not None:
                self._records.move_to_end(key)
            return record

    def put(self, key: tuple[str, int], record: WorkItemRecord) -> WorkItemRecord:
        with self._lock:
            self._records[key] = record
            self._records.move_to_end(key)
            while len(self._records) > self._size:
                self._records.popitem(last=False)
        return record


def _opt_utc_text(moment: datetime | None) -> str | None:
    return None if moment is None else utc_text(moment)


class SqliteWorkItemStore:
    """Work items and dispatches in one SQLite database; safe across threads and processes."""

    def __init__(self, path: str | Path | SqliteDatabase) -> None:
        """Open (creating the tables if needed) the database at ``path``.

        Raises ``Transient`` when the file cannot be opened.
        """
        self._db = open_database(path, schema=_SCHEMA, what="SQLite work-item store")
        self._parsed = _Parsed(PARSED_WORK_ITEMS)
        self._db.add_columns("dispatches", {**_ENDPOINT_COLUMN, **_REPOSITORY_COLUMN})
        self._db.execute(_ENDPOINT_FILL)
        self._db.execute(_HEADS_INDEX)

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    def get_work_item(self, ref: str) -> WorkItemRecord | None:
        """See ``WorkItemStore.get_work_item``."""
        rows = self._db.rows("SELECT doc FROM work_items WHERE ref = ?", (ref,))
        return WorkItemRecord.model_validate_json(rows[0]["doc"]) if rows else None

    def get_work_items(self, refs: Collection[str]) -> dict[str, WorkItemRecord]:
        """See ``WorkItemStore.get_work_items``.

        Every poll of a backlog reads the work items of its heads (``service.lease_desk``):
        a version's document never changes, so each is parsed once (``_parsed``) and only
        the versions are read again."""
        versions = self._db.rows_among(
            "SELECT ref, version FROM work_items WHERE ref IN ({marks})", refs
        )
        found = {row["ref"]: self._parsed.get((row["ref"], row["version"])) for row in versions}
        missing = [ref for ref, record in found.items() if record is None]
        rows = self._db.rows_among(
            "SELECT ref, doc FROM work_items WHERE ref IN ({marks})", missing
        )
        for row in rows:
            record = WorkItemRecord.model_validate_json(row["doc"])
            found[row["ref"]] = self._parsed.put((record.ref, record.version), record)
        return {ref: record for ref, record in found.items() if record is not None}

    def find_work_item_for_pull_request(self, pr_ref: str) -> WorkItemRecord | None:
        """See ``WorkItemStore.find_work_item_for_pull_request``."""
        rows = self._db.rows(
            "SELECT w.doc FROM work_item_pull_requests p JOIN work_items w ON w.ref = p.work_item"
            " WHERE p.pr_ref = ? ORDER BY p.work_item LIMIT 1",
            (pr_ref,),
        )
        return WorkItemRecord.model_validate_json(rows[0]["doc"]) if rows else None

    def list_work_items(self, *, limit: int = 100) -> list[WorkItemRecord]:
        """See ``WorkItemStore.list_work_items`` (a scan: a local store holds few)."""
        rows = self._db.rows(
            "SELECT doc FROM work_items"
            " ORDER BY json_extract(doc, '$.updated_at') DESC, ref LIMIT ?",
            (limit,),
        )
        return [WorkItemRecord.model_validate_json(row["doc"]) for row in rows]

    def save_work_item(
        self,
        record: WorkItemRecord,
        *,
        expected_version: int,
        dispatches: Sequence[DispatchRecord] = (),
    ) -> bool:
        """See ``WorkItemStore.save_work_item``."""
        stored = record.model_copy(update={"version": expected_version + 1})
        # Unsynced: before anything acts on it, a synced commit stands behind it (the lease
        # a runner takes, the delivery's settle), and in WAL mode that makes it durable.
        with self._db.transaction(synced=False) as db:
            current = db.execute(
                "SELECT version FROM work_items WHERE ref = ?", (stored.ref,)
            ).fetchone()
            if (current[0] if current else 0) != expected_version:
                return False
            db.execute(
                "INSERT INTO work_items (ref, version, doc) VALUES (?,?,?) ON CONFLICT (ref)"
                " DO UPDATE SET version = excluded.version, doc = excluded.doc",
                (stored.ref, stored.version, stored.model_dump_json()),
            )
            db.execute("DELETE FROM work_item_pull_requests WHERE work_item = ?", (stored.ref,))
            db.executemany(
                "INSERT OR IGNORE INTO work_item_pull_requests (pr_ref, work_item) VALUES (?,?)",
                [(pr_ref, stored.ref) for pr_ref in stored.pull_requests],
            )
            db.executemany(
                "INSERT INTO dispatches (dispatch_id, work_item, seq, status, created_at,"
                " lease_holder, lease_expires_at, doc, endpoint) VALUES (?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT (dispatch_id) DO UPDATE SET status = excluded.status,"
                " lease_holder = excluded.lease_holder,"
                " lease_expires_at = excluded.lease_expires_at, doc = excluded.doc"
                " WHERE dispatches.status = 'held'",  # core.model.DISPATCH_HELD
                [_dispatch_row(dispatch) for dispatch in _first_of_each_id(dispatches)],
            )
        return True

    def get_dispatch(self, dispatch_id: str) -> DispatchRecord | None:
        """See ``WorkItemStore.get_dispatch``."""
        rows = self._db.rows("SELECT doc FROM dispatches WHERE dispatch_id = ?", (dispatch_id,))
        return DispatchRecord.model_validate_json(rows[0]["doc"]) if rows else None

    def list_dispatches(
        self, *, statuses: Sequence[str] = (), work_item: str | None = None, limit: int = 500
    ) -> list[DispatchRecord]:
        """See ``WorkItemStore.list_dispatches``."""
        clauses: list[str] = []
        params: list[str] = []
        if statuses:
            clauses.append(f"status IN ({','.join('?' * len(statuses))})")
            params.extend(statuses)
        if work_item is not None:
            clauses.append("work_item = ?")
            params.append(work_item)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._db.rows(
            f"SELECT doc FROM dispatches {where}"  # noqa: S608 - fixed columns, values bound
            " ORDER BY created_at, seq, dispatch_id LIMIT ?",
            (*params, limit),
        )
        return [DispatchRecord.model_validate_json(row["doc"]) for row in rows]

    def list_dispatch_heads(
        self,
        *,
        statuses: Sequence[str],
        repositories: Collection[str] | None = None,
        limit: int = 500,
    ) -> list[DispatchRecord]:
        """See ``WorkItemStore.list_dispatch_heads``."""
        marks = ",".join("?" * len(statuses))
        params: list[Any] = list(statuses)
        served = ""
        if repositories is not None:
            wanted = sorted({repository.lower() for repository in repositories})
            served = f" AND repository IN ({','.join('?' * len(wanted))})"
            params.extend(wanted)
        # The heads from the index alone (SQLite takes the bare columns from the row that gave
        # the group's MIN(seq)), then only their documents.
        rows = self._db.rows(
            "SELECT d.doc FROM (SELECT dispatch_id, created_at, MIN(seq) AS seq"  # noqa: S608
            f" FROM dispatches WHERE status IN ({marks}){served} GROUP BY work_item, endpoint"
            " ORDER BY created_at, seq, dispatch_id LIMIT ?) AS heads"
            " JOIN dispatches AS d ON d.dispatch_id = heads.dispatch_id"
            " ORDER BY heads.created_at, heads.seq, heads.dispatch_id",
            (*params, limit),
        )
        return [DispatchRecord.model_validate_json(row["doc"]) for row in rows]

    def expire_dispatch(
        self, dispatch_id: str, *, now: datetime, detail: str
    ) -> DispatchRecord | None:
        """See ``WorkItemStore.expire_dispatch``."""
        changes = {"status": "failed", "result": EXPIRED, "detail": detail, "updated_at": now}
        return self._transition(dispatch_id, "status = 'pending'", (), changes)

    def reopen_dispatch(self, dispatch_id: str, *, now: datetime) -> DispatchRecord | None:
        """See ``WorkItemStore.reopen_dispatch``."""
        changes = {"status": "pending", "result": "", "detail": "", "updated_at": now}
        expired = "status = 'failed' AND json_extract(doc, '$.result') = ?"
        return self._transition(dispatch_id, expired, (EXPIRED,), changes)

    def lease_dispatch(
        self,
        dispatch_id: str,
        *,
        runner_id: str,
        now: datetime,
        until: datetime,
        slot: SessionSlot | None = None,
    ) -> DispatchRecord | None:
        """See ``WorkItemStore.lease_dispatch``: the slot is checked and taken inside the
        lease's own write transaction, which serialises every lease."""
        changes = {"status": "leased", "lease_holder": runner_id, "lease_expires_at": until}

        def take_slot(db: sqlite3.Connection) -> bool:
            if slot is None:
                return True
            others = db.execute(
                "SELECT COUNT(*) FROM runner_sessions WHERE runner_id = ? AND endpoint != ?",
                (runner_id, slot.endpoint),
            ).fetchone()[0]
            if others >= slot.capacity:
                return False
            db.execute(
                "INSERT INTO runner_sessions (runner_id, endpoint, work_item, since)"
                " VALUES (?,?,?,?) ON CONFLICT (runner_id, endpoint) DO UPDATE"
                " SET work_item = excluded.work_item, since = excluded.since",
                (runner_id, slot.endpoint, slot.work_item, utc_text(now)),
            )
            db.executemany(
                "DELETE FROM runner_sessions WHERE runner_id = ? AND endpoint = ?",
                [(freed, slot.endpoint) for freed in slot.frees],
            )
            return True

        return self._transition(
            dispatch_id,
            "status = 'pending' OR (status = 'leased' AND lease_expires_at < ?)",
            (utc_text(now),),
            {**changes, "updated_at": now},
            attempt=True,
            guard=take_slot,
        )

    def held_sessions(self, runner_id: str) -> dict[str, str]:
        """See ``WorkItemStore.held_sessions``."""
        rows = self._db.rows(
            "SELECT endpoint, work_item FROM runner_sessions WHERE runner_id = ?", (runner_id,)
        )
        return {row["endpoint"]: row["work_item"] for row in rows}

    def release_session(self, runner_id: str, *, endpoint: str) -> bool:
        """See ``WorkItemStore.release_session``."""
        with self._db.transaction() as db:
            return bool(
                db.execute(
                    "DELETE FROM runner_sessions WHERE runner_id = ? AND endpoint = ?",
                    (runner_id, endpoint),
                ).rowcount
            )

    def renew_lease(
        self, dispatch_id: str, *, runner_id: str, now: datetime, until: datetime
    ) -> bool:
        """See ``WorkItemStore.renew_lease``."""
        changes = {"lease_expires_at": until, "updated_at": now}
        return self._transition(dispatch_id, _HELD_BY, (runner_id,), changes) is not None

    def finish_dispatch(
        self,
        dispatch_id: str,
        *,
        runner_id: str,
        status: str,
        result: str,
        now: datetime,
        detail: str = "",
    ) -> bool:
        """See ``WorkItemStore.finish_dispatch``.

        Raises ``ValueError`` for a ``status`` other than pending, succeeded or failed.
        """
        if status not in _FINISHED_STATUSES:
            raise ValueError(f"{status!r} is not a status a dispatch can finish with")
        # The holder stays recorded; only the expiry goes, so nothing reads it as still leased.
        changes = {
            "status": status,
            "result": result,
            "detail": detail,
            "lease_expires_at": None,
            "updated_at": now,
        }
        return self._transition(dispatch_id, _HELD_BY, (runner_id,), changes) is not None

    def _transition(
        self,
        dispatch_id: str,
        condition: str,
        params: tuple[Any, ...],
        changes: dict[str, Any],
        *,
        attempt: bool = False,
        guard: Callable[[sqlite3.Connection], bool] | None = None,
    ) -> DispatchRecord | None:
        # Read, check and write in one write transaction: exactly one racing caller matches.
        # ``guard`` runs inside it after the match and may refuse (and write alongside).
        with self._db.transaction() as db:
            row = db.execute(
                f"SELECT doc FROM dispatches WHERE dispatch_id = ? AND ({condition})",  # noqa: S608 - fixed conditions
                (dispatch_id, *params),
            ).fetchone()
            if row is None or (guard is not None and not guard(db)):
                return None
            held = DispatchRecord.model_validate_json(row[0])
            if attempt:
                changes = {**changes, "attempts": held.attempts + 1}
            record = held.model_copy(update=changes)
            db.execute(
                "UPDATE dispatches SET status = ?, lease_holder = ?, lease_expires_at = ?, doc = ?"
                " WHERE dispatch_id = ?",
                (
                    record.status,
                    record.lease_holder,
                    _opt_utc_text(record.lease_expires_at),
                    record.model_dump_json(),
                    dispatch_id,
                ),
            )
        return record


def _first_of_each_id(dispatches: Sequence[DispatchRecord]) -> list[DispatchRecord]:
    first: dict[str, DispatchRecord] = {}
    for dispatch in dispatches:
        first.setdefault(dispatch.dispatch_id, dispatch)
    return list(first.values())


def _dispatch_row(dispatch: DispatchRecord) -> tuple[Any, ...]:
    d = dispatch
    expires = _opt_utc_text(d.lease_expires_at)
    columns = (d.dispatch_id, d.work_item, d.seq, d.status, utc_text(d.created_at), d.lease_holder)
    return (*columns, expires, d.model_dump_json(), d.endpoint)
