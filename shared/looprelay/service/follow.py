"""Following the event log (``looprelay events --follow``): every event printed once, however
many writers append to it at once.

Scenario: four worker instances append events while an operator follows the log on
Firestore. An event's place in the log is its commit time, which the server sets; the follower
has read up to an event committed at T when another writer's event lands with a commit time a
hair before T. Asking only for what comes after T would never show it, so the store answers
``after`` with what is newer *and* what was written shortly before it (``Store.list_events``),
and the follower drops what it has printed already, by cursor.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator

from looprelay.core.model import EventRecord

FOLLOW_POLL_SECONDS = 1.0
"""How long a follower waits when the log had nothing new."""
REMEMBERED = 100_000
"""Cursors a follower remembers: far more than a store's overlap window can hold again."""

Listing = Callable[..., list[EventRecord]]
"""``Store.list_events`` with the follower's filters bound: called with ``after=``."""


def follow(
    listing: Listing,
    *,
    cursor: str | None,
    poll_seconds: float = FOLLOW_POLL_SECONDS,
    sleep: Callable[[float], object] = time.sleep,
) -> Iterator[list[EventRecord]]:
    """Yield the events written after ``cursor`` (None: from the start), batch by batch, each
    event once, in the order the store lists them; ends when a ``sleep`` returns true (as a
    set ``threading.Event``'s ``wait`` does), else when the caller stops iterating.
    Raises what ``listing`` raises."""
    seen: set[str] = set()
    order: deque[str] = deque()
    while True:
        listed = listing(after=cursor)
        fresh = [event for event in listed if event.cursor not in seen]
        for event in fresh:
            seen.add(event.cursor)
            order.append(event.cursor)
            if len(order) > REMEMBERED:
                seen.discard(order.popleft())
        if listed:
            newest = max(event.cursor for event in listed)
            cursor = newest if cursor is None else max(cursor, newest)
        if fresh:
            yield fresh
        elif sleep(poll_seconds):
            return
