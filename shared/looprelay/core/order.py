"""Per-thread order of deliveries: the key ingress stamps, the group it orders within, and
whether the worker waits for an earlier delivery still in flight.

Scenario: comments 1, 2 and 3 are made on issue #7 a millisecond apart. Their deliveries reach
looprelay in that order, but the queue (four dispatchers, or Cloud Tasks and several worker
instances) could hand 2 to the worker while 1 is still being decided. Each envelope carries
an order key (the comment's ``created_at``, then its id; for other events the moment the
webhook received it) and belongs to the group of its issue or pull request. The embedded
queue runs one task of a group at a time, smallest key first; the worker, for queues that do
not, waits while an earlier-keyed delivery of the group has begun and is not settled yet. A
delivery that keeps failing (a poison delivery) holds the others back at most
``routing.orderWaitSeconds``; after that they go ahead and an event says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from looprelay.core.envelope import Envelope, order_key

__all__ = ["ORDER_LOOKBACK", "Earlier", "OrderVerdict", "judge_order", "order_group", "order_key"]

ORDER_LOOKBACK = timedelta(hours=1)
"""Only an unsettled delivery received this recently can hold a later one back (or be
reported as skipped): an older one is long dead, and saying so on every delivery is noise."""


def order_group(envelope: Envelope) -> str:
    """Return the group ``envelope`` is ordered within: its repository's issue or pull request
    (``owner/repo#7``, lower case), or ``""`` when it names none (no order is kept)."""
    repository = envelope.repository.full_name.lower() if envelope.repository else ""
    subject = envelope.issue or envelope.pull_request
    if not repository or subject is None:
        return ""
    return f"{repository}#{subject.number}"


@dataclass(frozen=True)
class Earlier:
    """An earlier-keyed delivery of the same group that has begun and is not settled."""

    delivery_id: str
    received_at: datetime


@dataclass(frozen=True)
class OrderVerdict:
    """Whether a delivery waits (``wait_for`` names what it waits for), or goes ahead past
    deliveries that held it back too long (``skipped``)."""

    wait_for: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


def judge_order(earlier: Sequence[Earlier], *, now: datetime, bound: timedelta) -> OrderVerdict:
    """Decide whether a delivery waits for ``earlier`` (same group, smaller key, begun, not
    settled): it waits for each that began less than ``bound`` ago, and goes ahead past the
    others (poison deliveries). Expects aware times; never raises."""
    recent = tuple(e.delivery_id for e in earlier if now - e.received_at < bound)
    if recent:
        return OrderVerdict(wait_for=recent)
    return OrderVerdict(skipped=tuple(e.delivery_id for e in earlier))
