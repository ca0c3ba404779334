"""Reading what one headless turn printed: its answer, or why it failed. Pure: text in, a
:class:`Turn` out, for every harness; each harness module says which object holds its result.

Claude and cursor-agent (``-p --output-format json``) print one result object when the turn
ends; Gemini CLI (``--output-format json``) one object with ``response`` or ``error``; Codex
(``exec --json``) and Copilot CLI (``--output-format json``) a JSON line per event.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

MAX_MESSAGE_CHARS = 300
"""A failure message is a line or two for people; the output's tail stays in the detail."""
MAX_CANDIDATES = 64
"""Lines that start a JSON object, tried from the last one back, before giving up."""
MAX_EVENT_LINES = 4_096
"""JSON event lines read, from the last one back, of a turn printing one per event."""
_MESSAGE_LINES = 2
_OBJECT_START = re.compile(r"^\{", re.MULTILINE)
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")
"""A harness-chosen session id the agent may keep (cursor-agent's are not UUIDs)."""
# CSI and OSC sequences (colours, titles) and other control characters are noise in a message.
_TERMINAL_NOISE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, links
    r"|[\x00-\x08\x0b-\x1f\x7f]"  # other control characters; tab and newline stay
)
JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """What a headless turn came to.

    ``ok`` is true only for a zero exit with a result that is not an error. ``result`` is the
    answer text (empty on a failure); ``error`` is the harness's own message when the turn
    failed (its error text, else the last line of stderr or stdout); ``session_id`` is the
    printed id, or empty when there is none or it is not safe to use.
    """

    ok: bool
    result: str = ""
    error: str = ""
    subtype: str = ""
    session_id: str = ""


def last_object(stdout: str, wanted: Callable[[JsonObject], bool]) -> JsonObject | None:
    """The last JSON object starting a line of ``stdout`` that ``wanted`` accepts, if any.

    Noise before it, a cut-off tail, undecodable or deeply nested text are all fine.
    """
    decoder = json.JSONDecoder()
    starts = [match.start() for match in _OBJECT_START.finditer(stdout)]
    for start in reversed(starts[-MAX_CANDIDATES:]):
        try:
            value, _ = decoder.raw_decode(stdout, start)
        except (ValueError, RecursionError):  # cut off, not JSON, or nested past the C stack
            continue
        if isinstance(value, dict) and wanted(value):
            return value
    return None


def event_lines(stdout: str) -> Iterator[JsonObject]:
    """Each JSON object printed on a line of its own, in order (the last ``MAX_EVENT_LINES``)."""
    for raw in stdout.splitlines()[-MAX_EVENT_LINES:]:
        line = raw.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            yield value


def finish(
    *,
    exit_code: int,
    answer: str | None,
    failed: bool = False,
    failure: str = "",
    stderr: str,
    stdout: str,
    subtype: str = "",
    session_id: str = "",
) -> Turn:
    """The :class:`Turn` for what a harness printed: its ``answer`` (None: it printed none)
    or, when it said the turn ``failed``, its ``failure`` text.

    Success needs a zero exit, an answer and no failure; otherwise the message is ``failure``,
    else the last lines of stderr, else the exit code.
    """
    if answer is None and not failed:
        return Turn(ok=False, error=no_result_message(exit_code, stdout=stdout, stderr=stderr))
    if answer is not None and not failed and exit_code == 0:
        result = clean(answer).strip()
        return Turn(ok=True, result=result, subtype=subtype, session_id=session_id)
    said = failure or last_lines(stderr)
    return Turn(
        ok=False,
        error=message(said or f"exited with {exit_code}"),
        subtype=subtype,
        session_id=session_id,
    )


def no_result_message(exit_code: int, *, stdout: str, stderr: str) -> str:
    """Why a turn that printed no result failed, in a line or two."""
    said = last_lines(stderr) or last_lines(stdout)
    if exit_code == 0:
        return message(f"printed no JSON result; {said}" if said else "printed nothing")
    return message(said or f"exited with {exit_code} and printed nothing")


def last_lines(output: str) -> str:
    """The last non-blank lines of ``output``, cleaned, joined with a dot."""
    lines = [line.strip() for line in clean(output).splitlines()]
    return " · ".join([line for line in lines if line][-_MESSAGE_LINES:])


def message(text: str) -> str:
    """``text`` on one line, cleaned and cut to :data:`MAX_MESSAGE_CHARS`."""
    flat = " ".join(clean(text).split())
    return flat if len(flat) <= MAX_MESSAGE_CHARS else flat[: MAX_MESSAGE_CHARS - 1] + "…"


def clean(text: str) -> str:
    """``text`` without terminal escapes, control characters and lone surrogates."""
    # A lone surrogate (valid in JSON) cannot be encoded to send on; NUL and escapes are noise.
    text = text.encode("utf-8", "replace").decode("utf-8")
    return _TERMINAL_NOISE.sub("", text)


def text(value: object) -> str:
    """``value`` when it is a string, else empty."""
    return value if isinstance(value, str) else ""


def safe_id(printed: str) -> str:
    """``printed`` when it may be kept as a harness-chosen session id, else empty."""
    return printed if SAFE_ID.fullmatch(printed) else ""
