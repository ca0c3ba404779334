"""Replay a dead letter: reopen its ledger record and queue its envelope again."""

from __future__ import annotations

from datetime import datetime

from looprelay.core.tasknames import delivery_task_name
from looprelay.errors import ConfigError
from looprelay.ports import Queue, Store, Task


def replay_delivery(store: Store, queue: Queue, *, delivery_id: str, now: datetime) -> None:
    """Reopen the failed delivery ``delivery_id`` and enqueue it under a fresh task name.

    Raises ``ConfigError`` when the delivery is unknown or did not fail.
    """
    record = store.get_delivery(delivery_id)
    if record is None:
        raise ConfigError(f"no delivery {delivery_id} in the ledger")
    if record.outcome != "failed" or not record.envelope:
        raise ConfigError(f"delivery {delivery_id} is {record.outcome}; only failed ones replay")
    if not store.reopen_delivery(delivery_id, at=now):
        raise ConfigError(f"delivery {delivery_id} changed while replaying; look again")
    # A fresh name: the original is still inside the queue's dedup window.
    name = delivery_task_name(delivery_id, replay=int(now.timestamp()))
    queue.enqueue(Task(name=name, body=record.envelope.encode()))
