"""The inbox's bounds on each store: one attempt's drain stops within its budget and the next
attempt goes on from there, in order; a delivery that only waited is never gone ahead of."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from looprelay.adapters.clock import SystemClock
from looprelay.core.envelope import Envelope, order_key
from looprelay.core.model import DeliveryRecord
from looprelay.errors import Transient
from looprelay.ports import Store
from looprelay.service.inbox import WENT_AHEAD, Inbox

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
