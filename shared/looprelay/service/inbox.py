"""Each issue's or pull request's inbox: its deliveries handed off one at a time, in order,
whatever order the queue brings them in (docs/decisions/0011-ordered-inbox-per-issue.md).

Scenario: comments 1, 2 and 3 on issue #7 reach three worker instances at once, 3 first. Each
worker has appended its delivery to the inbox (the group's unsettled ledger records) before
it gets here. The worker with 3 takes the inbox's short lease, lists the inbox, finds 1, 2
and 3, and hands them off in that order (``core.order.arrange``). The workers with 1 and 2
cannot take the lease: each knocks and answers ``Transient`` at once (the queue retries it
later and finds it settled), so the queue's dispatchers bring the rest of a burst in
meanwhile. The holder releases only if nobody knocked since it last listed; otherwise it lists
again, so nothing appended meanwhile is left behind.

A handler that fails (``Transient``) at the head stops the drain; the inbox records since
when it has been stuck, and the next attempt to come (the queue's retry of any of its
deliveries) starts again from the head. Once it has been stuck for ``order_wait`` the others
go ahead of the failing ones, and ``delivery.went_ahead`` says which. A holder that dies
leaves its lease to lapse (``lease``); then the next attempt takes it.

A turn that is not ready yet (a run of comments not quiet, a review's other parts to come) is
not waited for inside the attempt, which holds a queue dispatcher: the drain queues a wake for
the moment it is ready (``core.wake``) and ends, and every delivery left in the inbox is the
wake's to hand off. Only a wait too short to be worth a task, or one no wake could be queued
for, is slept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from secrets import token_hex

from looprelay.core.envelope import Envelope, joined_part
from looprelay.core.model import DeliveryRecord, EventRecord, InboxRecord
from looprelay.core.order import (
    DEFAULT_RULES,
    ORDER_LOOKBACK,
    OrderRules,
    Turn,
    arrange,
    may_go_ahead,
    order_key,
    queued,
    turns,
)
from looprelay.errors import Transient
from looprelay.ports import Clock, Store

log = logging.getLogger("looprelay.service.inbox")

WENT_AHEAD = "delivery.went_ahead"
"""Event: a delivery went ahead of earlier ones of its group whose handlers kept failing."""
ARRIVED_LATE = "delivery.arrived_late"
"""Event: a delivery reached its inbox after a later-keyed one had been handed off."""
DEFAULT_ORDER_WAIT = timedelta(seconds=5)
"""``routing.orderWaitSeconds``' default: how long failing deliveries hold the others back."""
INBOX_LEASE = timedelta(seconds=15)
"""How long an inbox stays with a holder that stopped renewing it (it died, or hung)."""
BATCH = 50
"""Deliveries listed from an inbox at once; a longer inbox is drained in several lists."""
MAX_RELEASES = 20
"""Drains in a row one holder makes while knocks keep coming, before leaving the rest."""
SLEEP_AT_MOST = 0.25
"""The longest wait for a turn a drain sleeps rather than queue a wake for it (seconds)."""

HandOff = Callable[[Envelope, DeliveryRecord, tuple[str, ...], tuple[DeliveryRecord, ...]], None]
"""Handle one turn and settle it: the lead's envelope (the others' joined to it), its record,
the ids it goes ahead of, and the records of the deliveries joined to it. Raises
``Transient`` when its handler failed for now (the deliveries stay unsettled)."""
Defer = Callable[[str, datetime], bool]
"""Queue a wake of the group's inbox at the moment given (``core.wake``); return whether one
is queued (False: sleep instead). Raises ``Transient``."""


@dataclass(frozen=True)
class Drained:
    """How a drain ended, the inbox left with nothing of its own to hand off: empty, or only
    failing deliveries left (``failing``), or waiting for a wake at ``woken_at``, to which
    every delivery left in it belongs."""

    woken_at: datetime | None = None
    failing: bool = False


@dataclass(frozen=True)
class _Pass:
    """One drain pass's end: the inbox's state, why it stopped with deliveries left ("": it
    did not), and how it ended otherwise."""

    inbox: InboxRecord
    stopped: str = ""
    drained: Drained = Drained()


