"""Queue task names: one per attempt to run a delivery, never reused.

Cloud Tasks keeps a task's name reserved for about an hour after the task ends, and asks for
hashed, not sequential, names (CreateTaskRequest reference). A delivery whose task died must be
able to run again within that hour, from GitHub's "Redeliver" or ``deliveries replay``, so each
webhook request and each replay names its task afresh: the digest of the delivery id, then the
attempt's own token. Deduplicating the same delivery is the worker's ledger's job: it settles a
delivery once, whatever number of tasks carry it.
"""

from __future__ import annotations

import hashlib
import re

_TASK_PREFIX = "gh-"
_ATTEMPT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def task_name_prefix(delivery_id: str) -> str:
    """The start every task name of ``delivery_id`` shares, to find its tasks."""
    return f"{_TASK_PREFIX}{hashlib.sha256(delivery_id.encode()).hexdigest()[:32]}-"


def delivery_task_name(delivery_id: str, *, attempt: str) -> str:
    """The task name of one attempt to run ``delivery_id``; ``attempt`` is a token unique to
    it (1-64 of A-Z a-z 0-9 _ -, else ``ValueError``)."""
    if not _ATTEMPT.match(attempt):
        raise ValueError(f"attempt {attempt[:80]!r} is not 1-64 of A-Z a-z 0-9 _ -")
    return task_name_prefix(delivery_id) + attempt
