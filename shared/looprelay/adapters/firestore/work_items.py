"""Work items and their dispatches in Firestore, behind ``WorkItemStore``.

Layout: ``{prefix}work_items/{work_item_document_id(ref)}`` (refs hold ``/``, which a document
id cannot; the ref stays a field), ``{prefix}dispatches/{dispatch_id}`` and
``{prefix}runner_sessions/{runner_id}`` (the session slots the server gave a runner). No TTL
field: a work item outlives any retention window, and a dispatch is needed until it is settled.
``list_dispatches`` needs composite indexes on ``dispatches``: ``status`` / ``work_item`` /
both, then ``created_at`` and ``seq`` ascending.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from looprelay.adapters.firestore.common import (
    MAX_CAS_ROUNDS,
    conditional_update,
    get_documents,
    open_client,
    translated,
    utc,
)
from looprelay.config.model import FirestoreConfig
from looprelay.core.model import DISPATCH_EXPIRED, DISPATCH_HELD, DispatchRecord, WorkItemRecord
from looprelay.errors import Transient
from looprelay.ports import SessionSlot

FINISHED_STATUSES = ("succeeded", "failed", "pending")
"""What a lease holder may report; ``pending`` offers the dispatch to the next runner."""

_Decide = Callable[[DispatchRecord], dict[str, Any] | None]


def work_item_document_id(ref: str) -> str:
    """Return the document id of work item ``ref``: its UTF-8 in URL-safe base64, unpadded.

    Deterministic and reversible; only ``A-Z a-z 0-9 - _`` appear, and valid UTF-8 never
    encodes to the reserved ``__…__`` form. Raises ``ValueError`` for an empty ref.
    """
    if not ref:
        raise ValueError("a work item ref must not be empty")
    return base64.urlsafe_b64encode(ref.encode()).decode("ascii").rstrip("=")


_HEADS_SCAN_LIMIT = 5_000
"""Open dispatches read to find the heads; each costs a document read."""
_REPOSITORIES_PER_QUERY = 15
"""Repositories per heads query: with two statuses, Firestore's 30 disjunctions a query."""


