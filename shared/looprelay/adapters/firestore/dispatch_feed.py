"""The open dispatches pushed by Firestore as they change, behind ``DispatchFeed``.

Scenario: an instance of the runner API holds 200 waiting polls. One real-time listener on
the open-dispatches query (``status in [pending, leased]``, ``listener.ListenedQuery``) keeps
their last state in memory; while nothing changes it costs no reads at all, and each change
costs one read per document that entered, changed in or left the result. On every push the
feed rings ``on_change`` and the polls check the new state in memory. If the stream ends for
good, the feed answers None, so polls look at the store every few seconds, until a new
listener's first push rings the polls again. Work is found either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from looprelay.adapters.firestore.common import open_client
from looprelay.adapters.firestore.listener import CHECK_SECONDS, ListenedQuery, ListenerBacked
from looprelay.adapters.firestore.work_items import dispatch_from_document
from looprelay.config.model import FirestoreConfig
from looprelay.core.model import DISPATCH_OPEN, DispatchRecord


class FirestoreDispatchFeed(ListenerBacked[DispatchRecord]):
    """The ``DispatchFeed`` port on one Firestore real-time listener, re-opened when it
    drops. Safe across threads; :meth:`start` it once, :meth:`close` it once."""

    def __init__(
        self,
        client: firestore.Client,
        *,
        on_change: Callable[[], None],
        collection_prefix: str = "",
        check_seconds: float = CHECK_SECONDS,
    ) -> None:
        """Listen to ``{collection_prefix}dispatches`` of ``client``'s database, calling
        ``on_change`` (on the listener's thread; it must not block) after each push."""
        dispatches = client.collection(f"{collection_prefix}dispatches")
        self._listened = ListenedQuery(
            dispatches.where(filter=FieldFilter("status", "in", list(DISPATCH_OPEN))),
            parse=_slim,
            name="dispatch",
            fallback="polls look at the store every few seconds",
            on_change=on_change,
            check_seconds=check_seconds,
        )

    @classmethod
    def from_config(
        cls, cfg: FirestoreConfig, *, on_change: Callable[[], None]
    ) -> FirestoreDispatchFeed:
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


def _slim(data: dict[str, Any]) -> DispatchRecord:
    # What scheduling needs, without the prompt and result texts (up to 60,000 characters
    # each): the lease reads the whole document again anyway.
    record = dispatch_from_document(data)
    return record.model_copy(update={"prompt": "", "result": "", "detail": ""})