class Inbox:
    """Drains order groups' inboxes; one instance serves many threads."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        hand_off: HandOff,
        lease: timedelta = INBOX_LEASE,
        order_wait: timedelta = DEFAULT_ORDER_WAIT,
        rules: OrderRules = DEFAULT_RULES,
        drain_seconds: float | None = None,
        defer: Defer | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``lease`` is how long a dead holder keeps its inbox: a live one renews it before
        each hand-off and every third of it meanwhile (``_Keeper``). ``drain_seconds`` bounds
        one attempt's drain (the queue gives up on a longer one and tries again): past it, no
        further delivery is handed off and the rest is left to the next attempt. ``defer``
        queues wakes for turns not ready yet; without it every wait is slept."""
        self._store = store
        self._clock = clock
        self._hand_off = hand_off
        self._lease = lease
        self._order_wait = order_wait
        self._rules = rules
        self._drain_seconds = drain_seconds
        self._defer = defer
        self._sleep = sleep

    def deliver(self, record: DeliveryRecord) -> Drained:
        """Hand ``record`` (begun, unsettled, of a group) off in its group's order: drain the
        group's inbox unless another attempt is draining it. See ``drain``."""
        return self.drain(record.order_group)

    def drain(self, group: str) -> Drained:
        """Hand off, in order, what ``group``'s inbox holds, unless another attempt is
        draining it; return how the drain ended.

        Raises ``Transient`` (the queue retries; the retry finds its delivery settled, or
        drains) when another attempt holds the inbox (it knocked, so the holder hands its
        delivery off), this drain lost its lease, or a failing delivery holds it back. The
        attempt never waits for the holder: a queue with few dispatchers must bring the rest
        of a burst in meanwhile.
        """
        holder = token_hex(8)
        inbox = self._take(group, holder)
        if inbox is None:
            # Its holder hands this one off; the retry (after the lease, should the holder
            # die) only confirms it. Sooner, a long drain would spend the queue's attempts.
            raise Transient(
                f"the inbox of {group} is being drained; it hands this one off",
                retry_after=self._lease.total_seconds(),
            )
        ends = None if self._drain_seconds is None else time.monotonic() + self._drain_seconds
        # An attempt that sleeps holds a queue dispatcher, and a backlog brings a group's
        # deliveries in one by one: all its sleeps together are bounded, whatever the clock
        # says, and past that it hands off what it has.
        waits = _Waits(self._rules.longest_wait.total_seconds())
        with _Keeper(inbox, renew=self._renew, every=self._lease.total_seconds() / 3) as keeper:
            for _ in range(MAX_RELEASES):
                ended = self._drain(inbox, keeper, ends, waits)
                inbox = ended.inbox
                if ended.stopped:
                    self._leave(inbox)
                    raise Transient(f"the inbox of {group}: {ended.stopped}")
                if self._store.release_inbox(inbox):
                    return ended.drained
                retaken = self._take(group, holder)  # knocked meanwhile: its knocks, fresh
                if retaken is None:
                    raise Transient(f"lost the inbox of {group}; its next holder drains it")
                inbox = keeper.inbox = retaken
            self._leave(inbox)
        raise Transient(f"the inbox of {group} kept being knocked on; the knockers drain it")

    def _renew(self, inbox: InboxRecord) -> InboxRecord | None:
        return self._store.keep_inbox(inbox, until=self._clock.now() + self._lease)

    def _take(self, group: str, holder: str) -> InboxRecord | None:
        now = self._clock.now()
        return self._store.take_inbox(group, holder=holder, now=now, until=now + self._lease)

    def _leave(self, inbox: InboxRecord) -> None:
        """Release even though knocks came: the knockers' retries start the next drain."""
        for _ in range(MAX_RELEASES):
            kept = self._renew(inbox)
            if kept is None or self._store.release_inbox(kept):
                return

    def _drain(
        self, inbox: InboxRecord, keeper: _Keeper, ends: float | None, waits: _Waits
    ) -> _Pass:
        """Hand off what the inbox holds, list after list, until ``ends`` (monotonic); a turn
        not ready yet is left to a wake, or waited for out of ``waits``."""
        while True:
            now = self._clock.now()
            since = order_key(now - ORDER_LOOKBACK)
            listed = self._store.list_inbox(inbox.group, from_key=since, limit=BATCH)
            envelopes = {r.delivery_id: Envelope.model_validate_json(r.envelope) for r in listed}
            records = {r.delivery_id: r for r in listed}
            arranged = arrange(
                [
                    queued(envelopes[r.delivery_id], received_at=r.received_at, rules=self._rules)
                    for r in listed
                ],
                self._rules,
            )
            skipped: list[str] = []
            handed = 0
            # Late is what comes after this listing's deliveries were handed off: within one
            # listing, the turns' order is the order (a run's comments by creation, not key).
            drained_before = inbox.drained_key
            for turn in turns(arranged, self._rules):
                if ends is not None and time.monotonic() >= ends:
                    return _Pass(
                        inbox, "drained for the attempt's budget; the next attempt goes on"
                    )
                wait = (turn.ready_at - self._clock.now()).total_seconds()
                if wait > SLEEP_AT_MOST and self._woken(inbox.group, turn.ready_at):
                    return _Pass(inbox, drained=Drained(turn.ready_at, failing=bool(skipped)))
                if wait > 0 and waits.left > 0:
                    # A run of new comments waits until it is quiet, for one made earlier, and
                    # a turn for its other parts; then the inbox is listed again: what came
                    # meanwhile may go before it, or join it.
                    pause = min(wait, waits.left)
                    self._sleep(pause)
                    waits.left -= pause
                    break
                inbox, ok = self._one(
                    inbox, turn, envelopes, records, skipped, drained_before=drained_before
                )
                keeper.inbox = inbox
                if ok:
                    handed += 1
                    if not skipped:
                        inbox = inbox.model_copy(update={"stuck": "", "stuck_since": None})
                    continue
                if not may_go_ahead(
                    inbox.stuck_since, now=self._clock.now(), bound=self._order_wait
                ):
                    return _Pass(inbox, "a delivery keeps failing; the others wait for it")
                skipped.extend(part.delivery_id for part in turn.parts)
            else:
                if not handed:
                    # Empty, or only failing ones left: their retries (or a wake's) come.
                    return _Pass(inbox, drained=Drained(failing=bool(skipped)))

    def _woken(self, group: str, ready_at: datetime) -> bool:
        """Queue a wake of ``group`` at ``ready_at``; False when there is no queue to do it,
        or it cannot now (then the drain sleeps instead)."""
        if self._defer is None:
            return False
        try:
            return self._defer(group, ready_at)
        except Transient as exc:
            log.warning(
                "could not queue a wake of the inbox of %s; it waits instead: %s", group, exc
            )
            return False

    def _one(
        self,
        inbox: InboxRecord,
        turn: Turn,
        envelopes: dict[str, Envelope],
        records: dict[str, DeliveryRecord],
        skipped: list[str],
        *,
        drained_before: str,
    ) -> tuple[InboxRecord, bool]:
        """Hand ``turn`` off under a renewed lease; return the inbox's state and whether it
        was handed off (False: its handler failed for now). A part keyed before
        ``drained_before`` (the largest key handed off before its listing) arrived late."""
        kept = self._renew(inbox)
        if kept is None:
            raise Transient(f"lost the inbox of {inbox.group}; its next holder drains it")
        record = records[turn.lead.delivery_id]
        joined = tuple(records[part.delivery_id] for part in turn.joined)
        for part in (record, *joined):
            if part.order_key < drained_before:
                self._late(part, inbox.group, drained_before)
        envelope = envelopes[record.delivery_id]
        if joined:
            parts = [joined_part(envelopes[part.delivery_id]) for part in joined]
            envelope = envelope.model_copy(update={"joined": parts})
        try:
            self._hand_off(envelope, record, tuple(skipped), joined)
        except Transient as exc:
            log.warning(
                "delivery failed for now; the others of %s wait: %s",
                inbox.group,
                exc,
                extra={"delivery_id": record.delivery_id},
            )
            if kept.stuck_since is not None:
                return kept, False
            return kept.model_copy(
                update={"stuck": record.delivery_id, "stuck_since": self._clock.now()}
            ), False
        drained = max(kept.drained_key, *(part.order_key for part in (record, *joined)))
        return kept.model_copy(update={"drained_key": drained}), True

    def _late(self, record: DeliveryRecord, group: str, after_key: str) -> None:
        self._store.append_event(
            EventRecord(
                name=ARRIVED_LATE,
                at=self._clock.now(),
                delivery_id=record.delivery_id,
                severity="WARNING",
                data={"group": group, "after_key": after_key},
            )
        )


