"""Each order group's inbox lease in Firestore (``Store.take_inbox`` and its kin):
``{prefix}inboxes/{id}``, one small document per issue or pull request (the id encodes the
group as a work item's id encodes its ref).

Every change is a read, then a write conditioned on that read (create when absent, else
"last updated at"): of racing takers exactly one commits, the others read again and knock
(a blind increment: ``FirestoreInboxes.take``). No transaction holds a lock, so nothing waits
on the emulator's lock timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from looprelay.adapters.firestore.common import MAX_CAS_ROUNDS, translated, utc
from looprelay.adapters.firestore.work_items import work_item_document_id
from looprelay.core.model import InboxRecord
from looprelay.errors import Transient

_Change = Callable[[InboxRecord], tuple[dict[str, Any] | None, InboxRecord | None]]
"""The fields to write (None: write nothing) and what the call returns."""


class FirestoreInboxes:
    """The inbox leases of one store's collections."""

    def __init__(self, client: firestore.Client, *, collection_prefix: str) -> None:
        self._client = client
        self._inboxes = client.collection(f"{collection_prefix}inboxes")

    def take(
        self, group: str, *, holder: str, now: datetime, until: datetime
    ) -> InboxRecord | None:
        """See ``Store.take_inbox``.

        A knock is a blind increment, not a conditional write: a burst's attempts all knock at
        once, and conditional knocks would fail each other round after round. The read after
        it tells whether the knock counts: the inbox still held means its holder had not
        released when the knock landed, so its release sees the count changed (or a new
        holder took it, and lists this delivery after taking it); freed meanwhile, the
        knocker takes it instead.
        """
        reference = self._inboxes.document(work_item_document_id(group))

        def is_free(current: InboxRecord) -> bool:
            expired = current.until is None or current.until < now
            return not current.holder or expired or current.holder == holder

        with translated("take an inbox"):
            for _ in range(MAX_CAS_ROUNDS):
                snapshot = reference.get()
                current = self._read(group, snapshot)
                if is_free(current):
                    taken = current.model_copy(update={"holder": holder, "until": until})
                    if self._write(
                        reference, snapshot, current, {"holder": holder, "until": until}
                    ):
                        return taken
                    continue
                try:
                    reference.update({"knocks": firestore.Increment(1)})
                except gexc.NotFound:
                    continue
                if not is_free(self._read(group, reference.get())):
                    return None
        raise Transient(f"the inbox of {group} stayed contended; retry later")

    def keep(self, inbox: InboxRecord, *, until: datetime) -> InboxRecord | None:
        """See ``Store.keep_inbox``."""

        def keep(current: InboxRecord) -> tuple[dict[str, Any] | None, InboxRecord | None]:
            if current.holder != inbox.holder:
                return None, None
            kept = inbox.model_copy(update={"until": until, "knocks": current.knocks})
            return {"until": until, **_state(inbox)}, kept

        return self._change(inbox.group, keep, action="keep an inbox")

    def release(self, inbox: InboxRecord) -> bool:
        """See ``Store.release_inbox``."""

        def release(current: InboxRecord) -> tuple[dict[str, Any] | None, InboxRecord | None]:
            if current.holder != inbox.holder or current.knocks != inbox.knocks:
                return None, None
            return {"holder": "", "until": None, **_state(inbox)}, current

        return self._change(inbox.group, release, action="release an inbox") is not None

    def free_all(self) -> int:
        """See ``Store.free_inboxes``: each held inbox freed by its own conditional change."""
        with translated("list held inboxes"):
            held = [
                snapshot.get("group")
                for snapshot in self._inboxes.where(filter=FieldFilter("holder", ">", "")).stream()
            ]

        def free(current: InboxRecord) -> tuple[dict[str, Any] | None, InboxRecord | None]:
            if not current.holder:
                return None, None
            return {"holder": "", "until": None}, current

        return sum(self._change(group, free, action="free an inbox") is not None for group in held)

    def _change(self, group: str, change: _Change, *, action: str) -> InboxRecord | None:
        reference = self._inboxes.document(work_item_document_id(group))
        with translated(action):
            for _ in range(MAX_CAS_ROUNDS):
                snapshot = reference.get()
                current = self._read(group, snapshot)
                fields, answer = change(current)
                if fields is None or self._write(reference, snapshot, current, fields):
                    return answer
        raise Transient(f"the inbox of {group} stayed contended; retry later")

    @staticmethod
    def _read(group: str, snapshot: firestore.DocumentSnapshot[Any]) -> InboxRecord:
        data = snapshot.to_dict()
        return InboxRecord(group=group) if data is None else _inbox(group, data)

    def _write(
        self,
        reference: firestore.DocumentReference,
        snapshot: firestore.DocumentSnapshot[Any],
        current: InboxRecord,
        fields: dict[str, Any],
    ) -> bool:
        """Write ``fields`` if the document is as ``snapshot`` read it; False: it changed
        since (decide again on fresh state)."""
        try:
            if not snapshot.exists:
                reference.create({**current.model_dump(), **fields})
            else:
                option = self._client.write_option(last_update_time=snapshot.update_time)
                reference.update(fields, option=option)
        except (gexc.AlreadyExists, gexc.FailedPrecondition, gexc.NotFound):
            return False
        return True


def _state(inbox: InboxRecord) -> dict[str, Any]:
    return {
        "drained_key": inbox.drained_key,
        "stuck": inbox.stuck,
        "stuck_since": inbox.stuck_since,
    }


def _inbox(group: str, data: dict[str, Any]) -> InboxRecord:
    times = {key: utc(data[key]) for key in ("until", "stuck_since") if data.get(key)}
    return InboxRecord.model_validate({**data, **times, "group": group})
