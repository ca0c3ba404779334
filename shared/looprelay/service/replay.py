"""Send work again: a delivery (a dead letter, or one whose queue task died before it
settled), or an interrupted dispatch."""

from __future__ import annotations

from datetime import datetime

from looprelay.core.model import RECEIVED, DispatchRecord, EventRecord
from looprelay.core.resend import is_interrupted, resend, resend_id
from looprelay.core.tasknames import delivery_task_name
from looprelay.errors import ConfigError
from looprelay.ports import Queue, Store, Task, WorkItemStore


def replay_delivery(store: Store, queue: Queue, *, delivery_id: str, attempt: str) -> None:
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
    if record.outcome == "failed" and not store.reopen_delivery(delivery_id):
        raise ConfigError(f"delivery {delivery_id} changed while replaying; look again")
    # A name of its own: the earlier task's name stays reserved for about an hour.
    name = delivery_task_name(delivery_id, attempt=f"replay-{attempt}")
    queue.enqueue(Task(name=name, body=record.envelope.encode()))


MAX_RESEND_ROUNDS = 8
"""Compare-and-set rounds against a work item the router is writing at the same time."""
RESENT_EVENT = "dispatch.resent"


def resend_dispatch(
    items: WorkItemStore, store: Store, *, dispatch_id: str, now: datetime
) -> DispatchRecord:
    """Send the interrupted dispatch ``dispatch_id`` again: a new pending dispatch with its
    prompt, saved with its work item in one compare-and-set, and a ``dispatch.resent`` event.
    Returns the new dispatch.

    Raises ``ConfigError`` when the dispatch is unknown, was not interrupted, was sent again
    already, its session has ended, or its work item kept changing.
    """
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
        try:
            updated, again = resend(original, item, now=now)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if items.save_work_item(updated, expected_version=item.version, dispatches=[again]):
            store.append_event(
                EventRecord(
                    name=RESENT_EVENT,
                    at=now,
                    delivery_id=original.delivery_id,
                    work_item=original.work_item,
                    data={"dispatch_id": dispatch_id, "sent_as": again.dispatch_id},
                )
            )
            return again
    raise ConfigError(f"the work item {original.work_item} kept changing; try again")
