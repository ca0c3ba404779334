"""Send work again: a delivery (a dead letter, or one whose queue task died before it
settled), or an interrupted dispatch."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from looprelay.core.model import RECEIVED, EventRecord
from looprelay.core.plan import retry_dispatch as plan_retry
from looprelay.core.tasknames import delivery_task_name
from looprelay.errors import ConfigError
from looprelay.ports import Queue, Store, Task, WorkItemStore


def replay_delivery(
    store: Store, queue: Queue, *, delivery_id: str, now: datetime, attempt: str
) -> None:
    """Enqueue ``delivery_id``'s envelope again under a task name of its own (``attempt``
    makes it unique): a ``failed`` delivery is reopened first; a ``received`` one is still
    open (its task died, or is still being retried: then two runs race and the ledger keeps
    the first outcome).

    Raises ``ConfigError`` when the delivery is unknown, settled otherwise, or has no envelope.
    """
    record = store.get_delivery(delivery_id)
    if record is None:
        raise ConfigError(f"no delivery {delivery_id} in the ledger")
    if record.outcome not in ("failed", RECEIVED) or not record.envelope:
        raise ConfigError(
            f"delivery {delivery_id} is {record.outcome}; only failed ones and ones still "
            "received (their task died) replay"
        )
    if record.outcome == "failed" and not store.reopen_delivery(delivery_id, at=now):
        raise ConfigError(f"delivery {delivery_id} changed while replaying; look again")
    # A name of its own: the earlier task's name stays reserved for about an hour.
    name = delivery_task_name(delivery_id, attempt=f"replay-{attempt}")
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