def went_ahead_event(
    record: DeliveryRecord, ahead_of: tuple[str, ...], *, at: datetime, order_wait: timedelta
) -> EventRecord:
    """The event that says ``record`` went ahead of the failing ``ahead_of``."""
    return EventRecord(
        name=WENT_AHEAD,
        at=at,
        delivery_id=record.delivery_id,
        severity="WARNING",
        data={
            "group": record.order_group,
            "ahead_of": list(ahead_of),
            "order_wait_seconds": order_wait.total_seconds(),
        },
    )


@dataclass
class _Waits:
    """What an attempt may still spend waiting for runs and turns, in seconds."""

    left: float


class _Keeper:
    """Renews a drain's lease from a thread of its own while a hand-off runs (a handler may
    take most of the queue's dispatch deadline), so that the lease can be short: a holder that
    dies holds its inbox for one lease, not one handler budget. A renewal that fails for now
    is tried again at the next beat."""

    def __init__(
        self,
        inbox: InboxRecord,
        *,
        renew: Callable[[InboxRecord], InboxRecord | None],
        every: float,
    ) -> None:
        self.inbox = inbox
        """The drain's latest state: what each renewal writes."""
        self._renew = renew
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="inbox-keeper", daemon=True)

    def __enter__(self) -> _Keeper:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._every):
            try:
                if self._renew(self.inbox) is None:
                    return  # lost: the drain finds out at its next hand-off
            except Transient:
                log.warning("could not renew the lease of the inbox of %s", self.inbox.group)
