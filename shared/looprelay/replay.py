"""Replay a delivery: a dead letter, or one whose queue task died before it settled."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from secrets import token_hex

from looprelay.config import Config
from looprelay.core.tasknames import delivery_task_name
from looprelay.errors import ConfigError
from looprelay.ports import Task
from looprelay.queues import open_queue
from looprelay.records import RECEIVED
from looprelay.stores import open_store


def replay_delivery(config: Config, *, data_dir: Path | None, delivery_id: str) -> None:
    """Enqueue ``delivery_id``'s envelope again under a task name of its own: a ``failed``
    delivery is reopened first; a ``received`` one is still open (its task died, or is still
    being retried: then two runs race and the ledger keeps the first outcome).

    Raises ``ConfigError`` when the delivery is unknown, settled otherwise, or has no envelope.
    """
    store = open_store(config, data_dir=data_dir)
    record = store.get_delivery(delivery_id)
    if record is None:
        raise ConfigError(f"no delivery {delivery_id} in the ledger")
    if record.outcome not in ("failed", RECEIVED) or not record.envelope:
        raise ConfigError(
            f"delivery {delivery_id} is {record.outcome}; only failed ones and ones still "
            "received (their task died) replay"
        )
    if record.outcome == "failed" and not store.reopen_delivery(delivery_id, at=datetime.now(UTC)):
        raise ConfigError(f"delivery {delivery_id} changed while replaying; look again")
    # A name of its own: the earlier task's name stays reserved for about an hour.
    name = delivery_task_name(delivery_id, attempt=f"replay-{token_hex(8)}")
    open_queue(config, data_dir=data_dir).enqueue(Task(name=name, body=record.envelope.encode()))
