"""Which of the App's webhook deliveries to ask GitHub for again.

GitHub never retries a failed delivery by itself; it keeps every attempt for 3 days and
redelivers one on request (docs: "Handling failed webhook deliveries"). A redelivery is a new
attempt with the same ``guid`` (the ``X-GitHub-Delivery`` header), so deliveries are judged per
guid: any 2xx attempt means GitHub delivered it; otherwise its newest attempt is the one to
redeliver, as in GitHub's own "Automatically redelivering failed deliveries" example.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime, timedelta

from looprelay.ports import AppDelivery

REDELIVERY_WINDOW = timedelta(days=3)
"""GitHub lists and redelivers the deliveries of the past 3 days."""


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
    deliveries: Iterable[AppDelivery],
    *,
    settled_guids: Collection[str],
    now: datetime,
    window: timedelta,
    limit: int,
) -> list[AppDelivery]:
    """Return the failed deliveries (see :func:`failed_deliveries`) the ledger does not hold,
    newest first, at most ``limit`` of them.

    ``settled_guids`` are the guids the delivery ledger holds: those reached the worker (GitHub
    may still call them failed, e.g. when the ack took over 10 s). Raises ``ValueError`` for a
    negative ``limit``.
    """
    if limit < 0:
        raise ValueError(f"limit must be 0 or more, got {limit}")
    failed = failed_deliveries(deliveries, now=now, window=window)
    return [delivery for delivery in failed if delivery.guid not in settled_guids][:limit]


def _order(delivery: AppDelivery) -> tuple[datetime, int]:
    # Attempt ids grow with time; they break ties between attempts of the same second.
    return delivery.delivered_at, delivery.id
