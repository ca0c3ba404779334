"""Per-thread order of deliveries: the key rule, the group a delivery is ordered within, and
the order the holder of a group's inbox hands them off in (``service.inbox``).

The key rule (docs/architecture.md "Per-work-item order"): every delivery is keyed by the
moment the webhook received it. New comments alone also carry their own time: a run of
comments each received within ``COMMENT_WINDOW`` of the one before is handed off in the order
GitHub created them (``created_at``, then id: ``created_at`` has whole seconds), in the places
those comments hold among the other events, which never move.

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
    "MAX_COMMENT_RUN",
    "ORDER_LOOKBACK",
    "Queued",
    "arrange",
    "may_go_ahead",
    "order_group",
    "order_key",
    "queued",
    "ready_at",
    "runs",
]

ORDER_LOOKBACK = timedelta(hours=1)
"""Only an unsettled delivery received this recently is in its group's inbox: an older one
is long dead (the queue gave up on it), and handing it off now would be out of all order."""
COMMENT_WINDOW = timedelta(seconds=1)
"""How far apart in receipt new comments may be and still be reordered by their own time:
what GitHub's sending and the queue's dispatching may spread a burst over (four embedded
dispatchers on a busy machine bring 15 comments in over about a second)."""
MAX_COMMENT_RUN = timedelta(seconds=3)
"""How long a run of comments so reordered may last: a steady stream is handed off anyway."""


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
    then each run of new comments (``runs``) put in creation order in the places the run
    holds. Never raises."""
    ordered = sorted(waiting, key=lambda q: (q.order_key, q.delivery_id))
    arranged = list(ordered)
    for run in runs(ordered):
        made = sorted((ordered[place] for place in run), key=lambda q: q.made or ())
        for place, comment in zip(run, made, strict=True):
            arranged[place] = comment
    return arranged


def runs(ordered: Sequence[Queued]) -> list[list[int]]:
    """The places in ``ordered`` of each run of new comments: each received within
    ``COMMENT_WINDOW`` of the one before, all within ``MAX_COMMENT_RUN`` of the first."""
    found: list[list[int]] = []
    for place, q in enumerate(ordered):
        if q.made is None:
            continue
        run = found[-1] if found else []
        if run and _continues(ordered[run[0]], ordered[run[-1]], q):
            run.append(place)
        else:
            found.append([place])
    return found


def ready_at(ordered: Sequence[Queued], place: int) -> datetime:
    """When ``ordered[place]`` may be handed off: anything but a new comment at once; a new
    comment once its run has been quiet for ``COMMENT_WINDOW`` (a comment made earlier and
    received later still goes first), at most ``MAX_COMMENT_RUN`` after the run began."""
    for run in runs(ordered):
        if place in run:
            first, last = ordered[run[0]], ordered[run[-1]]
            return min(last.received_at + COMMENT_WINDOW, first.received_at + MAX_COMMENT_RUN)
    return ordered[place].received_at


def _continues(first: Queued, last: Queued, later: Queued) -> bool:
    return (
        later.received_at - last.received_at <= COMMENT_WINDOW
        and later.received_at - first.received_at <= MAX_COMMENT_RUN
    )


def may_go_ahead(stuck_since: datetime | None, *, now: datetime, bound: timedelta) -> bool:
    """Whether the deliveries behind one whose handler has failed since ``stuck_since`` may go
    ahead of it: once it has kept failing for ``bound``. Never raises."""
    return stuck_since is not None and now - stuck_since >= bound
