"""Dispatch test data: a pending spawn for work item N / seq S, and the work item that holds it.

Both live in the work item's own session (``tmux_session_name`` of its ref, a session id derived
from the ref), as the router makes them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from looprelay.core.model import DispatchRecord, SessionRecord, WorkItemRecord
from looprelay.core.prsessions import tmux_session_name
from looprelay.ports import WorkItemStore


def work_item_ref(repository: str, number: int) -> str:
    return f"github:{repository}#{number}"


def make_dispatch(
    *,
    repository: str,
    number: int,
    seq: int = 1,
    created_at: datetime,
    prompt: str = "",
    comment_id: int | None = None,
    comment_kind: str | None = None,
    **changes: Any,
) -> DispatchRecord:
    """A pending spawn for work item ``number`` of ``repository`` in its own session.

    Ids follow ``number`` and ``seq`` (``dp-N-S`` / ``d-N-S``); ``changes`` override any field.
    Raises pydantic's ValidationError if a change is not a valid field value.
    """
    ref = work_item_ref(repository, number)
    base: dict[str, Any] = {
        "dispatch_id": f"dp-{number}-{seq}",
        "delivery_id": f"d-{number}-{seq}",
        "work_item": ref,
        "endpoint": ref,
        "seq": seq,
        "kind": "spawn",
        "repository": repository,
        "session_name": tmux_session_name(ref),
        "session_id": _session_id(ref),
        "prompt": prompt,
        "created_at": created_at,
        "comment_id": comment_id,
        "comment_kind": comment_kind,
    }
    return DispatchRecord(**{**base, **changes})


def save_with_own_session(
    work_items: WorkItemStore,
    *,
    repository: str,
    number: int,
    dispatches: Sequence[DispatchRecord],
    now: datetime,
    session_status: str = "pending",
    session_runner: str | None = None,
) -> WorkItemRecord | None:
    """Save work item ``number`` (its own session in ``session_status``) with ``dispatches``.

    Reads the stored item first and saves against its version. Returns the item as written
    (its version before the save), or None when another writer moved the version meanwhile.
    """
    ref = work_item_ref(repository, number)
    session = SessionRecord(
        endpoint=ref,
        session_name=tmux_session_name(ref),
        session_id=_session_id(ref),
        harness="claude",
        runner_kind="tmux",
        interaction="work-item",
        status=session_status,
        runner_id=session_runner,
    )
    current = work_items.get_work_item(ref)
    version = current.version if current else 0
    item = current or WorkItemRecord(ref=ref, repository=repository, number=number)
    item = item.model_copy(update={"sessions": {**item.sessions, ref: session}, "updated_at": now})
    saved = work_items.save_work_item(item, expected_version=version, dispatches=dispatches)
    return item if saved else None


def _session_id(ref: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, ref))
