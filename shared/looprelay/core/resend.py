"""Sending an interrupted dispatch again, when an operator asks for it.

Scenario: an agent dies while pasting a comment into a session. It cannot know whether the
paste landed, so when it comes back it reports the dispatch ``failed``/``interrupted`` and
never applies it again on its own (at most once). ``looprelay dispatches`` lists it with the
command that sends it again; that command makes a new dispatch (its own id, derived from the
interrupted one, so asking twice sends it once) with the same prompt at the end of the work
item's queue, for the runner the session lives on now.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from looprelay.core.model import DispatchRecord, WorkItemRecord

INTERRUPTED = "interrupted"
"""The result an agent reports for a dispatch it stopped applying half-way."""
RESEND_COMMAND = "looprelay dispatches resend"
ENDED_SESSION_STATES = frozenset({"terminated", "cleaned"})


def resend_id(dispatch_id: str) -> str:
    """Return the id of the dispatch that sends ``dispatch_id`` again (one per original)."""
    digest = hashlib.sha256(f"{dispatch_id}|resend".encode()).hexdigest()
    return "dp-" + digest[:32]


def is_interrupted(dispatch: DispatchRecord) -> bool:
    """Whether ``dispatch`` ended ``interrupted``: the only kind an operator may send again."""
    return dispatch.status == "failed" and dispatch.result == INTERRUPTED


def resend(
    original: DispatchRecord, item: WorkItemRecord, *, now: datetime
) -> tuple[WorkItemRecord, DispatchRecord]:
    """Return ``item`` with its next ``seq`` taken and the new dispatch that sends
    ``original``'s prompt again, pending, for the runner its session lives on now (else the
    one that was applying it). Raises ``ValueError`` unless :func:`is_interrupted` of
    ``original``, or when its session has ended."""
    if not is_interrupted(original):
        raise ValueError(f"{original.dispatch_id} is {original.status}, not interrupted")
    session = item.sessions.get(original.endpoint)
    if session is not None and session.status in ENDED_SESSION_STATES:
        raise ValueError(f"the session of {original.endpoint} has ended; nothing to send it to")
    # Where the session lives now, else the runner that was applying it when it stopped (its
    # harness may be running there), else the one it was meant for.
    runner_id = (
        (session.runner_id if session else None) or original.lease_holder or original.runner_id
    )
    seq = max(item.next_seq, original.seq + 1)
    again = original.model_copy(
        update={
            "dispatch_id": resend_id(original.dispatch_id),
            "seq": seq,
            "runner_id": runner_id,
            "status": "pending",
            "lease_holder": None,
            "lease_expires_at": None,
            "attempts": 0,
            "result": "",
            "detail": "",
            "created_at": now,
            "updated_at": now,
        }
    )
    return item.model_copy(update={"next_seq": seq + 1, "updated_at": now}), again
