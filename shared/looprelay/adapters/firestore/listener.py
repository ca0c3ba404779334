"""One Firestore real-time listener on a query, kept open: what the dispatch feed and the
runner directory share.

Scenario: an instance of the runner API holds hundreds of waiting polls and authenticates
every request. One listener keeps the query's result in memory, parsed; while nothing changes
it costs no reads at all, and each push costs one read per document that entered, changed in
or left the result (at least one for the first). If the stream ends for good (the client
library already resumes a stream that merely broke), the result is dropped, so callers read
the store themselves, and a new listener is opened after a backoff; its first push brings the
whole result again.

The listener's thread and its gRPC stream belong to the process that started it. A process
forked from it (gunicorn's worker, forked from the arbiter that imported the functions) holds a
copy of the last result that nothing updates any more, and a gRPC stream that must not be
touched: there the listener answers None, as one not yet open, until it is started in that
process too. So nothing is vouched for from memory that was not pushed to this very process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.cloud import firestore
from pydantic import ValidationError

from looprelay.core.backoff import backoff_seconds

log = logging.getLogger("looprelay.adapters.firestore.listener")

CHECK_SECONDS = 1.0
"""How often a listener is checked to still stream (no I/O: a thread's state)."""
REOPEN_MIN_SECONDS = 1.0
REOPEN_MAX_SECONDS = 60.0
REOPEN_DOUBLINGS = 6
"""Waits before opening a listener again: 1, 2, 4 ... 60 s while opens keep failing."""

T = TypeVar("T")

OnChange = Callable[[Sequence[T] | None], None]
"""Called after each push with what it changed: each document that entered or changed in
the result as now parsed, each that left it as last held (all of them on a listener's first
push), or None when the result was dropped (callers read the store until the next push)."""


@dataclass(frozen=True)
class Listened(Generic[T]):
    """The query's result as last pushed: each readable document by id, and the ids of those
    ``parse`` refused. Replaced whole on each push, never changed in place."""

    documents: Mapping[str, T]
    unreadable: frozenset[str]


class ListenedQuery(Generic[T]):
    """One listener on ``query``, re-opened when it drops. Safe across threads;
    :meth:`start` it once, :meth:`close` it once."""

    def __init__(
        self,
        query: firestore.Query | firestore.CollectionReference | Callable[[], firestore.Query],
        *,
        parse: Callable[[dict[str, Any]], T],
        name: str,
        fallback: str,
        on_change: OnChange[T] = lambda _changed: None,
        check_seconds: float = CHECK_SECONDS,
        renew_seconds: float | None = None,
    ) -> None:
        """Listen to ``query`` (or to the query a function makes, asked again for each new
        listener), keeping each document as ``parse`` makes it (a ``ValidationError`` marks it
        unreadable) and calling ``on_change`` (on the listener's thread; it must not block)
        after each push and each drop. With ``renew_seconds``, a listener that old is replaced
        by a new one on a query made afresh (a window that moves keeps its result small); the
        old result stands until the new one's first push. ``name`` and ``fallback`` (what
        callers do meanwhile) word the logs."""
        self._query: Callable[[], Any] = query if callable(query) else (lambda: query)
        self._renew_seconds = renew_seconds
        self._parse = parse
        self._name, self._fallback = name, fallback
        self._on_change = on_change
        self._check_seconds = check_seconds
        self._lock = threading.Lock()
        self._result: Listened[T] | None = None
        self._listener = 0
        self._reads = 0
        self._opened = 0
        self._watch: Any = None
        self._opened_at = 0.0
        self._retiring: Any = None
        """A listener being renewed: unsubscribed once its successor has pushed."""
        self._pushed_by = 0
        """The listener whose push the result holds."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_in: int | None = None
        """The id of the process whose thread listens: the only one whose result is live."""

    def start(self) -> None:
        """Open the listener (on a thread of its own, which also re-opens it) in this process.
        Once a process: a second call in the process that started it does nothing."""
        with self._lock:
            if self._started_in == os.getpid():
                return
            self._started_in = os.getpid()
            self._result = None  # pushed to the process this one was forked from, if any
            self._watch = self._retiring = None
            self._thread = threading.Thread(
                target=self._supervise, name=f"looprelay-{self._name}-listener", daemon=True
            )
            self._thread.start()

    def current(self) -> Listened[T] | None:
        """The result as last pushed to this process, or None while no listener of this
        process has pushed since it opened (never started here included)."""
        with self._lock:
            return self._result if self._started_in == os.getpid() else None

    @property
    def reads(self) -> int:
        """Document reads the listeners have been billed for so far: one per document that
        entered, changed in or left the result, and at least one for each first result."""
        with self._lock:
            return self._reads

    @property
    def listeners_opened(self) -> int:
        """How many listeners were opened (1 until one drops)."""
        with self._lock:
            return self._opened

    def close(self) -> None:
        """Stop listening; :meth:`current` answers None from then on."""
        self._stop.set()
        here = self._started_in == os.getpid()
        if here and self._thread is not None and self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self._result = None
            self._listener += 1  # a push still in flight is dropped
        for watch in (self._watch, self._retiring) if here else ():
            if watch is not None:
                watch.unsubscribe()  # another process's stream is not this one's to end

    def _supervise(self) -> None:
        # Keep one listener open: check it every few seconds, re-open it after a backoff
        # that grows while new listeners fail before their first push.
        failures = 0
        while not self._stop.is_set():
            watch = self._watch
            if watch is not None and watch.is_active:
                self._renew_when_due()
                self._stop.wait(self._check_seconds)
                continue
            if watch is not None:
                if self._retiring is not None:
                    self._retiring, retiring = None, self._retiring
                    retiring.unsubscribe()
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

    def _renew_when_due(self) -> None:
        with self._lock:
            retiring = self._retiring if self._pushed_by == self._listener else None
            if retiring is not None:
                self._retiring = None
        if retiring is not None:
            retiring.unsubscribe()  # its successor pushed: the result no longer needs it
        due = self._renew_seconds is not None and self._retiring is None
        if due and time.monotonic() - self._opened_at >= (self._renew_seconds or 0.0):
            self._retiring = self._watch
            self._watch = self._listen()

    def _listen(self) -> Any:
        with self._lock:
            self._listener += 1
            self._opened += 1
            listener = self._listener
        self._opened_at = time.monotonic()

        def pushed(docs: list[Any], changes: list[Any], read_time: Any) -> None:
            self._pushed(listener, docs, changes)

        return self._query().on_snapshot(pushed)

    def _dropped(self) -> bool:
        # The listener ended for good: callers must read the store until a new one pushes.
        # Returns whether it had pushed at all (else the open itself is failing).
        with self._lock:
            had_pushed = self._result is not None
            self._result = None
        log.warning(
            "the %s listener stopped; %s until a new one is open", self._name, self._fallback
        )
        self._on_change(None)
        return had_pushed

    def _pushed(self, listener: int, docs: list[Any], changes: list[Any]) -> None:
        changed = {change.document.id for change in changes}
        with self._lock:
            if listener != self._listener:
                return  # a listener already given up on
            first = self._pushed_by != listener
            self._pushed_by = listener
            before = self._result
            held = before.documents if before is not None else {}
            current: dict[str, T] = {}
            unreadable: set[str] = set()
            for doc in docs:
                kept = None if doc.id in changed or first else held.get(doc.id)
                if kept is None:
                    kept = self._parsed(doc, unreadable)
                if kept is not None:
                    current[doc.id] = kept
            # What changed, as now parsed, or as last held for what left: work only for what
            # changed (a listener's first push: all of it).
            news = [current[i] for i in (current if first else changed) if i in current]
            news += [held[i] for i in changed if i not in current and i in held]
            if unreadable - (before.unreadable if before is not None else frozenset()):
                log.error(
                    "%s documents %s cannot be read; %s while they stay",
                    self._name,
                    ", ".join(sorted(unreadable)),
                    self._fallback,
                )
            self._result = Listened(current, frozenset(unreadable))
            self._reads += max(len(changes), 1 if first else 0)
        self._on_change(news)

    def _parsed(self, doc: Any, unreadable: set[str]) -> T | None:
        try:
            return self._parse(doc.to_dict() or {})
        except ValidationError:
            unreadable.add(doc.id)
            return None


class ListenerBacked(Generic[T]):
    """What a port held by one ``ListenedQuery`` (set as ``_listened``) does alike: start
    it, count what it was billed, close it."""

    _listened: ListenedQuery[T]

    def start(self) -> None:
        """Open the listener (on a thread of its own, which also re-opens it)."""
        self._listened.start()

    @property
    def reads(self) -> int:
        """Document reads the listeners have been billed for so far (``ListenedQuery.reads``)."""
        return self._listened.reads

    @property
    def listeners_opened(self) -> int:
        """How many listeners have been opened (1 until one drops)."""
        return self._listened.listeners_opened

    def close(self) -> None:
        """Stop listening, for good."""
        self._listened.close()
