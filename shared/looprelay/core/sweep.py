"""Which of the App's webhook deliveries to ask GitHub for again, and where the next sweep
starts.

GitHub never retries a failed delivery by itself; it keeps every attempt for 3 days and
redelivers one on request (docs: "Handling failed webhook deliveries"). A redelivery is a new
attempt with the same ``guid`` (the ``X-GitHub-Delivery`` header), so deliveries are judged per
guid: any 2xx attempt means GitHub delivered it; otherwise its newest attempt is the one to
redeliver, as in GitHub's own "Automatically redelivering failed deliveries" example.

GitHub lists attempts newest first, 100 a page, with no way to start from the old end. At 100
deliveries a second the 3-day window holds 26 million attempts, so a sweep lists back only to
where the previous one left off: its ``resume point``, kept in the store. Every failure older
than the resume point has been dealt with; a failure a run could not ask for (its budget or
GitHub's rate limit ran out) keeps the resume point at or before it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta

from looprelay.ports import AppDelivery

REDELIVERY_WINDOW = timedelta(days=3)
"""GitHub lists and redelivers the deliveries of the past 3 days."""
LISTING_OVERLAP = timedelta(minutes=2)
"""How far back past the newest attempt seen a later sweep lists again: an attempt still in
flight (GitHub waits up to 10 s for an answer) is listed after newer ones, and clocks differ."""


def failed_deliveries(
    deliveries: Iterable[AppDelivery], *, now: datetime, window: timedelta
) -> list[AppDelivery]:
    """Return the newest attempt of every guid no attempt of which succeeded, newest first.

    Expects timezone-aware times; only attempts delivered at most ``window`` before ``now``
    count (an older one can no longer be redelivered; a later one, from clock skew, does).
    Raises ``TypeError`` when ``now`` and the delivery times are not both aware.
    """
    newest: dict[str, AppDelivery] = {}
    delivered: set[str] = set()
    for delivery in deliveries:
        if 200 <= delivery.status_code < 300:
            delivered.add(delivery.guid)
        current = newest.get(delivery.guid)
        if current is None or _order(delivery) > _order(current):
            newest[delivery.guid] = delivery
    failed = [
        delivery
        for guid, delivery in newest.items()
        if guid not in delivered and delivery.delivered_at >= now - window
    ]
    return sorted(failed, key=_order, reverse=True)


def deliveries_to_redeliver(
    failed: Iterable[AppDelivery], *, settled_guids: Collection[str]
) -> list[AppDelivery]:
    """Return the ``failed`` deliveries (see :func:`failed_deliveries`) the ledger does not
    hold, oldest first: the oldest are the nearest to leaving GitHub's window, and asking for
    them first lets the resume point move on.

    ``settled_guids`` are the guids the delivery ledger holds: those reached the worker (GitHub
    may still call them failed, e.g. when the ack took over 10 s).
    """
    return sorted((d for d in failed if d.guid not in settled_guids), key=_order)


def listing_start(resume: datetime | None, *, now: datetime, window: timedelta) -> datetime:
    """How far back this sweep lists: the stored resume point, never past the window."""
    oldest = now - window
    return oldest if resume is None else max(resume, oldest)


def next_resume_point(
    *,
    start: datetime,
    listed: Sequence[AppDelivery],
    complete: bool,
    unhandled: Iterable[AppDelivery],
    overlap: timedelta = LISTING_OVERLAP,
) -> datetime:
    """Where the next sweep lists back to; never earlier than ``start``, this one's.

    ``complete``: the listing reached ``start`` (no rate limit, page or time budget cut it),
    else the unread part must be listed again and the point stays. ``unhandled``: the failures
    this run found but did not ask for (over the budget, or after GitHub said to stop): the
    next run must list back to the oldest of them. Otherwise the newest attempt seen, less
    ``overlap``.
    """
    if not complete:
        return start
    oldest_unhandled = min((d.delivered_at for d in unhandled), default=None)
    if oldest_unhandled is not None:
        return max(start, oldest_unhandled)
    newest = max((d.delivered_at for d in listed), default=None)
    return start if newest is None else max(start, newest - overlap)


def _order(delivery: AppDelivery) -> tuple[datetime, int]:
    # Attempt ids grow with time; they break ties between attempts of the same second.
    return delivery.delivered_at, delivery.id
