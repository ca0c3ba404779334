"""The worker: a queue task in, the delivery ledger settled exactly once, a ``Settlement`` out
(``app/worker_http.py`` gives it, and the errors raised here, their HTTP answers).

Scenario the ledger is built for: Cloud Tasks delivers at least once and in any order, and a
worker can die anywhere. So (1) ``begin_delivery`` creates the record or finds it; (2) a settled
record is a no-op; (3) the handler runs and must itself be idempotent, since a crash before
settling runs it again; (4) ``settle_delivery`` is a compare-and-set, so only one run records
the outcome. A ``Transient`` error is raised (the queue retries) and leaves the record open;
anything else is permanent: the delivery is settled ``failed`` (a dead letter to replay) and
the queue is told it is done so it stops retrying.

A delivery of an issue or pull request is not handled by the attempt that brought it but
handed off from its group's inbox, in order (``service.inbox``): the queue need keep none. A
turn not ready yet is left to a wake (``core.wake``), a task of the worker's own queue: the
attempt then ends at once, its delivery waiting in the inbox for the wake.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from pydantic import ValidationError

from looprelay import deadlines
from looprelay.core.envelope import Envelope
from looprelay.core.model import (
    IGNORED_EVENT,
    PONG,
    RECEIVED,
    DeliveryRecord,
    EventRecord,
    is_valid_outcome,
)
from looprelay.core.order import DEFAULT_RULES, OrderRules, order_group
from looprelay.core.wake import WAKE_MARGIN, Wake, parse_wake, wake_body, wake_task_name
from looprelay.errors import BadDelivery, Permanent, Transient, Unauthorized
from looprelay.logsampling import LogSampler
from looprelay.ports import Clock, Queue, Store, Task, TaskAuthenticator
from looprelay.service.inbox import (
    DEFAULT_ORDER_WAIT,
    Drained,
    Inbox,
    went_ahead_event,
)

log = logging.getLogger("looprelay.service.worker")

RETRY_COUNT_HEADER = "x-cloudtasks-taskretrycount"
SETTLE_RESERVE_SECONDS = 15.0
"""Of the queue's dispatch deadline, what the handler leaves for the settle and the answer."""


def handler_budget(dispatch_deadline_seconds: float) -> float:
    """The time a delivery's handler (its GitHub calls) gets under the queue's dispatch
    deadline: all but a reserve for the settle, at most a quarter of the deadline."""
    reserve = min(SETTLE_RESERVE_SECONDS, dispatch_deadline_seconds / 4)
    return dispatch_deadline_seconds - reserve


@dataclass(frozen=True)
class Settlement:
    """Where a delivery's ledger record stands once this attempt is over: settled with
    ``outcome`` by this attempt, or (``already``) by an earlier or a racing one (its outcome,
    None if the record went missing since)."""

    outcome: str | None
    already: bool = False
    waiting_until: datetime | None = None
    """Set when the delivery (or the wake's inbox) waits for a wake queued for then."""


@dataclass(frozen=True)
class Outcome:
    """What a handler decided for one delivery: a ledger outcome and a short detail."""

    outcome: str
    detail: str = ""


class DeliveryHandler(Protocol):
    """Decides and performs what a delivery means; must be idempotent."""

    def __call__(self, envelope: Envelope, record: DeliveryRecord) -> Outcome:
        """Handle one delivery; raise ``Transient`` to be retried."""
        ...


def record_only(envelope: Envelope, record: DeliveryRecord) -> Outcome:
    """The handler used until routing is installed: the delivery is recorded, nothing else."""
    return Outcome("ignored", "recorded; no router installed")


