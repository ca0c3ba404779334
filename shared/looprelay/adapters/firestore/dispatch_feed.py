"""The open dispatches pushed by Firestore as they change, behind ``DispatchFeed``.

Scenario: an instance of the runner API holds 200 waiting polls. One real-time listener on
the open-dispatches query (``status in [pending, leased]``) keeps their last state in memory;
while nothing changes it costs no reads at all, and each change costs one read per document
that entered, changed in or left the result. On every push the feed rings ``on_change`` and
the polls check the new state in memory. If the stream ends for good (the client library
already resumes a stream that merely broke), the feed answers None, so polls look at the
store every few seconds, and it opens a new listener after a backoff; the first push of the
new one rings the polls again. Work is found either way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter
from pydantic import ValidationError

from looprelay.adapters.firestore.common import open_client
from looprelay.adapters.firestore.work_items import dispatch_from_document
from looprelay.config.model import FirestoreConfig
from looprelay.core.backoff import backoff_seconds
from looprelay.core.model import DISPATCH_OPEN, DispatchRecord

log = logging.getLogger("looprelay.adapters.firestore.dispatch_feed")

CHECK_SECONDS = 1.0
"""How often the feed checks that its listener still streams (no I/O: a thread's state)."""
REOPEN_MIN_SECONDS = 1.0
REOPEN_MAX_SECONDS = 60.0
REOPEN_DOUBLINGS = 6
"""Waits before opening a listener again: 1, 2, 4 ... 60 s while opens keep failing."""


class FirestoreDispatchFeed:
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
        self._query = dispatches.where(filter=FieldFilter("status", "in", list(DISPATCH_OPEN)))
        self._on_change = on_change
        self._check_seconds = check_seconds
        self._lock = threading.Lock()
        self._open: dict[str, DispatchRecord] | None = None
        self._unreadable: set[str] = set()
        self._listener = 0
        self._reads = 0
        self._opened = 0
        self._watch: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._supervise, name="looprelay-dispatch-feed", daemon=True
        )

    @classmethod
    def from_config(
        cls, cfg: FirestoreConfig, *, on_change: Callable[[], None]
    ) -> FirestoreDispatchFeed:
        """Open the database ``store.firestore`` names and start listening; ``ConfigError``
        without credentials."""
        feed = cls(open_client(cfg), on_change=on_change, collection_prefix=cfg.collection_prefix)
        feed.start()
        return feed

    def start(self) -> None:
        """Open the listener (on a thread of the feed's own, which also re-opens it)."""
        self._thread.start()

    def open_dispatches(self) -> Sequence[DispatchRecord] | None:
        """See ``DispatchFeed.open_dispatches``. None also while a document cannot be read
        as a dispatch: a poll then looks at the store rather than miss it."""
        with self._lock:
            if self._open is None or self._unreadable:
                return None
            return list(self._open.values())

    @property
    def reads(self) -> int:
        """Document reads the listeners have been billed for so far: one per document that
        entered, changed in or left the result, and at least one for each first result."""
        with self._lock:
            return self._reads

    @property
    def listeners_opened(self) -> int:
        """How many listeners the feed has opened (1 until one drops)."""
        with self._lock:
            return self._opened

    def close(self) -> None:
        """See ``DispatchFeed.close``."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self._open = None
            self._listener += 1  # a push still in flight is dropped
        if self._watch is not None:
            self._watch.unsubscribe()

    def _supervise(self) -> None:
        # Keep one listener open: check it every few seconds, re-open it after a backoff
        # that grows while new listeners fail before their first push.
        failures = 0
        while not self._stop.is_set():
            watch = self._watch
            if watch is not None and watch.is_active:
                self._stop.wait(self._check_seconds)
                continue
            if watch is not None:
                failures = 1 if self._dropped() else failures + 1
                wait = backoff_seconds(
                    failures,
                    min_backoff=REOPEN_MIN_SECONDS,
                    max_backoff=REOPEN_MAX_SECONDS,
                    max_doublings=REOPEN_DOUBLINGS,
                )
                if self._stop.wait(wait):
                    return
            self._watch = self._listen()

    def _listen(self) -> Any:
        with self._lock:
            self._listener += 1
            self._opened += 1
            listener = self._listener

        def pushed(docs: list[Any], changes: list[Any], read_time: Any) -> None:
            self._pushed(listener, docs, changes)

        return self._query.on_snapshot(pushed)

    def _dropped(self) -> bool:
        # The listener ended for good: polls must look at the store until a new one pushes.
        # Returns whether it had pushed at all (else the open itself is failing).
        with self._lock:
            had_pushed = self._open is not None
            self._open = None
        log.warning(
            "the dispatch listener stopped; polls look at the store every few seconds until"
            " a new one is open"
        )
        self._on_change()
        return had_pushed

    def _pushed(self, listener: int, docs: list[Any], changes: list[Any]) -> None:
        changed = {change.document.id for change in changes}
        with self._lock:
            if listener != self._listener:
                return  # a listener the feed already gave up on
            first = self._open is None
            before = self._open or {}
            current: dict[str, DispatchRecord] = {}
            unreadable: set[str] = set()
            for doc in docs:
                held = None if doc.id in changed else before.get(doc.id)
                if held is None:
                    held = _slim(doc.id, doc.to_dict() or {}, unreadable)
                if held is not None:
                    current[doc.id] = held
            if unreadable - self._unreadable:
                log.error(
                    "dispatches %s cannot be read; polls look at the store while they stay",
                    ", ".join(sorted(unreadable)),
                )
            self._open, self._unreadable = current, unreadable
            self._reads += max(len(changes), 1 if first else 0)
        self._on_change()


def _slim(doc_id: str, data: dict[str, Any], unreadable: set[str]) -> DispatchRecord | None:
    # What scheduling needs, without the prompt and result texts (up to 60,000 characters
    # each): the lease reads the whole document again anyway.
    try:
        record = dispatch_from_document(data)
    except ValidationError:
        unreadable.add(doc_id)
        return None
    return record.model_copy(update={"prompt": "", "result": "", "detail": ""})
