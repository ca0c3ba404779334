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

Turns: a review with three inline comments comes as four deliveries (three
``pull_request_review_comment`` and the ``pull_request_review``), received at once in any
order. They are one turn of the session: the holder waits ``OrderRules.turn_window`` from the
first one's receipt, then hands off the review with its comments joined to it (``turns``), in
the place of the first. With ``OrderRules.comment_bursts``, a burst of one author's new
comments (a run, as above) is one turn the same way. A part that is marked as the loop's own
or names a control command is never joined: it is handed off alone, so every command is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from looprelay.core.control import Keywords, find_commands
from looprelay.core.envelope import CREATING_ACTIONS, Envelope, order_key

__all__ = [
    "COMMENT_WINDOW",
    "MAX_COMMENT_RUN",
    "ORDER_LOOKBACK",
    "TURN_WINDOW",
    "OrderRules",
    "Queued",
    "arrange",
    "may_go_ahead",
    "order_group",
    "order_key",
    "queued",
    "ready_at",
    "runs",
    "turns",
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
TURN_WINDOW = timedelta(seconds=2)
"""How long after a turn's first part was received its others may join it: GitHub sends a
review's deliveries within about a second of each other."""
_REVIEW_EVENTS = frozenset({"pull_request_review", "pull_request_review_comment"})


@dataclass(frozen=True)
class OrderRules:
    """The settings the order rule and the turns follow (``routing``'s order settings)."""

    comment_window: timedelta = COMMENT_WINDOW
    max_comment_run: timedelta = MAX_COMMENT_RUN
    turn_window: timedelta = TURN_WINDOW
    review_turns: bool = False
    """A review's deliveries are one turn."""
    comment_bursts: bool = False
    """A run of one author's new comments is one turn."""
    keywords: Keywords | None = None
    """The control commands a part must not name to be joined (None: nothing is joined)."""

    @property
    def longest_wait(self) -> timedelta:
        """The most the holder waits for a run or a turn before handing it off anyway."""
        turning = self.review_turns or self.comment_bursts
        return max(self.max_comment_run, self.turn_window if turning else timedelta(0))


DEFAULT_RULES = OrderRules()


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
    turn: str = ""
    """The turn it may share with others (``turns``): ``review:ID:LOGIN`` or ``burst:LOGIN``;
    empty when it is a turn of its own."""
    lead: bool = False
    """It leads its turn when there: the review itself, whose comments join it."""


def queued(
    envelope: Envelope, *, received_at: datetime, rules: OrderRules = DEFAULT_RULES
) -> Queued:
    """The inbox's view of ``envelope``, received by the worker at ``received_at``; never
    raises."""
    comment = envelope.comment
    made = None
    if comment is not None and comment.created_at and envelope.action in CREATING_ACTIONS:
        made = (comment.created_at, comment.id)
    return Queued(
        envelope.delivery_id,
        envelope.order_key,
        received_at,
        made,
        turn=_turn(envelope, rules),
        lead=envelope.event == "pull_request_review",
    )


def _turn(envelope: Envelope, rules: OrderRules) -> str:
    comment = envelope.comment
    if (
        rules.keywords is None
        or comment is None
        or envelope.action not in CREATING_ACTIONS
        or comment.marked
        or find_commands(comment.body, rules.keywords)
    ):
        return ""
    author = envelope.sender.login.lower() if envelope.sender else ""
    if rules.review_turns and envelope.event in _REVIEW_EVENTS and comment.review_id is not None:
        return f"review:{comment.review_id}:{author}"
    if rules.comment_bursts and envelope.event == "issue_comment" and author:
        return f"burst:{author}"
    return ""


def arrange(waiting: Sequence[Queued], rules: OrderRules = DEFAULT_RULES) -> list[Queued]:
    """Return ``waiting`` (one group's inbox) in hand-off order: by key (ties by delivery id),
    then each run of new comments (``runs``) put in creation order in the places the run
    holds. Never raises."""
    ordered = sorted(waiting, key=lambda q: (q.order_key, q.delivery_id))
    arranged = list(ordered)
    for run in runs(ordered, rules):
        made = sorted((ordered[place] for place in run), key=lambda q: q.made or ())
        for place, comment in zip(run, made, strict=True):
            arranged[place] = comment
    return arranged


def runs(ordered: Sequence[Queued], rules: OrderRules = DEFAULT_RULES) -> list[list[int]]:
    """The places in ``ordered`` of each run of new comments: each received within
    ``rules.comment_window`` of the run's latest receipt so far, all within
    ``rules.max_comment_run`` of its earliest. Receipts, not places: the queue may bring a
    delivery received first by the webhook to the worker last."""
    found: list[list[int]] = []
    spans: list[tuple[datetime, datetime]] = []  # each run's earliest and latest receipt
    for place, q in enumerate(ordered):
        if q.made is None:
            continue
        if found and _continues(spans[-1], q.received_at, rules):
            found[-1].append(place)
            earliest, latest = spans[-1]
            spans[-1] = (min(earliest, q.received_at), max(latest, q.received_at))
        else:
            found.append([place])
            spans.append((q.received_at, q.received_at))
    return found


def ready_at(ordered: Sequence[Queued], place: int, rules: OrderRules = DEFAULT_RULES) -> datetime:
    """When ``ordered[place]`` may be handed off: anything but a new comment at once; a new
    comment once its run has been quiet for ``rules.comment_window`` since its latest receipt
    (a comment made earlier and received later still goes first), at most
    ``rules.max_comment_run`` after the run began."""
    for run in runs(ordered, rules):
        if place in run:
            received = [ordered[member].received_at for member in run]
            return min(max(received) + rules.comment_window, min(received) + rules.max_comment_run)
    return ordered[place].received_at


def _continues(span: tuple[datetime, datetime], received: datetime, rules: OrderRules) -> bool:
    earliest, latest = span
    return (
        received - latest <= rules.comment_window and received - earliest <= rules.max_comment_run
    )


@dataclass(frozen=True)
class Turn:
    """One hand-off: a delivery (``lead``) and those joined to it, in creation order."""

    lead: Queued
    joined: tuple[Queued, ...]
    ready_at: datetime
    """When it may be handed off: its parts' own readiness, and for a turn of several
    parts ``rules.turn_window`` after the first was received."""

    @property
    def parts(self) -> tuple[Queued, ...]:
        """The lead, then the joined."""
        return (self.lead, *self.joined)


def turns(arranged: Sequence[Queued], rules: OrderRules = DEFAULT_RULES) -> list[Turn]:
    """``arranged`` (``arrange``'s order) as hand-offs: each part of a review (or of one
    author's run of comments, with ``rules.comment_bursts``) joined into one turn in the place
    of its first part, led by the review itself when it is there. Never raises."""
    by_run = {place: n for n, run in enumerate(runs(arranged, rules)) for place in run}
    groups: dict[str, list[int]] = {}
    order: list[list[int]] = []
    for place, q in enumerate(arranged):
        key = q.turn
        if key.startswith("burst:"):
            key = f"{key}@{by_run.get(place, place)}"  # one burst is one run
        if not key:
            order.append([place])
        elif key in groups:
            groups[key].append(place)
        else:
            groups[key] = [place]
            order.append(groups[key])
    found: list[Turn] = []
    for places in order:
        parts = [arranged[place] for place in places]
        lead = next((q for q in parts if q.lead), parts[0])
        joined = tuple(q for q in parts if q is not lead)
        ready = max(ready_at(arranged, place, rules) for place in places)
        if len(parts) > 1 or lead.turn:
            ready = max(ready, min(q.received_at for q in parts) + rules.turn_window)
        found.append(Turn(lead, joined, ready))
    return found


def may_go_ahead(stuck_since: datetime | None, *, now: datetime, bound: timedelta) -> bool:
    """Whether the deliveries behind one whose handler has failed since ``stuck_since`` may go
    ahead of it: once it has kept failing for ``bound``. Never raises."""
    return stuck_since is not None and now - stuck_since >= bound
