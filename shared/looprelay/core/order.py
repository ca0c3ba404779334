"""Per-thread order of deliveries: the key rule, the group a delivery is ordered within, and
the order the holder of a group's inbox hands them off in (``service.inbox``).

The key rule (docs/architecture.md "Per-work-item order"): every delivery is keyed by the
moment the webhook received it. New comments alone also carry their own time: comments
received within ``COMMENT_WINDOW`` of one another are handed off in the order GitHub created
them (``created_at``, then id: ``created_at`` has whole seconds), in the places those comments
hold among the other events, which never move.

Scenario: a label is added, and 0.3 s later comments 1, 2 and 3 are made on issue #7, a
millisecond apart. GitHub sends the four webhooks at once and they are received label, 3, 1,
2. The label keeps its place (received first); the three comments take the three places after
it in the order 1, 2, 3. So the holder hands a comment off only once ``COMMENT_WINDOW`` has
passed since it was received: an earlier-made comment received a little later still goes
first. A delivery that keeps failing (a poison delivery) holds the others back for
``routing.orderWaitSeconds`` from its first failure, never from its receipt: one that only
waited for its turn is never taken for poison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from looprelay.core.envelope import CREATING_ACTIONS, Envelope, order_key

__all__ = [
    "COMMENT_WINDOW",
    "ORDER_LOOKBACK",
    "Queued",
    "arrange",
    "may_go_ahead",
    "order_group",
    "order_key",
    "queued",
]

ORDER_LOOKBACK = timedelta(hours=1)
"""Only an unsettled delivery received this recently is in its group's inbox: an older one
is long dead (the queue gave up on it), and handing it off now would be out of all order."""
COMMENT_WINDOW = timedelta(milliseconds=500)
"""How far apart in receipt new comments may be and still be reordered by their own time."""


def order_group(envelope: Envelope) -> str:
    """Return the group ``envelope`` is ordered within: its repository's issue or pull request
    (``owner/repo#7``, lower case), or ``""`` when it names none (no order is kept)."""
    repository = envelope.repository.full_name.lower() if envelope.repository else ""
    subject = envelope.issue or envelope.pull_request
    if not repository or subject is None:
        return ""
    return f"{repository}#{subject.number}"


@dataclass(frozen=True)
class Queued:
    """A delivery waiting in its group's inbox, as the order rule sees it."""

    delivery_id: str
    order_key: str
    received_at: datetime
    made: tuple[datetime, int] | None = None
    """A new comment's ``created_at`` and id; None for any other delivery."""

    @property
    def ripe_at(self) -> datetime:
        """When it may be handed off: a new comment waits out ``COMMENT_WINDOW``, for one made
        earlier and received later; anything else at once."""
        return self.received_at + COMMENT_WINDOW if self.made else self.received_at


def queued(envelope: Envelope, *, received_at: datetime) -> Queued:
    """The inbox's view of ``envelope``, received by the worker at ``received_at``; never
    raises."""
    comment = envelope.comment
    made = None
    if comment is not None and comment.created_at and envelope.action in CREATING_ACTIONS:
        made = (comment.created_at, comment.id)
    return Queued(envelope.delivery_id, envelope.order_key, received_at, made)


def arrange(waiting: Sequence[Queued]) -> list[Queued]:
    """Return ``waiting`` (one group's inbox) in hand-off order: by key (ties by delivery id),
    then each run of new comments received within ``COMMENT_WINDOW`` of its first put in
    creation order in the places the run holds. Never raises."""
    ordered = sorted(waiting, key=lambda q: (q.order_key, q.delivery_id))
    places = [index for index, q in enumerate(ordered) if q.made is not None]
    arranged = list(ordered)
    run: list[int] = []
    for place in [*places, -1]:
        first = ordered[run[0]] if run else None
        if first is not None and place >= 0 and _within(first, ordered[place]):
            run.append(place)
            continue
        made = sorted((ordered[p] for p in run), key=lambda q: q.made or ())
        for target, comment in zip(run, made, strict=True):
            arranged[target] = comment
        run = [place] if place >= 0 else []
    return arranged


def _within(first: Queued, later: Queued) -> bool:
    return later.received_at - first.received_at <= COMMENT_WINDOW


def may_go_ahead(stuck_since: datetime | None, *, now: datetime, bound: timedelta) -> bool:
    """Whether the deliveries behind one whose handler has failed since ``stuck_since`` may go
    ahead of it: once it has kept failing for ``bound``. Never raises."""
    return stuck_since is not None and now - stuck_since >= bound
