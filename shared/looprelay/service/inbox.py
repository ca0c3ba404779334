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

HandOff = Callable[[Envelope, DeliveryRecord, tuple[str, ...], tuple[DeliveryRecord, ...]], None]
"""Handle one turn and settle it: the lead's envelope (the others' joined to it), its record,
the ids it goes ahead of, and the records of the deliveries joined to it. Raises
``Transient`` when its handler failed for now (the deliveries stay unsettled)."""


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
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``lease`` is how long a dead holder keeps its inbox: a live one renews it before
        each hand-off and every third of it meanwhile (``_Keeper``). ``drain_seconds`` bounds
        one attempt's drain (the queue gives up on a longer one and tries again): past it, no
        further delivery is handed off and the rest is left to the next attempt."""
        self._store = store
        self._clock = clock
        self._hand_off = hand_off
        self._lease = lease
        self._order_wait = order_wait
        self._rules = rules
        self._drain_seconds = drain_seconds
        self._sleep = sleep

    def deliver(self, record: DeliveryRecord) -> None:
        """Hand ``record`` (begun, unsettled, of a group) off in its group's order: drain the
        group's inbox unless another attempt is draining it.

        Returns once the drain is over. Raises ``Transient`` (the queue retries; the retry
        finds it settled, or drains) when another attempt holds the inbox (it knocked, so the
        holder hands ``record`` off), this drain lost its lease, or a failing delivery holds
        it back. The attempt never waits for the holder: a queue with few dispatchers must
        bring the rest of a burst in meanwhile.
        """
        group = record.order_group
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
        # The attempt holds a queue dispatcher while it waits for a run or a turn, and a
        # backlog brings a group's deliveries in one by one: all its waits together are
        # bounded, whatever the clock says, and past that it hands off what it has.
        waits = _Waits(self._rules.longest_wait.total_seconds())
        with _Keeper(inbox, renew=self._renew, every=self._lease.total_seconds() / 3) as keeper:
            for _ in range(MAX_RELEASES):
                inbox, stopped = self._drain(inbox, keeper, ends, waits)
                if stopped:
                    self._leave(inbox)
                    raise Transient(f"the inbox of {group}: {stopped}")
                if self._store.release_inbox(inbox):
                    return
                retaken = self._take(group, holder)  # knocked meanwhile: its knocks, fresh
                if retaken is None:
                    raise Transient(f"lost the inbox of {group}; its next holder drains it")
                inbox = keeper.inbox = retaken
            self._leave(inbox)

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
    ) -> tuple[InboxRecord, str]:
        """Hand off what the inbox holds, list after list, until ``ends`` (monotonic), waiting
        for runs and turns out of ``waits``; return its state and why the drain stopped
        before the inbox was empty ("": it did not)."""
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
            for turn in turns(arranged, self._rules):
                if ends is not None and time.monotonic() >= ends:
                    return inbox, "drained for the attempt's budget; the next attempt goes on"
                wait = (turn.ready_at - self._clock.now()).total_seconds()
                if wait > 0 and waits.left > 0:
                    # A run of new comments waits until it is quiet, for one made earlier, and
                    # a turn for its other parts; then the inbox is listed again: what came
                    # meanwhile may go before it, or join it.
                    pause = min(wait, waits.left)
                    self._sleep(pause)
                    waits.left -= pause
                    break
                inbox, ok = self._one(inbox, turn, envelopes, records, skipped)
                keeper.inbox = inbox
                if ok:
                    handed += 1
                    if not skipped:
                        inbox = inbox.model_copy(update={"stuck": "", "stuck_since": None})
                    continue
                if not may_go_ahead(
                    inbox.stuck_since, now=self._clock.now(), bound=self._order_wait
                ):
                    return inbox, "a delivery keeps failing; the others wait for it"
                skipped.extend(part.delivery_id for part in turn.parts)
            else:
                if not handed:
                    return inbox, ""  # empty, or only failing ones left: their retries come

    def _one(
        self,
        inbox: InboxRecord,
        turn: Turn,
        envelopes: dict[str, Envelope],
        records: dict[str, DeliveryRecord],
        skipped: list[str],
    ) -> tuple[InboxRecord, bool]:
        """Hand ``turn`` off under a renewed lease; return the inbox's state and whether it
        was handed off (False: its handler failed for now)."""
        kept = self._renew(inbox)
        if kept is None:
            raise Transient(f"lost the inbox of {inbox.group}; its next holder drains it")
        record = records[turn.lead.delivery_id]
        joined = tuple(records[part.delivery_id] for part in turn.joined)
        for part in (record, *joined):
            if part.order_key < kept.drained_key:
                self._late(part, kept)
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

    def _late(self, record: DeliveryRecord, inbox: InboxRecord) -> None:
        self._store.append_event(
            EventRecord(
                name=ARRIVED_LATE,
                at=self._clock.now(),
                delivery_id=record.delivery_id,
                severity="WARNING",
                data={"group": inbox.group, "after_key": inbox.drained_key},
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
