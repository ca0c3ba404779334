"""The inbox on each store: one attempt's drain stops within its budget and the next attempt
goes on from there, in order; a delivery that only waited is never gone ahead of; one that
came after later ones were handed off is said late, a run of comments put in creation order
is not."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from looprelay.adapters.clock import SystemClock
from looprelay.core.envelope import Comment, Envelope, order_key
from looprelay.core.model import DeliveryRecord
from looprelay.core.order import COMMENT_WINDOW
from looprelay.errors import Transient
from looprelay.ports import Store
from looprelay.service.inbox import ARRIVED_LATE, WENT_AHEAD, Inbox

GROUP = "octo/repo#7"
HAND_OFF_SECONDS = 0.4
"""Long beside a store call on a loaded machine, so the budget (2.5 of them) always holds one."""


def _begin(store: Store, number: int, at: datetime) -> DeliveryRecord:
    envelope = Envelope(delivery_id=f"d-{number}", event="issues", order_key=order_key(at))
    record = DeliveryRecord(
        delivery_id=envelope.delivery_id,
        event="issues",
        received_at=at,
        envelope=envelope.model_dump_json(),
        order_group=GROUP,
        order_key=envelope.order_key,
    )
    stored, _ = store.begin_delivery(record)
    return stored


class TestDrainBounds:
    def test_a_drain_past_its_budget_leaves_the_rest_to_the_next_attempt_in_order(
        self, store: Store
    ) -> None:
        handed: list[str] = []

        def hand_off(
            envelope: Envelope,
            record: DeliveryRecord,
            _ahead: tuple[str, ...],
            _joined: tuple[DeliveryRecord, ...],
        ) -> None:
            time.sleep(HAND_OFF_SECONDS)
            handed.append(record.delivery_id)
            store.settle_delivery(
                record.delivery_id, outcome="dispatched", detail="", at=datetime.now(UTC)
            )

        inbox = Inbox(
            store=store,
            clock=SystemClock(),
            hand_off=hand_off,
            drain_seconds=2.5 * HAND_OFF_SECONDS,
        )
        start = datetime.now(UTC)
        records = [_begin(store, n, start + timedelta(milliseconds=n)) for n in range(8)]
        with pytest.raises(Transient, match="budget"):
            inbox.deliver(records[0])
        first = list(handed)
        assert 1 <= len(first) < len(records)
        while len(handed) < len(records):
            try:
                inbox.deliver(records[-1])
            except Transient:
                continue
        assert handed == [r.delivery_id for r in records]
        assert store.list_events(name=WENT_AHEAD) == []  # waiting for one's turn is no failure


class TestLateArrivals:
    @staticmethod
    def _inbox(store: Store, handed: list[str]) -> Inbox:
        def hand_off(
            envelope: Envelope,
            record: DeliveryRecord,
            _ahead: tuple[str, ...],
            _joined: tuple[DeliveryRecord, ...],
        ) -> None:
            handed.append(record.delivery_id)
            store.settle_delivery(
                record.delivery_id, outcome="dispatched", detail="", at=datetime.now(UTC)
            )

        return Inbox(store=store, clock=SystemClock(), hand_off=hand_off)

    def test_one_keyed_before_what_was_handed_off_is_handed_off_and_said_late(
        self, store: Store
    ) -> None:
        handed: list[str] = []
        inbox = self._inbox(store, handed)
        start = datetime.now(UTC)
        inbox.deliver(_begin(store, 2, start + timedelta(milliseconds=2)))
        inbox.deliver(_begin(store, 1, start + timedelta(milliseconds=1)))  # held back, by GitHub
        assert handed == ["d-2", "d-1"]
        [late] = store.list_events(name=ARRIVED_LATE)
        assert late.delivery_id == "d-1"
        assert late.data["after_key"] == order_key(start + timedelta(milliseconds=2))

    def test_a_run_handed_off_in_creation_order_against_its_keys_is_not_late(
        self, store: Store
    ) -> None:
        handed: list[str] = []
        inbox = self._inbox(store, handed)
        # Received (keyed) 3, 2, 1 within the comment window, made 1, 2, 3: handed off 1, 2, 3.
        now = datetime.now(UTC) - 2 * COMMENT_WINDOW  # quiet already: handed off at once
        made = now.replace(microsecond=0)  # one GitHub second: the ids order them
        records = [
            _begin_comment(store, n, at=now + timedelta(milliseconds=10 * (3 - n)), made=made)
            for n in (1, 2, 3)
        ]
        inbox.deliver(records[0])
        assert handed == ["c-1", "c-2", "c-3"]
        assert store.list_events(name=ARRIVED_LATE) == []


def _begin_comment(store: Store, number: int, *, at: datetime, made: datetime) -> DeliveryRecord:
    """A new comment, the ``number``-th made (in GitHub's second ``made``), received ``at``."""
    envelope = Envelope(
        delivery_id=f"c-{number}",
        event="issue_comment",
        action="created",
        comment=Comment(id=number, created_at=made, body="hi"),
        order_key=order_key(at),
    )
    record = DeliveryRecord(
        delivery_id=envelope.delivery_id,
        event="issue_comment",
        action="created",
        received_at=at,
        envelope=envelope.model_dump_json(),
        order_group=GROUP,
        order_key=envelope.order_key,
    )
    stored, _ = store.begin_delivery(record)
    return stored
