"""The embedded store: one SQLite file in WAL mode, behind the ``Store`` port.

Tables: ``deliveries`` (the ledger), ``inboxes`` (who drains each order group's unsettled
deliveries), ``events`` (the log) and ``user_pins`` (login -> user id).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

from looprelay.adapters.sqlite.database import (
    SqliteDatabase,
    open_database,
    parse_utc_text,
    utc_text,
)
from looprelay.core.model import (
    MAX_DETAIL_CHARS,
    REASONED_OUTCOMES,
    RECEIVED,
    DeliveryRecord,
    EventRecord,
    InboxRecord,
    is_valid_outcome,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    delivery_id TEXT PRIMARY KEY,
    event TEXT NOT NULL,
    action TEXT,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    attempts INTEGER NOT NULL,
    received_at TEXT NOT NULL,
    settled_at TEXT,
    envelope TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS deliveries_by_time ON deliveries (received_at);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    name TEXT NOT NULL,
    delivery_id TEXT,
    work_item TEXT,
    severity TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_time ON events (at, seq);
CREATE INDEX IF NOT EXISTS events_by_delivery ON events (delivery_id);
CREATE TABLE IF NOT EXISTS inboxes (
    grp TEXT PRIMARY KEY,
    holder TEXT NOT NULL DEFAULT '',
    until TEXT,
    knocks INTEGER NOT NULL DEFAULT 0,
    drained_key TEXT NOT NULL DEFAULT '',
    stuck TEXT NOT NULL DEFAULT '',
    stuck_since TEXT
);
CREATE TABLE IF NOT EXISTS user_pins (
    login TEXT PRIMARY KEY,
    user_id INTEGER NOT NULL,
    pinned_at TEXT NOT NULL
);
"""


_INBOX_ROW = (
    "SELECT grp, holder, until, knocks, drained_key, stuck, stuck_since FROM inboxes WHERE grp = ?"
)
_ORDER_COLUMNS = {
    "order_group": "TEXT NOT NULL DEFAULT ''",
    "order_key": "TEXT NOT NULL DEFAULT ''",
}
"""Ledger columns a file made before order was kept lacks (its records order nothing)."""
_ORDER_INDEX = (
    "CREATE INDEX IF NOT EXISTS deliveries_by_order"
    " ON deliveries (order_group, outcome, order_key);"
)


