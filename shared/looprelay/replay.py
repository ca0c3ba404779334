"""Operator actions that send something again: a dead letter (reopen its ledger record and
queue its envelope again) and an interrupted dispatch (a new dispatch with its prompt)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from looprelay.config import Config
from looprelay.core.resend import is_interrupted, resend, resend_id
from looprelay.core.tasknames import delivery_task_name
from looprelay.errors import ConfigError
from looprelay.ports import Task
from looprelay.queues import open_queue
from looprelay.records import DispatchRecord
from looprelay.stores import open_store, open_work_item_store


def replay_delivery(config: Config, *, data_dir: Path | None, delivery_id: str) -> None:
    """Reopen the failed delivery ``delivery_id`` and enqueue it under a fresh task name.

    Raises ``ConfigError`` when the delivery is unknown or did not fail.
    """
    store = open_store(config, data_dir=data_dir)
    record = store.get_delivery(delivery_id)
    if record is None:
        raise ConfigError(f"no delivery {delivery_id} in the ledger")
    if record.outcome != "failed" or not record.envelope:
        raise ConfigError(f"delivery {delivery_id} is {record.outcome}; only failed ones replay")
    now = datetime.now(UTC)
    if not store.reopen_delivery(delivery_id, at=now):
        raise ConfigError(f"delivery {delivery_id} changed while replaying; look again")
    # A fresh name: the original is still inside the queue's dedup window.
    name = delivery_task_name(delivery_id, replay=int(now.timestamp()))
    open_queue(config, data_dir=data_dir).enqueue(Task(name=name, body=record.envelope.encode()))


MAX_RESEND_ROUNDS = 8
"""Compare-and-set rounds against a work item the router is writing at the same time."""


def resend_dispatch(
    config: Config, *, data_dir: Path | None, dispatch_id: str, now: datetime
) -> DispatchRecord:
    """Send the interrupted dispatch ``dispatch_id`` again: a new pending dispatch with its
    prompt, saved with its work item in one compare-and-set. Returns the new dispatch.

    Raises ``ConfigError`` when the dispatch is unknown, was not interrupted, was sent again
    already, or its work item kept changing.
    """
    items = open_work_item_store(config, data_dir=data_dir)
    original = items.get_dispatch(dispatch_id)
    if original is None:
        raise ConfigError(f"no dispatch {dispatch_id}; `looprelay dispatches --all` lists them")
    if not is_interrupted(original):
        raise ConfigError(
            f"dispatch {dispatch_id} is {original.status} ({original.result or 'no result'}); "
            "only interrupted ones are sent again"
        )
    for _ in range(MAX_RESEND_ROUNDS):
        sent = items.get_dispatch(resend_id(dispatch_id))
        if sent is not None:
            raise ConfigError(
                f"dispatch {dispatch_id} was sent again already as {sent.dispatch_id} "
                f"({sent.status})"
            )
        item = items.get_work_item(original.work_item)
        if item is None:
            raise ConfigError(f"the work item {original.work_item} of {dispatch_id} is gone")
        updated, again = resend(original, item, now=now)
        if items.save_work_item(updated, expected_version=item.version, dispatches=[again]):
            return again
    raise ConfigError(f"the work item {original.work_item} kept changing; try again")
