"""A wake: a queue task that comes back to an order group's inbox when its next turn is ready.

Scenario: comment 1 on issue #7 reaches the worker alone. Its run of comments is not quiet
until a second later (``routing.commentWindowSeconds``), since a comment made before it may
still be on its way. The drain does not sleep that second inside the queue's request, which
holds one of the queue's dispatchers (four in ``looprelay up``) or one of an instance's
request slots: it queues a wake for the moment the turn is ready and answers at once. The
wake, like any task, is retried until its drain leaves nothing behind.

The task is named for the group and the moment, so drains that find the same turn waiting
queue one wake between them (``wake_task_name``).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, ValidationError

WAKE_MARGIN = timedelta(milliseconds=50)
"""How long after the turn is ready the wake is due: a queue that fires on the dot, with a
clock a little behind ours, must not find the turn still waiting."""
_TASK_PREFIX = "wk-"
_BODY_START = b'{"wake":'
"""How ``wake_body`` begins (pydantic writes the fields in order, without spaces)."""


class Wake(BaseModel):
    """Drain ``group``'s inbox: its next turn is ready at ``ready_at``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group: str
    ready_at: datetime


class WakeTask(BaseModel):
    """A wake's task body; the key ``wake`` tells it from a delivery's envelope."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wake: Wake


def wake_task_name(group: str, ready_at: datetime) -> str:
    """The task name of the wake of ``group`` at ``ready_at`` (hashed first, as Cloud Tasks
    asks; the moment in milliseconds, so one turn waiting gets one wake)."""
    digest = hashlib.sha256(group.encode()).hexdigest()[:32]
    return f"{_TASK_PREFIX}{digest}-{int(ready_at.timestamp() * 1000)}"


def wake_body(group: str, ready_at: datetime) -> bytes:
    """The body of the wake task of ``group`` at ``ready_at``."""
    return WakeTask(wake=Wake(group=group, ready_at=ready_at)).model_dump_json().encode()


def parse_wake(body: bytes) -> Wake | None:
    """The wake ``body`` holds, or None when it is no wake's body."""
    if not body.startswith(_BODY_START):  # a delivery's envelope: not parsed twice
        return None
    try:
        return WakeTask.model_validate_json(body).wake
    except ValidationError:
        return None
