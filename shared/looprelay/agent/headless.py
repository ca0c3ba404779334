"""Reading what one headless harness turn printed: its answer, or why it failed.

Both harnesses, run with ``-p --output-format json``, print one JSON object on stdout when the
turn ends, and Claude exits 1 when ``is_error`` is true::

    {"type": "result", "subtype": "success", "is_error": true, "num_turns": 1,
     "result": "Not logged in · Please run /login", "session_id": "<uuid>", ...}

cursor-agent prints the same shape (``type``, ``subtype``, ``is_error``, ``result``,
``session_id``). With ``--output-format stream-json`` the result object is the last line. Pure:
the text comes in, a :class:`Turn` goes out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from looprelay.agent.harness import CLAUDE, is_session_id

MAX_MESSAGE_CHARS = 300
"""A failure message is a line or two for people; the output's tail stays in the detail."""
MAX_CANDIDATES = 64
"""Lines that start a JSON object, tried from the last one back, before giving up."""
_MESSAGE_LINES = 2
_OBJECT_START = re.compile(r"^\{", re.MULTILINE)
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")
# CSI and OSC sequences (colours, titles) and other control characters are noise in a message.
_TERMINAL_NOISE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, links
    r"|[\x00-\x08\x0b-\x1f\x7f]"  # other control characters; tab and newline stay
)


@dataclass(frozen=True)
class Turn:
    """What a headless turn came to.

    ``ok`` is true only for a zero exit with a result object that is not an error. ``result``
    is the answer text (empty on a failure); ``error`` is the harness's own message when the
    turn failed (its ``result`` for ``is_error``, else the last line of stderr or stdout);
    ``session_id`` is the printed id, or empty when there is none or it is not safe to use.
    """

    ok: bool
    result: str = ""
    error: str = ""
    subtype: str = ""
    session_id: str = ""


def parse_turn(harness: str, *, exit_code: int, stdout: str, stderr: str) -> Turn:
    """Read one turn's exit code and output into a :class:`Turn`.

    Expects the decoded output (or its tail); noise before the JSON object, a stream whose last
    line is the result, undecodable bytes already replaced, empty or huge output are all fine.
    A Claude ``session_id`` counts only as a canonical UUID; cursor-agent's is kept when it is
    1-100 of ``A-Z a-z 0-9 . _ : -``. Never raises.
    """
    found = _result_object(stdout)
    if found is None:
        return Turn(ok=False, error=_no_result_message(exit_code, stdout=stdout, stderr=stderr))
    subtype = _text(found.get("subtype"))
    answer = _clean(_text(found.get("result"))).strip()
    failed = found.get("is_error") is True or subtype.startswith("error")
    session_id = _session_id(harness, _text(found.get("session_id")))
    if not failed and exit_code == 0:
        return Turn(ok=True, result=answer, subtype=subtype, session_id=session_id)
    message = answer if failed else ""
    message = message or _errors(found) or (subtype if failed else "") or _last_lines(stderr)
    return Turn(
        ok=False,
        error=_message(message or f"exited with {exit_code}"),
        subtype=subtype,
        session_id=session_id,
    )


def _result_object(stdout: str) -> dict[str, Any] | None:
    """The last JSON object starting a line that looks like a turn's result, if any."""
    decoder = json.JSONDecoder()
    starts = [match.start() for match in _OBJECT_START.finditer(stdout)]
    for start in reversed(starts[-MAX_CANDIDATES:]):
        try:
            value, _ = decoder.raw_decode(stdout, start)
        except (ValueError, RecursionError):  # cut off, not JSON, or nested past the C stack
            continue
        if isinstance(value, dict) and (value.get("type") == "result" or "is_error" in value):
            return value
    return None


def _no_result_message(exit_code: int, *, stdout: str, stderr: str) -> str:
    said = _last_lines(stderr) or _last_lines(stdout)
    if exit_code == 0:
        return _message(f"printed no JSON result; {said}" if said else "printed nothing")
    return _message(said or f"exited with {exit_code} and printed nothing")


def _errors(found: dict[str, Any]) -> str:
    # Newer Claude versions list error texts for the error_* subtypes, which carry no result.
    errors = found.get("errors")
    if not isinstance(errors, list):
        return ""
    return "; ".join(_text(e) for e in errors if _text(e))


def _session_id(harness: str, printed: str) -> str:
    if harness == CLAUDE:
        return printed if is_session_id(printed) else ""
    return printed if _SAFE_ID.fullmatch(printed) else ""


def _last_lines(output: str) -> str:
    lines = [line.strip() for line in _clean(output).splitlines()]
    return " · ".join([line for line in lines if line][-_MESSAGE_LINES:])


def _message(text: str) -> str:
    flat = " ".join(_clean(text).split())
    return flat if len(flat) <= MAX_MESSAGE_CHARS else flat[: MAX_MESSAGE_CHARS - 1] + "…"


def _clean(text: str) -> str:
    # A lone surrogate (valid in JSON) cannot be encoded to send on; NUL and escapes are noise.
    text = text.encode("utf-8", "replace").decode("utf-8")
    return _TERMINAL_NOISE.sub("", text)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
