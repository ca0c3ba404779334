"""Each order group's inbox lease in Firestore (``Store.take_inbox`` and its kin):
``{prefix}inboxes/{id}``, one small document per issue or pull request (the id encodes the
group as a work item's id encodes its ref).

Every change is a read, then a write conditioned on that read (create when absent, else
"last updated at"): of racing takers exactly one commits, the others read again and knock.
No transaction holds a lock, so nothing waits on the emulator's lock timeout.
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
        """See ``Store.take_inbox``."""

        def take(current: InboxRecord) -> tuple[dict[str, Any] | None, InboxRecord | None]:
            free = not current.holder or current.until is None or current.until < now
            if free or current.holder == holder:
                taken = current.model_copy(update={"holder": holder, "until": until})
                return {"holder": holder, "until": until}, taken
            return {"knocks": firestore.Increment(1)}, None

        return self._change(group, take, action="take an inbox")

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
                data = snapshot.to_dict()
                current = InboxRecord(group=group) if data is None else _inbox(group, data)
                fields, answer = change(current)
                if fields is None:
                    return answer
                try:
                    if data is None:
                        reference.create({**current.model_dump(), **fields})
                    else:
                        option = self._client.write_option(last_update_time=snapshot.update_time)
                        reference.update(fields, option=option)
                except (gexc.AlreadyExists, gexc.FailedPrecondition, gexc.NotFound):
                    continue  # changed since the read: decide again on fresh state
                return answer
        raise Transient(f"the inbox of {group} stayed contended; retry later")


def _state(inbox: InboxRecord) -> dict[str, Any]:
    return {
        "drained_key": inbox.drained_key,
        "stuck": inbox.stuck,
        "stuck_since": inbox.stuck_since,
    }


def _inbox(group: str, data: dict[str, Any]) -> InboxRecord:
    times = {key: utc(data[key]) for key in ("until", "stuck_since") if data.get(key)}
    return InboxRecord.model_validate({**data, **times, "group": group})
