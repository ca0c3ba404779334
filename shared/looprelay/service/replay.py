"""Replay a dead letter: reopen its ledger record and queue its envelope again."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from looprelay.core.model import EventRecord
from looprelay.core.plan import retry_dispatch as plan_retry
from looprelay.core.tasknames import delivery_task_name
from looprelay.errors import ConfigError
from looprelay.ports import Queue, Store, Task, WorkItemStore


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


RETRY_ROUNDS = 8
"""Compare-and-set rounds on a contended work item before a retry gives up."""


def retry_dispatch(
    items: WorkItemStore, store: Store, *, dispatch_id: str, now: Callable[[], datetime]
) -> str:
    """Queue an interrupted dispatch again under a new id, last in its work item's line;
    return the new id. Runners see it on their next poll.

    Raises ``ConfigError`` when the dispatch is unknown, was not interrupted, its session has
    ended, or its work item stayed contended.
    """
    dispatch = items.get_dispatch(dispatch_id)
    if dispatch is None:
        raise ConfigError(f"no dispatch {dispatch_id}; `looprelay dispatches --all` lists them")
    for _ in range(RETRY_ROUNDS):
        item = items.get_work_item(dispatch.work_item)
        if item is None:
            raise ConfigError(f"the work item {dispatch.work_item} of {dispatch_id} is gone")
        at = now()
        try:
            updated, retried = plan_retry(item, dispatch, now=at)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if items.save_work_item(updated, expected_version=item.version, dispatches=[retried]):
            store.append_event(
                EventRecord(
                    name="dispatch.retried",
                    at=at,
                    delivery_id=dispatch.delivery_id,
                    work_item=dispatch.work_item,
                    data={"dispatch_id": dispatch_id, "retry": retried.dispatch_id},
                )
            )
            return retried.dispatch_id
    raise ConfigError(f"the work item {dispatch.work_item} kept changing; try again")