class Worker:
    """Handles queue tasks; one instance serves many requests and threads."""

    def __init__(
        self,
        *,
        store: Store,
        authenticator: TaskAuthenticator,
        clock: Clock,
        handler: DeliveryHandler = record_only,
        allowed_events: Collection[str] | None = None,
        handler_budget_seconds: float | None = None,
        order_wait: timedelta = DEFAULT_ORDER_WAIT,
        order_rules: OrderRules = DEFAULT_RULES,
        wakes: Queue | None = None,
    ) -> None:
        """``allowed_events`` (``webhook.events``): a delivery of any other event, and a
        ping, is settled without the handler (``ignored:event``, ``pong``); None routes all.
        ``handler_budget_seconds`` (``handler_budget`` of the queue's dispatch deadline)
        bounds the handler's outbound calls (``deadlines``): one that cannot finish in time
        is ``Transient`` and the queue retries the task, instead of sending a second attempt
        while this one still runs. ``order_wait``
        (``routing.orderWaitSeconds``) bounds how long failing deliveries hold the others of
        their group back; ``order_rules`` (``routing``'s order and turn settings) say how
        comments are ordered and which deliveries are one turn. ``wakes`` (the queue that
        brings the worker its tasks) takes the wakes of turns not ready yet; without it an
        attempt sleeps until they are."""
        self._allowed = None if allowed_events is None else frozenset(allowed_events)
        self._store = store
        self._auth = authenticator
        self._clock = clock
        self._handler = handler
        self._budget = handler_budget_seconds
        self._refusals = LogSampler()  # unauthenticated noise must not fill a disk
        self._order_wait = order_wait
        self._wakes = wakes
        self._inbox = Inbox(
            store=store,
            clock=clock,
            hand_off=self._hand_off,
            drain_seconds=handler_budget_seconds,
            order_wait=order_wait,
            rules=order_rules,
            defer=None if wakes is None else self._queue_wake,
        )

    def settle(self, headers: Mapping[str, str], body: bytes) -> Settlement:
        """Settle the delivery of one queue task: ``headers`` (lower-case names) prove the
        caller is the queue, ``body`` is the envelope ingress wrote.

        Raises ``Unauthorized`` for a caller that is not the queue (logged, sampled),
        ``BadDelivery`` for a body that is no envelope, and ``Transient`` (its message safe to
        send back) when the queue should retry: authentication, the store or the handler is
        unavailable for now, the record left open.
        """
        self._authenticate(headers)
        wake = parse_wake(body)
        if wake is not None:
            return self._retried(lambda: self._wake(wake), delivery_id=None)
        try:
            envelope = Envelope.model_validate_json(body)
        except ValidationError as exc:
            # Only our own ingress writes tasks, so this is a bug; the queue keeps the body.
            log.error("task body is not an envelope: %s", exc.errors(include_input=False)[:3])
            raise BadDelivery("task body is not a delivery envelope") from exc
        retries = headers.get(RETRY_COUNT_HEADER)
        return self._retried(
            lambda: self._process(envelope, body, retries=retries),
            delivery_id=envelope.delivery_id,
        )

    def _retried(self, attempt: Callable[[], Settlement], *, delivery_id: str | None) -> Settlement:
        """Run ``attempt``; a ``Transient`` it raises is logged and told to the queue with a
        message safe to send back."""
        try:
            return attempt()
        except Transient as exc:
            log.warning(
                "transient failure, the queue will retry: %s",
                exc,
                extra={"delivery_id": delivery_id} if delivery_id else None,
            )
            raise Transient("transient failure; retry", retry_after=exc.retry_after) from exc

    def _wake(self, wake: Wake) -> Settlement:
        """Drain the inbox ``wake`` names. The wake is done once nothing is left in the inbox
        that no other task brings back: it is retried while failing deliveries remain."""
        # Another attempt holding the inbox answers Transient with the lease as Retry-After:
        # sooner, a wake knocking through a long drain would spend its attempts and die.
        drained = self._inbox.drain(wake.group)
        if drained.woken_at is None and drained.failing:
            raise Transient(f"deliveries of {wake.group} keep failing; the wake comes again")
        if drained.woken_at == wake.ready_at:
            # Early (the queue's clock is behind ours): the wake it queued again is this one,
            # whose name stays taken once it is done, so this one must come back itself.
            early = (wake.ready_at + WAKE_MARGIN - self._clock.now()).total_seconds()
            raise Transient(f"the wake of {wake.group} came early", retry_after=max(early, 0.0))
        return Settlement(None, waiting_until=drained.woken_at)

    def _queue_wake(self, group: str, ready_at: datetime) -> bool:
        """The inbox's ``defer``: queue the wake of ``group`` at ``ready_at``. A wake of that
        name already queued counts as queued: the turn is not ready, so it has not run yet."""
        assert self._wakes is not None
        name = wake_task_name(group, ready_at)
        due = ready_at + WAKE_MARGIN
        try:
            self._wakes.enqueue(Task(name=name, body=wake_body(group, ready_at), not_before=due))
        except Permanent as exc:  # a bug; the attempt sleeps instead
            log.error("the queue refused the wake of the inbox of %s: %s", group, exc)
            return False
        return True

    def _authenticate(self, headers: Mapping[str, str]) -> None:
        try:
            self._auth.authenticate(headers)
        except Unauthorized as exc:
            self._refusals.warning(
                log, exc.status, "worker request refused: %s", exc, kind="worker refusals"
            )
            raise
        except Transient as exc:
            log.error("cannot authenticate the queue now: %s", exc)
            raise Transient("authentication unavailable; retry") from exc

    def _process(self, envelope: Envelope, body: bytes, *, retries: str | None) -> Settlement:
        delivery_id = envelope.delivery_id
        now = self._clock.now()
        received = EventRecord(
            name="delivery.received",
            at=now,
            delivery_id=delivery_id,
            data={"event": envelope.event, "action": envelope.action},
        )
        # The event rides in the record's own write, made only by the attempt creating it.
        record, _ = self._store.begin_delivery(
            DeliveryRecord(
                delivery_id=delivery_id,
                event=envelope.event,
                action=envelope.action,
                received_at=now,
                envelope=body.decode(),
                order_group=order_group(envelope),
                order_key=envelope.order_key,
            ),
            event=received,
        )
        if record.settled:
            log.info(
                "delivery already settled as %s; nothing to do",
                record.outcome,
                extra={"delivery_id": delivery_id},
            )
            return Settlement(record.outcome, already=True)
        if not record.order_group or not record.order_key:
            return self._settle(envelope, record, retries=retries)
        drained = self._inbox.deliver(record)
        return self._after_drain(delivery_id, drained)

    def _after_drain(self, delivery_id: str, drained: Drained) -> Settlement:
        """Where ``delivery_id`` stands once its inbox was drained: settled, or waiting for a
        wake; otherwise the queue tries again."""
        stored = self._store.get_delivery(delivery_id)
        if stored is not None and stored.settled:
            return Settlement(stored.outcome)
        if drained.woken_at is not None:
            return Settlement(None, waiting_until=drained.woken_at)
        raise Transient(f"delivery {delivery_id} waits in its inbox for its turn")

    def _hand_off(
        self,
        envelope: Envelope,
        record: DeliveryRecord,
        ahead_of: tuple[str, ...],
        joined: tuple[DeliveryRecord, ...],
    ) -> None:
        """The inbox's hand-off: settle ``record`` (and with its outcome the ``joined``, whose
        envelopes ride in ``envelope.joined``), and say what it went ahead of."""
        settlement = self._settle(envelope, record, retries=None)
        for part in joined:
            self._settle_joined(part, lead=record, outcome=settlement.outcome)
        if ahead_of and not settlement.already:
            log.warning(
                "went ahead of %d failing deliveries of %s",
                len(ahead_of),
                record.order_group,
                extra={"delivery_id": record.delivery_id},
            )
            self._store.append_event(
                went_ahead_event(
                    record, ahead_of, at=self._clock.now(), order_wait=self._order_wait
                )
            )

    def _settle_joined(
        self, record: DeliveryRecord, *, lead: DeliveryRecord, outcome: str | None
    ) -> None:
        """Settle ``record``, handed off in ``lead``'s turn, with the lead's outcome."""
        joined = Outcome(outcome or "failed", f"one turn with delivery {lead.delivery_id}")
        self._record(record, joined, retries=None)

    def _settle(
        self, envelope: Envelope, record: DeliveryRecord, *, retries: str | None
    ) -> Settlement:
        """Run the handler and settle ``record`` with its outcome; raises ``Transient`` (the
        record left open) when the handler must be retried."""
        return self._record(record, self._run_handler(envelope, record), retries=retries)

    def _record(
        self, record: DeliveryRecord, outcome: Outcome, *, retries: str | None
    ) -> Settlement:
        """Settle ``record`` with ``outcome`` in the ledger, its event in the same write."""
        delivery_id = record.delivery_id
        now = self._clock.now()
        settled = EventRecord(
            name="delivery.settled",
            at=now,
            delivery_id=delivery_id,
            severity="ERROR" if outcome.outcome == "failed" else "INFO",
            data={
                "outcome": outcome.outcome,
                "detail": outcome.detail,
                "attempts": record.attempts,
                "queue_retries": _retry_count(retries),
            },
        )
        # The event rides in the settle's own write: a crash cannot keep one without the other.
        if not self._store.settle_delivery(
            delivery_id, outcome=outcome.outcome, detail=outcome.detail, at=now, event=settled
        ):
            # Another attempt settled it meanwhile: answer with the one outcome on record.
            stored = self._store.get_delivery(delivery_id)
            return Settlement(stored.outcome if stored else None, already=True)
        log.info(
            "delivery settled as %s",
            outcome.outcome,
            extra={"delivery_id": delivery_id, "fields": {"detail": outcome.detail}},
        )
        return Settlement(outcome.outcome)

    def _run_handler(self, envelope: Envelope, record: DeliveryRecord) -> Outcome:
        if envelope.event == "ping":
            return Outcome(PONG, "GitHub's ping")
        if self._allowed is not None and envelope.event not in self._allowed:
            return Outcome(IGNORED_EVENT, f"{envelope.event} is not on webhook.events")
        budget = nullcontext() if self._budget is None else deadlines.within(self._budget)
        try:
            with budget:
                outcome = self._handler(envelope, record)
        except Transient:
            raise
        except Exception as exc:
            # Anything but Transient will fail the same way again: settle it as a dead letter
            # an operator can read and replay, instead of letting the queue spin on it.
            log.exception("handler failed permanently", extra={"delivery_id": record.delivery_id})
            return Outcome("failed", f"{type(exc).__name__}: {exc}"[:500])
        if outcome.outcome == RECEIVED or not is_valid_outcome(outcome.outcome):
            log.error(
                "handler returned the unknown outcome %r",
                outcome.outcome[:80],
                extra={"delivery_id": record.delivery_id},
            )
            return Outcome("failed", f"handler returned unknown outcome {outcome.outcome[:80]!r}")
        return outcome


def _retry_count(header: str | None) -> int | None:
    """The queue's retry count as a number, like ``attempts``; None when the queue sent none
    (the embedded queue) or something that is not a count."""
    value = (header or "").strip()
    return int(value) if value.isdigit() else None