class SqliteStore:
    """Ledger and event log in one SQLite database; safe across threads and processes."""

    def __init__(self, path: str | Path | SqliteDatabase) -> None:
        """Open (creating if needed) the database at ``path``.

        Raises ``Transient`` when the file cannot be opened.
        """
        self._db = open_database(path, schema=_SCHEMA, what="SQLite store")
        self._db.add_columns("deliveries", _ORDER_COLUMNS)
        self._db.ensure_schema(_ORDER_INDEX)

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    def begin_delivery(
        self, record: DeliveryRecord, *, event: EventRecord | None = None
    ) -> tuple[DeliveryRecord, bool]:
        """See ``Store.begin_delivery``."""
        # Unsynced: the settle that ends this delivery is synced and makes it durable.
        with self._db.transaction(synced=False) as db:
            inserted = db.execute(
                "INSERT OR IGNORE INTO deliveries (delivery_id, event, action, outcome, detail,"
                " attempts, received_at, settled_at, envelope, order_group, order_key)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    record.delivery_id,
                    record.event,
                    record.action,
                    record.outcome,
                    record.detail,
                    record.attempts,
                    utc_text(record.received_at),
                    utc_text(record.settled_at) if record.settled_at else None,
                    record.envelope,
                    record.order_group,
                    record.order_key,
                ),
            ).rowcount
            if not inserted:
                db.execute(
                    "UPDATE deliveries SET attempts = attempts + 1"
                    " WHERE delivery_id = ? AND outcome = ?",
                    (record.delivery_id, RECEIVED),
                )
            elif event is not None:
                _insert_event(db, event)
        if inserted:
            return record, True  # stored as given: nothing to read back
        stored = self.get_delivery(record.delivery_id)
        assert stored is not None  # found inside the transaction above
        return stored, False

    def settle_delivery(
        self,
        delivery_id: str,
        *,
        outcome: str,
        detail: str,
        at: datetime,
        event: EventRecord | None = None,
    ) -> bool:
        """See ``Store.settle_delivery``."""
        if outcome == RECEIVED or not is_valid_outcome(outcome):
            raise ValueError(f"{outcome!r} is not a settled ledger outcome")
        with self._db.transaction() as db:
            changed = db.execute(
                "UPDATE deliveries SET outcome = ?, detail = ?, settled_at = ?"
                " WHERE delivery_id = ? AND outcome = ?",
                (outcome, detail[:MAX_DETAIL_CHARS], utc_text(at), delivery_id, RECEIVED),
            ).rowcount
            if changed and event is not None:
                _insert_event(db, event)
        return bool(changed)

    def reopen_delivery(self, delivery_id: str) -> bool:
        """See ``Store.reopen_delivery``."""
        with self._db.transaction() as db:
            changed = db.execute(
                "UPDATE deliveries SET outcome = ?, detail = '', settled_at = NULL"
                " WHERE delivery_id = ? AND outcome = 'failed'",
                (RECEIVED, delivery_id),
            ).rowcount
        return bool(changed)

    def get_delivery(self, delivery_id: str) -> DeliveryRecord | None:
        """See ``Store.get_delivery``."""
        rows = self._db.rows("SELECT * FROM deliveries WHERE delivery_id = ?", (delivery_id,))
        return _delivery(rows[0]) if rows else None

    def list_inbox(self, group: str, *, from_key: str, limit: int = 50) -> list[DeliveryRecord]:
        """See ``Store.list_inbox``."""
        rows = self._db.rows(
            "SELECT * FROM deliveries WHERE order_group = ? AND outcome = ?"
            " AND order_key >= ? ORDER BY order_key, delivery_id LIMIT ?",
            (group, RECEIVED, from_key, limit),
        )
        return [_delivery(row) for row in rows]

    def take_inbox(
        self, group: str, *, holder: str, now: datetime, until: datetime
    ) -> InboxRecord | None:
        """See ``Store.take_inbox``: one write transaction decides."""
        # Unsynced: a lease lost in a power cut only lets the next taker in sooner.
        with self._db.transaction(synced=False) as db:
            db.execute("INSERT OR IGNORE INTO inboxes (grp) VALUES (?)", (group,))
            current = _inbox(db.execute(_INBOX_ROW, (group,)).fetchone())
            free = not current.holder or current.until is None or current.until < now
            if not (free or current.holder == holder):
                db.execute("UPDATE inboxes SET knocks = knocks + 1 WHERE grp = ?", (group,))
                return None
            db.execute(
                "UPDATE inboxes SET holder = ?, until = ? WHERE grp = ?",
                (holder, utc_text(until), group),
            )
        return current.model_copy(update={"holder": holder, "until": until})

    def keep_inbox(self, inbox: InboxRecord, *, until: datetime) -> InboxRecord | None:
        """See ``Store.keep_inbox``."""
        with self._db.transaction(synced=False) as db:
            changed = db.execute(
                "UPDATE inboxes SET until = ?, drained_key = ?, stuck = ?, stuck_since = ?"
                " WHERE grp = ? AND holder = ?",
                (utc_text(until), *_inbox_state(inbox), inbox.group, inbox.holder),
            ).rowcount
            row = db.execute(_INBOX_ROW, (inbox.group,)).fetchone()
        return _inbox(row) if changed else None

    def release_inbox(self, inbox: InboxRecord) -> bool:
        """See ``Store.release_inbox``."""
        with self._db.transaction(synced=False) as db:
            changed = db.execute(
                "UPDATE inboxes SET holder = '', until = NULL, drained_key = ?, stuck = ?,"
                " stuck_since = ? WHERE grp = ? AND holder = ? AND knocks = ?",
                (*_inbox_state(inbox), inbox.group, inbox.holder, inbox.knocks),
            ).rowcount
        return bool(changed)

    def free_inboxes(self) -> int:
        """See ``Store.free_inboxes``."""
        with self._db.transaction(synced=False) as db:
            return db.execute(
                "UPDATE inboxes SET holder = '', until = NULL WHERE holder != ''"
            ).rowcount

    def list_deliveries(
        self, *, outcome: str | None = None, limit: int = 100
    ) -> list[DeliveryRecord]:
        """See ``Store.list_deliveries``."""
        if outcome is None:
            rows = self._db.rows(
                "SELECT * FROM deliveries ORDER BY received_at DESC LIMIT ?", (limit,)
            )
        elif outcome in REASONED_OUTCOMES:
            rows = self._db.rows(
                "SELECT * FROM deliveries WHERE outcome = ? OR outcome LIKE ?"
                " ORDER BY received_at DESC LIMIT ?",
                (outcome, f"{outcome}:%", limit),
            )
        else:
            rows = self._db.rows(
                "SELECT * FROM deliveries WHERE outcome = ? ORDER BY received_at DESC LIMIT ?",
                (outcome, limit),
            )
        return [_delivery(row) for row in rows]

    def append_event(self, event: EventRecord) -> None:
        """See ``Store.append_event``."""
        with self._db.transaction(synced=False) as db:  # diagnostics; see begin_delivery
            _insert_event(db, event)

    def list_events(
        self,
        *,
        delivery_id: str | None = None,
        work_item: str | None = None,
        name: str | None = None,
        after: str | None = None,
        since: datetime | None = None,
        newest: bool = False,
        limit: int = 1000,
    ) -> list[EventRecord]:
        """See ``Store.list_events``."""
        clauses, params = [], []
        for column, value in (
            ("delivery_id", delivery_id),
            ("work_item", work_item),
            ("name", name),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if after is not None:
            clauses.append("seq > ?")
            params.append(str(_seq_of(after)))
        if since is not None:
            clauses.append("at >= ?")
            params.append(utc_text(since))
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        order = "DESC" if newest else "ASC"
        rows = self._db.rows(
            # The rowid is the order of writing: a follower never skips a same-instant event.
            f"SELECT * FROM events {where} ORDER BY seq {order} LIMIT ?",  # noqa: S608
            (*params, limit),
        )
        found = [
            EventRecord(
                name=row["name"],
                at=parse_utc_text(row["at"]),
                delivery_id=row["delivery_id"],
                work_item=row["work_item"],
                severity=row["severity"],
                data=json.loads(row["data"]),
                cursor=f"{row['seq']:020d}",
            )
            for row in rows
        ]
        return found[::-1] if newest else found

    def pin_user_id(self, login: str, *, user_id: int, at: datetime) -> tuple[int, bool]:
        """See ``Store.pin_user_id``."""
        rows = self._db.rows("SELECT user_id FROM user_pins WHERE login = ?", (login,))
        if rows:
            return int(rows[0]["user_id"]), False
        with self._db.transaction() as db:
            created = db.execute(
                "INSERT OR IGNORE INTO user_pins (login, user_id, pinned_at) VALUES (?,?,?)",
                (login, user_id, utc_text(at)),
            ).rowcount
            (pinned,) = db.execute(
                "SELECT user_id FROM user_pins WHERE login = ?", (login,)
            ).fetchone()
        return int(pinned), bool(created)


def _delivery(row: sqlite3.Row) -> DeliveryRecord:
    return DeliveryRecord(
        delivery_id=row["delivery_id"],
        event=row["event"],
        action=row["action"],
        outcome=row["outcome"],
        detail=row["detail"],
        attempts=row["attempts"],
        received_at=parse_utc_text(row["received_at"]),
        settled_at=None if row["settled_at"] is None else parse_utc_text(row["settled_at"]),
        envelope=row["envelope"],
        order_group=row["order_group"],
        order_key=row["order_key"],
    )


def _inbox(row: tuple[Any, ...]) -> InboxRecord:
    group, holder, until, knocks, drained_key, stuck, stuck_since = row
    return InboxRecord(
        group=group,
        holder=holder,
        until=None if until is None else parse_utc_text(until),
        knocks=knocks,
        drained_key=drained_key,
        stuck=stuck,
        stuck_since=None if stuck_since is None else parse_utc_text(stuck_since),
    )


def _inbox_state(inbox: InboxRecord) -> tuple[str, str, str | None]:
    since = inbox.stuck_since
    return inbox.drained_key, inbox.stuck, None if since is None else utc_text(since)


def _seq_of(cursor: str) -> int:
    try:
        return int(cursor)
    except ValueError:
        raise ValueError(f"{cursor[:40]!r} is not an event cursor of this store") from None


def _insert_event(db: sqlite3.Connection, event: EventRecord) -> None:
    db.execute(
        "INSERT INTO events (at, name, delivery_id, work_item, severity, data)"
        " VALUES (?,?,?,?,?,?)",
        (
            utc_text(event.at),
            event.name,
            event.delivery_id,
            event.work_item,
            event.severity,
            json.dumps(event.data, default=str),
        ),
    )
