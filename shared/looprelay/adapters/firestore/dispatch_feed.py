"""The open dispatches pushed by Firestore as they change, behind ``DispatchFeed``.

Scenario: an instance of the runner API holds 200 waiting polls. One real-time listener on
the open-dispatches query (``status in [pending, leased]``, ``listener.ListenedQuery``) keeps
their last state in memory; while nothing changes it costs no reads at all, and each change
costs one read per document that entered, changed in or left the result. On every push the
feed tells ``on_change`` what the push opened (the heads of line of the work items it
touched), and only the polls of runners that may take one of them wake. If the stream ends for
good, the feed answers None, so polls look at the store every few seconds, until a new
listener's first push rings the polls again. Work is found either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from looprelay.adapters.firestore.common import open_client
from looprelay.adapters.firestore.listener import CHECK_SECONDS, ListenedQuery, ListenerBacked
from looprelay.adapters.firestore.work_items import dispatch_from_document
from looprelay.config.model import FirestoreConfig
from looprelay.core.feed import opened_by
from looprelay.core.model import DISPATCH_OPEN, DispatchRecord
from looprelay.ports import DispatchRing


class FirestoreDispatchFeed(ListenerBacked[DispatchRecord]):
    """The ``DispatchFeed`` port on one Firestore real-time listener, re-opened when it
    drops. Safe across threads; :meth:`start` it once, :meth:`close` it once."""

    def __init__(
        self,
        client: firestore.Client,
        *,
        on_change: DispatchRing,
        collection_prefix: str = "",
        check_seconds: float = CHECK_SECONDS,
    ) -> None:
        """Listen to ``{collection_prefix}dispatches`` of ``client``'s database, telling
        ``on_change`` (on the listener's thread; it must not block) after each push what it
        opened: only the heads of line of the work items the push touched, so a poll wakes
        only for work its runner may take (``service.waker``)."""
        dispatches = client.collection(f"{collection_prefix}dispatches")
        self._ring = on_change
        self._listened = ListenedQuery(
            dispatches.where(filter=FieldFilter("status", "in", list(DISPATCH_OPEN))),
            parse=_slim,
            name="dispatch",
            fallback="polls look at the store every few seconds",
            on_change=self._pushed,
            check_seconds=check_seconds,
        )

    @classmethod
    def from_config(cls, cfg: FirestoreConfig, *, on_change: DispatchRing) -> FirestoreDispatchFeed:
        """The feed on the database ``store.firestore`` names, not listening yet:
        :meth:`start` it in the process that serves (until then polls look at the store).
        Raises ``ConfigError`` without credentials."""
        return cls(open_client(cfg), on_change=on_change, collection_prefix=cfg.collection_prefix)

    def open_dispatches(self) -> Sequence[DispatchRecord] | None:
        """See ``DispatchFeed.open_dispatches``. None also while a document cannot be read
        as a dispatch: a poll then looks at the store rather than miss it."""
        result = self._listened.current()
        if result is None or result.unreadable:
            return None
        return list(result.documents.values())

    def _pushed(self, changed: Sequence[DispatchRecord] | None) -> None:
        open_now = self.open_dispatches()
        if changed is None or open_now is None:
            self._ring(None, ())  # dropped, or unreadable: every poll looks at the store
            return
        opened = opened_by(changed, open_now, now=datetime.now(UTC))
        self._ring(opened.heads, opened.freed)


def _slim(data: dict[str, Any]) -> DispatchRecord:
    # What scheduling needs: the lease reads the whole document again anyway.
    return dispatch_from_document(data).slim()
