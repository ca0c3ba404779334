"""The cloud store: the delivery ledger and the event log in Firestore, behind ``Store``.

Layout: ``{prefix}deliveries/{delivery_id}``, ``{prefix}events/{auto id}``,
``{prefix}inboxes/{id}`` (``adapters.firestore.inbox``) and ``{prefix}user_pins/{login}``.
Every ledger and event document carries ``expires_at`` (write time + retention) for a
Firestore TTL policy on that field; a pin and an inbox have none, so they stay. Composite
indexes: deliveries (``outcome`` or ``outcome_kind``, ``received_at`` desc; ``order_group``,
``outcome``, ``order_key``); events (``delivery_id``, ``work_item`` or ``name``, then
``sort_key``).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.auth.exceptions import DefaultCredentialsError
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from looprelay.adapters.firestore.common import translated
from looprelay.adapters.firestore.inbox import FirestoreInboxes
from looprelay.config.model import FirestoreConfig
from looprelay.core import model
from looprelay.core.model import DeliveryRecord, EventRecord, InboxRecord
from looprelay.errors import ConfigError, Transient

MAX_CAS_ROUNDS = 25
"""Read-then-conditional-update rounds on one ledger record before contention is Transient."""
CALL_BUDGET_SECONDS = 15.0
"""How long one Firestore call is retried (the client's default is 300 s) before Transient."""

_RETRYABLE = (
    gexc.ServiceUnavailable,
    gexc.DeadlineExceeded,
    gexc.Aborted,
    gexc.ResourceExhausted,
    gexc.InternalServerError,
)
_RETRY = Retry(if_exception_type(*_RETRYABLE), maximum=2.0, timeout=CALL_BUDGET_SECONDS)
_Change = Callable[[DeliveryRecord], dict[str, Any] | None]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FOLLOW_OVERLAP = timedelta(seconds=5)
"""How far before a follower's cursor ``list_events(after=...)`` looks again for commits that
landed late: far longer than one write takes to commit."""


def _dt(value: datetime) -> datetime:
    # The client returns DatetimeWithNanoseconds; records hold plain UTC datetimes.
    return datetime.combine(value.date(), value.timetz()).astimezone(UTC)


def _outcome_fields(outcome: str, detail: str, settled_at: datetime | None) -> dict[str, Any]:
    # ``outcome_kind`` ("refused" for every "refused:<reason>", "ignored" for "ignored" and every
    # "ignored:<reason>") makes those filters equality queries: Firestore has no prefix match.
    return {
        "outcome": outcome,
        "outcome_kind": outcome.partition(":")[0],
        "detail": detail[: model.MAX_DETAIL_CHARS],
        "settled_at": settled_at,
    }


class FirestoreStore:
    """Ledger and event log in Firestore; safe across threads, processes and instances."""

    def __init__(
        self, client: firestore.Client, *, collection_prefix: str = "", retention_days: int = 7
    ) -> None:
        """Use ``client``'s database, with collections named ``{collection_prefix}...``.

        Raises ``ValueError`` unless ``retention_days`` (the TTL of every document) is ≥ 1.
        """
        if retention_days < 1:
            raise ValueError(f"retention_days must be at least 1, not {retention_days}")
        self._client = client
        self._deliveries = client.collection(f"{collection_prefix}deliveries")
        self._events = client.collection(f"{collection_prefix}events")
        self._pins = client.collection(f"{collection_prefix}user_pins")
        self._inboxes = FirestoreInboxes(client, collection_prefix=collection_prefix)
        self._retention = timedelta(days=retention_days)
        self._seq_lock = threading.Lock()
        self._seq = 0

    @classmethod
    def from_config(cls, cfg: FirestoreConfig, *, retention_days: int) -> FirestoreStore:
        """Build a store from the ``store.firestore`` config section.

        Raises ``ConfigError`` when no Google credentials or project can be found.
        """
        try:
            client = firestore.Client(project=cfg.project, database=cfg.database)
        except (DefaultCredentialsError, OSError) as exc:
            raise ConfigError(
                f"store.firestore: cannot open Firestore ({exc}); set store.firestore.project and"
                " credentials (GOOGLE_APPLICATION_CREDENTIALS), or FIRESTORE_EMULATOR_HOST"
            ) from exc
        return cls(client, collection_prefix=cfg.collection_prefix, retention_days=retention_days)

    def _expires_at(self) -> datetime:
        return datetime.now(UTC) + self._retention

    def begin_delivery(
        self, record: DeliveryRecord, *, event: EventRecord | None = None
    ) -> tuple[DeliveryRecord, bool]:
        """See ``Store.begin_delivery``; ``create()`` makes exactly one caller the creator.

        Raises ``Transient`` when Firestore stays unavailable for ``CALL_BUDGET_SECONDS`` in a
        call, the record stays contended for ``MAX_CAS_ROUNDS`` rounds, or it expired between
        the create and the read.
        """
        document = {
            **record.model_dump(),
            **_outcome_fields(record.outcome, record.detail, record.settled_at),
            "expires_at": self._expires_at(),
        }
        with translated("begin a delivery"):
            # One batch: the record and its event commit together, or neither when the
            # record exists already (the create fails the whole batch).
            batch = self._client.batch()
            batch.create(self._deliveries.document(record.delivery_id), document)
            if event is not None:
                batch.create(self._events.document(), self._event_document(event))
            try:
                batch.commit(retry=_RETRY)
                return record, True
            except gexc.AlreadyExists:
                pass
            current, counted = self._transition(
                record.delivery_id,
                lambda stored: None if stored.settled else {"attempts": stored.attempts + 1},
            )
        if current is None:
            raise Transient(f"delivery {record.delivery_id} expired while being begun; retry")
        return current.model_copy(update={"attempts": current.attempts + int(counted)}), False

    def settle_delivery(
        self,
        delivery_id: str,
        *,
        outcome: str,
        detail: str,
        at: datetime,
        event: EventRecord | None = None,
    ) -> bool:
        """See ``Store.settle_delivery``; contention budget as in ``begin_delivery``."""
        if outcome == model.RECEIVED or not model.is_valid_outcome(outcome):
            raise ValueError(f"{outcome!r} is not a settled ledger outcome")
        fields = _outcome_fields(outcome, detail, at)
        with translated("settle a delivery"):
            return self._transition(
                delivery_id, lambda r: None if r.settled else fields, event=event
            )[1]

    def reopen_delivery(self, delivery_id: str) -> bool:
        """See ``Store.reopen_delivery``; contention budget as in ``begin_delivery``."""
        fields = _outcome_fields(model.RECEIVED, "", None)
        with translated("reopen a delivery"):
            return self._transition(
                delivery_id, lambda r: fields if r.outcome == "failed" else None
            )[1]

    # Scenario: two workers settle d-1 at once. Both read it as ``received`` at update time
    # U. The first update with precondition "last updated at U" commits; the second gets
    # FailedPrecondition, reads again, sees a settled record and declines. No transaction
    # holds a lock, so nothing waits on the emulator's 2 s lock timeout.
    def _transition(
        self, delivery_id: str, change: _Change, *, event: EventRecord | None = None
    ) -> tuple[DeliveryRecord | None, bool]:
        # Apply ``change`` (fields, or None to decline) to the record as last read; return
        # the record it decided on (None if absent) and whether the change was written.
        reference = self._deliveries.document(delivery_id)
        for _ in range(MAX_CAS_ROUNDS):
            snapshot = reference.get(retry=_RETRY)
            data = snapshot.to_dict()
            if data is None:
                return None, False
            current = _delivery(data)
            fields = change(current)
            if fields is None:
                return current, False
            option = self._client.write_option(last_update_time=snapshot.update_time)
            written = {**fields, "expires_at": self._expires_at()}
            # One batch: the change and its event commit together or not at all.
            batch = self._client.batch()
            batch.update(reference, written, option=option)
            if event is not None:
                batch.create(self._events.document(), self._event_document(event))
            try:
                batch.commit(retry=_RETRY)
            except (gexc.FailedPrecondition, gexc.NotFound):
                continue  # written or deleted since the read: decide again on fresh state
            return current, True
        raise Transient(f"delivery {delivery_id} contended {MAX_CAS_ROUNDS} times; retry later")

    def get_delivery(self, delivery_id: str) -> DeliveryRecord | None:
        """See ``Store.get_delivery``; raises ``Transient`` when Firestore is unavailable."""
        with translated("read a delivery"):
            data = self._deliveries.document(delivery_id).get(retry=_RETRY).to_dict()
        return None if data is None else _delivery(data)

    def list_inbox(self, group: str, *, from_key: str, limit: int = 50) -> list[DeliveryRecord]:
        """See ``Store.list_inbox``: one query on the index ``order_group``, ``outcome``,
        ``order_key``. Raises ``Transient`` when Firestore is unavailable."""
        query = (
            self._deliveries.where(filter=FieldFilter("order_group", "==", group))
            .where(filter=FieldFilter("outcome", "==", model.RECEIVED))
            .where(filter=FieldFilter("order_key", ">=", from_key))
            .order_by("order_key")
        )
        with translated("list an inbox"):
            snapshots = list(query.limit(limit).stream(retry=_RETRY))
        return [_delivery(snapshot.to_dict() or {}) for snapshot in snapshots]

    def take_inbox(
        self, group: str, *, holder: str, now: datetime, until: datetime
    ) -> InboxRecord | None:
        """See ``Store.take_inbox`` (``adapters.firestore.inbox``)."""
        return self._inboxes.take(group, holder=holder, now=now, until=until)

    def keep_inbox(self, inbox: InboxRecord, *, until: datetime) -> InboxRecord | None:
        """See ``Store.keep_inbox``."""
        return self._inboxes.keep(inbox, until=until)

    def release_inbox(self, inbox: InboxRecord) -> bool:
        """See ``Store.release_inbox``."""
        return self._inboxes.release(inbox)

    def free_inboxes(self) -> int:
        """See ``Store.free_inboxes`` (``adapters.firestore.inbox``)."""
        return self._inboxes.free_all()

    def list_deliveries(
        self, *, outcome: str | None = None, limit: int = 100
    ) -> list[DeliveryRecord]:
        """See ``Store.list_deliveries``; raises ``Transient`` when Firestore is unavailable."""
        query = self._deliveries.order_by("received_at", direction=firestore.Query.DESCENDING)
        field = "outcome_kind" if outcome in model.REASONED_OUTCOMES else "outcome"
        if outcome is not None:
            query = query.where(filter=FieldFilter(field, "==", outcome))
        with translated("list deliveries"):
            snapshots = list(query.limit(limit).stream(retry=_RETRY))
        return [_delivery(snapshot.to_dict() or {}) for snapshot in snapshots]

    def append_event(self, event: EventRecord) -> None:
        """See ``Store.append_event``; raises ``Transient`` when Firestore is unavailable."""
        with translated("append an event"):
            self._events.add(self._event_document(event), retry=_RETRY)

    def _event_document(self, event: EventRecord) -> dict[str, Any]:
        # The log's order, as SQLite's rowid is there: the write time in ns, strictly
        # increasing in this process, roughly wall-clock order across processes, and unique.
        with self._seq_lock:
            self._seq = seq = max(self._seq + 1, time.time_ns())
        return {
            **event.model_dump(),
            # JSON text, as in SQLite: same round trip, and Firestore rejects nested arrays.
            "data": json.dumps(event.data, default=str),
            "sort_key": f"{seq:020d}{secrets.token_hex(4)}",
            # The commit time, set by the server: what a follower pages by (``list_events``).
            "written_at": firestore.SERVER_TIMESTAMP,
            "expires_at": self._expires_at(),
        }

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
        """See ``Store.list_events``; raises ``Transient`` when Firestore is unavailable.

        An event's cursor is its commit time in ns (``written_at``, set by the server) and its
        document id. A writer's commit can land a moment after a later-stamped one a follower
        has read already, so ``after`` is answered with up to ``limit`` events committed after
        it and every one committed in the ``FOLLOW_OVERLAP`` before it: a follower drops the
        cursors it has seen (``service.follow``). Other listings order by ``sort_key``, the
        writer's clock, and never skip anything since they take no cursor.
        """
        equal = {"delivery_id": delivery_id, "work_item": work_item, "name": name}
        query: Any = self._events  # a collection is a query of all its documents
        for field, value in equal.items():
            if value is not None:
                query = query.where(filter=FieldFilter(field, "==", value))
        if after is not None:
            return self._events_after(query, after, since=since, limit=limit)
        if since is not None:
            since_ns = int(since.timestamp()) * 1_000_000_000 + since.microsecond * 1_000
            query = query.where(filter=FieldFilter("sort_key", ">=", f"{since_ns:020d}"))
        direction = firestore.Query.DESCENDING if newest else firestore.Query.ASCENDING
        with translated("list events"):
            snapshots = list(
                query.order_by("sort_key", direction=direction).limit(limit).stream(retry=_RETRY)
            )
        found = [_event(snapshot) for snapshot in snapshots]
        return found[::-1] if newest else found

    def _events_after(
        self, query: Any, after: str, *, since: datetime | None, limit: int
    ) -> list[EventRecord]:
        # One range per query: ``since`` is applied to what the queries find.
        written = _written_at_of(after)
        by_time = query.order_by("written_at")
        page = by_time.where(filter=FieldFilter("written_at", ">", written)).limit(limit)
        # Newest first: a late commit lands just before the cursor, not at the window's start.
        overlap = (
            query.where(filter=FieldFilter("written_at", ">=", written - FOLLOW_OVERLAP))
            .where(filter=FieldFilter("written_at", "<=", written))
            .order_by("written_at", direction=firestore.Query.DESCENDING)
            .limit(limit)
        )
        with translated("list events"):
            snapshots = [*overlap.stream(retry=_RETRY), *page.stream(retry=_RETRY)]
        found = {event.cursor: event for event in map(_event, snapshots)}
        ordered = [found[cursor] for cursor in sorted(found)]
        return [event for event in ordered if since is None or event.at >= since]

    def pin_user_id(self, login: str, *, user_id: int, at: datetime) -> tuple[int, bool]:
        """See ``Store.pin_user_id``; ``create()`` makes exactly one caller the one that pins.

        Raises ``Transient`` when Firestore stays unavailable for ``CALL_BUDGET_SECONDS`` in a
        call.
        """
        reference = self._pins.document(login)
        with translated("pin a user id"):
            data = reference.get(retry=_RETRY).to_dict()
            if data is None:
                try:
                    reference.create(
                        {"login": login, "user_id": user_id, "pinned_at": at}, retry=_RETRY
                    )
                    return user_id, True
                except gexc.AlreadyExists:
                    data = reference.get(retry=_RETRY).to_dict()
        if data is None:
            raise Transient(f"the pin of {login} vanished while being read; retry")
        return int(data["user_id"]), False


def _delivery(data: dict[str, Any]) -> DeliveryRecord:
    # Unknown keys (outcome_kind, expires_at) are ignored by the model.
    times = {key: _dt(data[key]) for key in ("received_at", "settled_at") if data.get(key)}
    return DeliveryRecord.model_validate({**data, **times})


def _event(snapshot: Any) -> EventRecord:
    # Unknown keys (sort_key, written_at, expires_at) are ignored by the model.
    data = snapshot.to_dict() or {}
    written = data.get("written_at")
    # An event written before commit times were kept has only its writer's sort key.
    cursor = data.get("sort_key", "") if written is None else _cursor(written, snapshot.id)
    return EventRecord.model_validate(
        {**data, "at": _dt(data["at"]), "data": json.loads(data["data"]), "cursor": cursor}
    )


def _cursor(written: datetime, document_id: str) -> str:
    micros = (_dt(written) - _EPOCH) // timedelta(microseconds=1)
    return f"{micros * 1_000:020d}/{document_id}"


def _written_at_of(cursor: str) -> datetime:
    nanos, slash, _document = cursor.partition("/")
    if not slash or not nanos.isdigit():
        raise ValueError(f"{cursor[:40]!r} is not an event cursor of this store")
    return _EPOCH + timedelta(microseconds=int(nanos) // 1_000)
