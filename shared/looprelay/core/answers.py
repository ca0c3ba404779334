"""The marked answer a person gets on GitHub when looprelay drops or refuses what they wrote.

Every text is constant (only the operator's own label name is filled in, never payload text),
so an answer can neither repeat nor be steered by what the comment said.
"""

from __future__ import annotations

ANSWER_KIND = "answer"
"""The kind of the answer comment (``CommentPost.kind``, the marker's kind); its marker id is
the delivery id, so a comment gets at most one answer, even when its delivery is retried."""
ANSWER_REACTION = "confused"
"""The reaction put on the comment that got an answer (👀 is for one that went through)."""

PAUSED = "paused: this comment will not reach the session; `the-loop resume` first"
HELD = "paused: this comment is kept and reaches the session after `the-loop resume`"
PAUSED_FULL = (
    "paused, with as many comments kept as looprelay holds: this one will not reach the "
    "session; `the-loop resume` first"
)
NOT_AUTHORIZED = (
    "not authorized: looprelay acts only on people its operator listed; ask a maintainer"
)
ALREADY_STARTED = "already started: the session is running; write to it in a comment"


def answer_for(detail: str, *, label: str) -> str | None:
    """Return the reply to a human comment the decision left at ``detail`` (its idle reason),
    or None when it needs none.

    Expects the decision's detail and ``routing.autoExecuteLabel``. Never raises.
    """
    if detail == "session-paused":
        return PAUSED
    if detail == "session-paused-full":
        return PAUSED_FULL
    if detail == "already-started":
        return ALREADY_STARTED
    if detail == "not-armed":
        return f"not armed: add the label `{label}` first, then `the-loop start`"
    return None
