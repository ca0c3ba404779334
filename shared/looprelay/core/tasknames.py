"""Deterministic queue task names.

Cloud Tasks deduplicates by name for about an hour and asks for hashed, not sequential, names
(CreateTaskRequest reference), so a name is a digest of the delivery id.
"""

from __future__ import annotations

import hashlib

_TASK_PREFIX = "gh-"


def delivery_task_name(delivery_id: str, *, replay: int = 0) -> str:
    """Return the task name for ``delivery_id``; each replay of a dead letter gets its own."""
    key = delivery_id if replay == 0 else f"{delivery_id}#replay-{replay}"
    return _TASK_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:40]