class FirestoreWorkItemStore:
    """The ``WorkItemStore`` port on Firestore; safe across threads, processes and instances."""

    def __init__(self, client: firestore.Client, *, collection_prefix: str = "") -> None:
        """Use ``client``'s database, with collections named ``{collection_prefix}...``."""
        self._client = client
        self._items = client.collection(f"{collection_prefix}work_items")
        self._dispatches = client.collection(f"{collection_prefix}dispatches")
        self._slots = client.collection(f"{collection_prefix}runner_sessions")

    @classmethod
    def from_config(cls, cfg: FirestoreConfig) -> FirestoreWorkItemStore:
        """Build from the ``store.firestore`` section; ``ConfigError`` without credentials."""
        return cls(open_client(cfg), collection_prefix=cfg.collection_prefix)

    def _dispatch_ref(self, dispatch_id: str) -> firestore.DocumentReference:
        if not dispatch_id or "/" in dispatch_id:
            raise ValueError(f"dispatch id {dispatch_id!r} cannot be a Firestore document id")
        return self._dispatches.document(dispatch_id)

    def get_work_item(self, ref: str) -> WorkItemRecord | None:
        """See ``WorkItemStore.get_work_item``; raises ``Transient`` when unavailable."""
        with translated("read a work item"):
            data = self._items.document(work_item_document_id(ref)).get().to_dict()
        return None if data is None else WorkItemRecord.model_validate(_plain(data))

    def get_work_items(self, refs: Collection[str]) -> dict[str, WorkItemRecord]:
        """See ``WorkItemStore.get_work_items``: one batch get per ``common.REFS_PER_BATCH``
        documents; ``Transient`` as above."""
        documents = [self._items.document(work_item_document_id(ref)) for ref in sorted(set(refs))]
        found = get_documents(self._client, documents, action="read work items")
        records = (WorkItemRecord.model_validate(_plain(data)) for data in found.values())
        return {record.ref: record for record in records}

    def find_work_item_for_pull_request(self, pr_ref: str) -> WorkItemRecord | None:
        """See ``WorkItemStore.find_work_item_for_pull_request``; ``Transient`` as above."""
        query = self._items.where(filter=FieldFilter("pull_requests", "array_contains", pr_ref))
        with translated("find a work item by pull request"):
            snapshots = list(query.limit(1).stream())
        return WorkItemRecord.model_validate(_plain(snapshots[0].to_dict())) if snapshots else None

    def list_work_items(self, *, limit: int = 100) -> list[WorkItemRecord]:
        """See ``WorkItemStore.list_work_items``; raises ``Transient`` when unavailable."""
        query = self._items.order_by("updated_at", direction=firestore.Query.DESCENDING)
        with translated("list work items"):
            snapshots = list(query.limit(limit).stream())
        return [WorkItemRecord.model_validate(_plain(s.to_dict())) for s in snapshots]

    # Scenario: savers A and B both read work item W at version 1, then which of their
    # dispatch ids exist, and each commits one batch: W updated under "last updated when I
    # read it" plus create() of the missing dispatches. A commits; B's batch fails whole
    # (FailedPrecondition on W, or AlreadyExists on a dispatch A just made), B reads again,
    # sees version 2 and returns False. No lock is held, so the emulator's 2 s lock timeout
    # never applies.
    def save_work_item(
        self,
        record: WorkItemRecord,
        *,
        expected_version: int,
        dispatches: Sequence[DispatchRecord] = (),
    ) -> bool:
        """See ``WorkItemStore.save_work_item``: one atomic batch per round.

        The first of several dispatches sharing an id wins. Raises ``Transient`` when
        Firestore is unavailable or the batch conflicts ``MAX_CAS_ROUNDS`` times without the
        version moving; ``ValueError`` for a dispatch id unusable as a document id.
        """
        item = self._items.document(work_item_document_id(record.ref))
        document = record.model_copy(update={"version": expected_version + 1}).model_dump()
        wanted = {d.dispatch_id: d for d in reversed(dispatches)}  # the first of an id wins
        refs = {key: self._dispatch_ref(key) for key in wanted}
        with translated("save a work item"):
            for _ in range(MAX_CAS_ROUNDS):
                snapshot = item.get()
                if (snapshot.to_dict() or {}).get("version", 0) != expected_version:
                    return False
                batch = self._client.batch()
                if snapshot.exists:
                    option = self._client.write_option(last_update_time=snapshot.update_time)
                    batch.update(item, document, option=option)
                else:
                    batch.create(item, document)
                missing, held = self._missing_and_held(refs)
                for key in missing:
                    batch.create(refs[key], _dispatch_document(wanted[key]))
                for key, updated_at in held.items():
                    # Replaced as read: only a router, under this work item's version,
                    # writes a held dispatch.
                    option = self._client.write_option(last_update_time=updated_at)
                    batch.update(refs[key], _dispatch_document(wanted[key]), option=option)
                try:
                    batch.commit()
                except (gexc.FailedPrecondition, gexc.AlreadyExists, gexc.NotFound):
                    continue  # someone wrote meanwhile: decide again on fresh state
                return True
        raise Transient(f"work item {record.ref} contended {MAX_CAS_ROUNDS} times; retry later")

    def _missing_and_held(
        self, refs: dict[str, firestore.DocumentReference]
    ) -> tuple[list[str], dict[str, Any]]:
        # The dispatch ids among ``refs`` whose documents do not exist yet, and those held
        # (replaced by the save), with the update time each was read at.
        snapshots = list(self._client.get_all(list(refs.values()))) if refs else []
        existing = {snapshot.id for snapshot in snapshots if snapshot.exists}
        held = {
            snapshot.id: snapshot.update_time
            for snapshot in snapshots
            if snapshot.exists and (snapshot.to_dict() or {}).get("status") == DISPATCH_HELD
        }
        return [key for key in refs if key not in existing], held

    def get_dispatch(self, dispatch_id: str) -> DispatchRecord | None:
        """See ``WorkItemStore.get_dispatch``; raises ``Transient`` when unavailable."""
        with translated("read a dispatch"):
            data = self._dispatch_ref(dispatch_id).get().to_dict()
        return None if data is None else DispatchRecord.model_validate(_plain(data))

    def list_dispatches(
        self, *, statuses: Sequence[str] = (), work_item: str | None = None, limit: int = 500
    ) -> list[DispatchRecord]:
        """See ``WorkItemStore.list_dispatches``: by ``created_at``, ``seq``, then id.

        Raises ``Transient`` when unavailable; Firestore refuses more than 30 ``statuses``.
        """
        # Ties on the last order_by fall back to the document name, that is the dispatch id.
        query = self._dispatches.order_by("created_at").order_by("seq")
        if statuses:
            query = query.where(filter=FieldFilter("status", "in", list(statuses)))
        if work_item is not None:
            query = query.where(filter=FieldFilter("work_item", "==", work_item))
        with translated("list dispatches"):
            snapshots = list(query.limit(limit).stream())
        return [DispatchRecord.model_validate(_plain(s.to_dict())) for s in snapshots]

    def list_dispatch_heads(
        self,
        *,
        statuses: Sequence[str],
        repositories: Collection[str] | None = None,
        limit: int = 500,
    ) -> list[DispatchRecord]:
        """See ``WorkItemStore.list_dispatch_heads``: Firestore has no GROUP BY, so the heads
        are picked from the oldest ``_HEADS_SCAN_LIMIT`` open dispatches; with
        ``repositories``, from those of the runner's repositories only (``repository_key``,
        ``_REPOSITORIES_PER_QUERY`` a query), so a backlog it cannot take never fills the scan.
        One session endpoint's dispatches share a repository, so filtering keeps each line whole.
        """
        if repositories is None:
            scanned = self.list_dispatches(statuses=statuses, limit=_HEADS_SCAN_LIMIT)
        else:
            scanned = self._open_of(statuses, sorted({r.lower() for r in repositories}))
        heads: dict[tuple[str, str], DispatchRecord] = {}
        for dispatch in scanned:
            line = (dispatch.work_item, dispatch.endpoint)
            held = heads.get(line)
            if held is None or dispatch.seq < held.seq:
                heads[line] = dispatch
        ordered = sorted(heads.values(), key=lambda d: (d.created_at, d.seq, d.dispatch_id))
        return ordered[:limit]

    def _open_of(self, statuses: Sequence[str], repositories: list[str]) -> list[DispatchRecord]:
        found: list[DispatchRecord] = []
        step = _REPOSITORIES_PER_QUERY
        for chunk in (repositories[i : i + step] for i in range(0, len(repositories), step)):
            query = (
                self._dispatches.where(filter=FieldFilter("status", "in", list(statuses)))
                .where(filter=FieldFilter("repository_key", "in", chunk))
                .order_by("created_at")
                .order_by("seq")
            )
            with translated("list a runner's dispatches"):
                snapshots = list(query.limit(_HEADS_SCAN_LIMIT).stream())
            found += [DispatchRecord.model_validate(_plain(s.to_dict())) for s in snapshots]
        return found

    def expire_dispatch(
        self, dispatch_id: str, *, now: datetime, detail: str
    ) -> DispatchRecord | None:
        """See ``WorkItemStore.expire_dispatch``; raises ``Transient`` as ``lease_dispatch``."""

        def expire(current: DispatchRecord) -> dict[str, Any] | None:
            if current.status != "pending":
                return None
            return {
                "status": "failed",
                "result": DISPATCH_EXPIRED,
                "detail": detail,
                "updated_at": now,
            }

        return self._transition(dispatch_id, expire, action="expire a dispatch")

    def reopen_dispatch(self, dispatch_id: str, *, now: datetime) -> DispatchRecord | None:
        """See ``WorkItemStore.reopen_dispatch``; raises ``Transient`` as ``lease_dispatch``."""

        def reopen(current: DispatchRecord) -> dict[str, Any] | None:
            if (current.status, current.result) != ("failed", DISPATCH_EXPIRED):
                return None
            # repository_key too: a dispatch saved before it existed is found by runners again.
            return {
                "status": "pending",
                "result": "",
                "detail": "",
                "updated_at": now,
                "repository_key": current.repository.lower(),
            }

        return self._transition(dispatch_id, reopen, action="reopen a dispatch")

    def _transition(
        self, dispatch_id: str, decide: _Decide, *, action: str
    ) -> DispatchRecord | None:
        # Apply ``decide`` (fields to set, or None to decline) to the dispatch as last read,
        # under a last-update-time precondition; return the record as written, or None.
        written: list[DispatchRecord] = []

        def change(data: dict[str, Any]) -> dict[str, Any] | None:
            current = DispatchRecord.model_validate(_plain(data))
            fields = decide(current)
            if fields is not None:
                known = {k: v for k, v in fields.items() if k in DispatchRecord.model_fields}
                written.append(current.model_copy(update=known))
            return fields

        done = conditional_update(
            self._client, self._dispatch_ref(dispatch_id), change, action=action
        )
        return written[-1] if done else None

    def lease_dispatch(
        self,
        dispatch_id: str,
        *,
        runner_id: str,
        now: datetime,
        until: datetime,
        slot: SessionSlot | None = None,
    ) -> DispatchRecord | None:
        """See ``WorkItemStore.lease_dispatch``; each lease counts one more ``attempts``. With
        ``slot``, the lease and the runner's slots document are written in one batch, each
        under a last-update-time precondition.

        Raises ``Transient`` after ``MAX_CAS_ROUNDS`` conflicting rounds or when unavailable.
        """

        def lease(current: DispatchRecord) -> dict[str, Any] | None:
            expires = current.lease_expires_at
            lapsed = current.status == "leased" and expires is not None and expires < now
            if current.status != "pending" and not lapsed:
                return None
            return {
                "status": "leased",
                "lease_holder": runner_id,
                "lease_expires_at": until,
                "attempts": current.attempts + 1,
                "updated_at": now,
            }

        if slot is None:
            return self._transition(dispatch_id, lease, action="lease a dispatch")
        with translated("lease a dispatch"):
            for _ in range(MAX_CAS_ROUNDS):
                decided, leased = self._lease_with_slot(dispatch_id, lease, runner_id, slot, now)
                if decided:
                    return leased
        raise Transient(f"dispatch {dispatch_id} contended {MAX_CAS_ROUNDS} times; retry later")

    # Scenario: two spawns race for the last slot of runner R. Each reads its dispatch and R's
    # slots document, then commits one batch: the lease, and the slots with its endpoint
    # added, both under "last updated when I read it". The first commits; the second fails
    # whole (FailedPrecondition, or AlreadyExists for a first slot), reads again, sees R full
    # and declines. Nothing is locked.
    def _lease_with_slot(
        self,
        dispatch_id: str,
        lease: _Decide,
        runner_id: str,
        slot: SessionSlot,
        now: datetime,
    ) -> tuple[bool, DispatchRecord | None]:
        """One round: (True, the leased record or None when it is taken or the runner is
        full), or (False, None) when someone wrote meanwhile (read again)."""
        dispatch_ref, slots_ref = self._dispatch_ref(dispatch_id), self._slots.document(runner_id)
        snapshot = dispatch_ref.get()
        if not snapshot.exists:
            return True, None
        current = DispatchRecord.model_validate(_plain(snapshot.to_dict()))
        fields = lease(current)
        held = slots_ref.get()
        entries = [
            entry
            for entry in (held.to_dict() or {}).get("sessions", [])
            if entry["endpoint"] != slot.endpoint
        ]
        if fields is None or len(entries) >= slot.capacity:
            return True, None
        entries.append({"endpoint": slot.endpoint, "work_item": slot.work_item, "since": now})
        batch = self._client.batch()
        option = self._client.write_option(last_update_time=snapshot.update_time)
        batch.update(dispatch_ref, fields, option=option)
        if held.exists:
            option = self._client.write_option(last_update_time=held.update_time)
            batch.update(slots_ref, {"sessions": entries}, option=option)
        else:
            batch.create(slots_ref, {"runner_id": runner_id, "sessions": entries})
        for freed in slot.frees:
            self._free_in(batch, freed, slot.endpoint)
        try:
            batch.commit()
        except (gexc.FailedPrecondition, gexc.AlreadyExists, gexc.NotFound):
            return False, None
        return True, current.model_copy(update=fields)

    def _free_in(self, batch: firestore.WriteBatch, runner_id: str, endpoint: str) -> None:
        """Add to ``batch`` the freeing of ``endpoint``'s slot on ``runner_id``, under the
        slots document's last update time (nothing when it holds none)."""
        freed_ref = self._slots.document(runner_id)
        freed = freed_ref.get()
        entries = (freed.to_dict() or {}).get("sessions", [])
        kept = [entry for entry in entries if entry["endpoint"] != endpoint]
        if len(kept) != len(entries):
            option = self._client.write_option(last_update_time=freed.update_time)
            batch.update(freed_ref, {"sessions": kept}, option=option)

    def held_sessions(self, runner_id: str) -> dict[str, str]:
        """See ``WorkItemStore.held_sessions``; ``Transient`` when unavailable."""
        with translated("read a runner's sessions"):
            data = self._slots.document(runner_id).get().to_dict() or {}
        return {entry["endpoint"]: entry["work_item"] for entry in data.get("sessions", [])}

    def release_session(self, runner_id: str, *, endpoint: str) -> bool:
        """See ``WorkItemStore.release_session``; ``Transient`` as ``lease_dispatch``."""

        def release(data: dict[str, Any]) -> dict[str, Any] | None:
            entries = data.get("sessions", [])
            kept = [entry for entry in entries if entry["endpoint"] != endpoint]
            return None if len(kept) == len(entries) else {"sessions": kept}

        return conditional_update(
            self._client, self._slots.document(runner_id), release, action="free a session slot"
        )

    def renew_lease(
        self, dispatch_id: str, *, runner_id: str, now: datetime, until: datetime
    ) -> bool:
        """See ``WorkItemStore.renew_lease``; a lapsed lease nobody took yet is still held.

        Raises ``Transient`` as ``lease_dispatch`` does.
        """

        def renew(current: DispatchRecord) -> dict[str, Any] | None:
            if not _held_by(current, runner_id):
                return None
            return {"lease_expires_at": until, "updated_at": now}

        return self._transition(dispatch_id, renew, action="renew a lease") is not None

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
        """See ``WorkItemStore.finish_dispatch``; clears the lease expiry (the holder stays on
        record, as in SQLite).

        Raises ``ValueError`` for a status not in ``FINISHED_STATUSES``, ``Transient`` as
        ``lease_dispatch`` does.
        """
        if status not in FINISHED_STATUSES:
            raise ValueError(f"{status!r} is not one of {', '.join(FINISHED_STATUSES)}")

        def finish(current: DispatchRecord) -> dict[str, Any] | None:
            if not _held_by(current, runner_id):
                return None
            return {
                "status": status,
                "result": result,
                "detail": detail,
                "lease_expires_at": None,
                "updated_at": now,
            }

        return self._transition(dispatch_id, finish, action="finish a dispatch") is not None


def dispatch_from_document(data: dict[str, Any]) -> DispatchRecord:
    """Return the dispatch a ``dispatches`` document holds; ``ValidationError`` if it holds
    none."""
    return DispatchRecord.model_validate(_plain(data))


def _held_by(dispatch: DispatchRecord, runner_id: str) -> bool:
    return dispatch.status == "leased" and dispatch.lease_holder == runner_id


def _plain(value: Any) -> Any:
    # Nested timestamps (graph.at, sessions.*.spawned_at, commands[].at) come back as
    # DatetimeWithNanoseconds too; records hold plain UTC datetimes.
    if isinstance(value, datetime):
        return utc(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _dispatch_document(dispatch: DispatchRecord) -> dict[str, Any]:
    """The dispatch's fields and ``repository_key``, its repository in lower case: runners
    ask for their repositories in any case (``list_dispatch_heads``)."""
    return {**dispatch.model_dump(), "repository_key": dispatch.repository.lower()}
