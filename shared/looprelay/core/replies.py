"""What looprelay posts for a headless turn: its answer cut to fit one GitHub comment, or a short
note that it failed.

The limits live here once: the runner caps what it sends with them, the runner API refuses more
(``ResultBody.reply``), and the server cuts again before posting, so no layer trusts the other.
"""

from __future__ import annotations

GITHUB_MAX_COMMENT_CHARS = 65_536
"""GitHub refuses a longer comment body: "Body is too long (maximum is 65536 characters)"."""
MARKER_ROOM_CHARS = 256
"""Kept free for the blank line and the loop-prevention marker ``core.markers.mark`` appends
(at most 166 characters: a 128-character id)."""
MAX_REPLY_CHARS = GITHUB_MAX_COMMENT_CHARS - 1_024
"""The longest reply a runner may report: a comment's limit less room for our marker and a
header line."""
MAX_FAILURE_NOTE_CHARS = 300
"""A failed turn gets a short note on the work item; the whole message is in the event log."""
REPLY_MARKER_KIND = "reply"
"""The marker kind of a turn's reply; its id is the dispatch id, so a reply is posted once."""

_MIN_LIMIT = 64
_ELLIPSIS = "…"


def cut_to(text: str, limit: int) -> str:
    """Return ``text`` if it has at most ``limit`` characters, else its start plus a line saying
    how much was cut ("… (cut: N more characters)"), ``limit`` characters at most in all.

    Expects a limit of at least 64 (room for the note). Raises ``ValueError`` for a smaller one.
    """
    if limit < _MIN_LIMIT:
        raise ValueError(f"a cut needs a limit of at least {_MIN_LIMIT} characters, not {limit}")
    if len(text) <= limit:
        return text
    # Sized for the most digits N can have; fewer digits only leave the result shorter.
    room = len(_cut_note(len(text)))
    kept = text[: limit - room].rstrip()
    return kept + _cut_note(len(text) - len(kept))


def reply_body(text: str) -> str:
    """Return the comment text for a turn's answer: trimmed, and cut so that the text plus our
    marker stays within GitHub's limit. Empty when the answer is blank (nothing to post).

    Expects the ``result`` a harness printed. Never raises.
    """
    return cut_to(text.strip(), GITHUB_MAX_COMMENT_CHARS - MARKER_ROOM_CHARS)


TURN_FAILED = "turn failed"
SPAWN_FAILED = "session did not start"
PASTE_FAILED = "session did not get the event"


def failure_note(harness: str, message: str, *, what: str = TURN_FAILED) -> str:
    """Return the short note a failed turn (or a hosted session's failed start, ``what``)
    leaves on the work item: ``😕 <harness> <what>: `<message>` ``, at most
    ``MAX_FAILURE_NOTE_CHARS`` characters.

    The message goes on one line inside a code span, so a harness's output can neither mention
    anyone nor render as Markdown. Expects the harness's name and its own message (either may
    be empty). Never raises.
    """
    head = f"😕 {harness[:40] or 'harness'} {what}"
    flat = " ".join(message.split()).replace("`", "'")
    if not flat:
        return head
    room = MAX_FAILURE_NOTE_CHARS - len(head) - len(": ``")
    if len(flat) > room:
        flat = flat[: room - len(_ELLIPSIS)].rstrip() + _ELLIPSIS
    return f"{head}: `{flat}`"


def _cut_note(count: int) -> str:
    return f"\n\n{_ELLIPSIS} (cut: {count} more characters)"
