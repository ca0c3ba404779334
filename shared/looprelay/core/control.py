"""Control keywords in comments, arming by label, and the work item's control state.

Keywords are read from comment and review bodies only, never from issue or PR descriptions
, and never from quoted lines or code (:func:`~looprelay.core.policy.strip_quotes_and_code`):
quoting an earlier "the-loop stop", or showing the syntax in backticks, does not run it again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple

from looprelay.core.envelope import Envelope
from looprelay.core.policy import (
    COMMENT_EVENTS,
    LIFECYCLE_EVENTS,
    Authorization,
    event_actor,
    strip_quotes_and_code,
)


class Command(StrEnum):
    """What a keyword asks for (minus the-loop's ``contribute`` and ``do``)."""

    START = "start"
    STOP = "stop"
    PAUSE = "pause"
    RESUME = "resume"
    EXECUTE = "execute"
    CLEANUP = "cleanup"


DEFAULT_KEYWORDS: Mapping[Command, str] = MappingProxyType({c: f"the-loop {c}" for c in Command})
NEW_COMMENT_ACTIONS = frozenset({"created", "submitted"})
"""Fixes B10 / discrepancy 5: an edited, deleted or dismissed comment never runs a command."""
ARMING_ACTIONS = frozenset({"opened", "reopened"})

# Whole word: not glued to a word character, '-', ':', '/' or '\' on either side, nor to a
# '.' that touches a word (`x.the-loop start`, `the-loop start.py`); `the-loop start.` counts.
_BEFORE = r"(?<![\w\-:/\\])(?<!\w\.)"
_AFTER = r"(?![\w\-:/\\])(?!\.\w)"
# Any whitespace between a keyword's words, but not a blank line: "the-loop\n\nStart over" is
# two paragraphs. Possessive, so a long run of spaces is read once.
_GAP = r"(?:[^\S\n]++\n?+|\n)[^\S\n]*+"


@dataclass(frozen=True)
class Keywords:
    """The enabled commands and their keyword text (``routing.control.keywords``)."""

    by_command: tuple[tuple[Command, str], ...]
    pattern: re.Pattern[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        seen: dict[str, Command] = {}
        for command, text in self.by_command:
            if not text.split():
                raise ValueError(f"{command} has an empty keyword; leave it out to disable it")
            other = seen.setdefault(" ".join(text.lower().split()), command)
            if other is not command:
                raise ValueError(
                    f"{other} and {command} share the keyword {text!r}; make them differ"
                )
        object.__setattr__(self, "pattern", _keyword_pattern(self.by_command))

    @classmethod
    def from_config(cls, overrides: Mapping[str, str] | None = None) -> Keywords:
        """Build the keywords: defaults ``the-loop <verb>``, replaced per command by ``overrides``.

        Expects command name → keyword text; an empty string disables that command. Raises
        ``ValueError`` for an unknown command name or two commands sharing one keyword.
        """
        texts = dict(DEFAULT_KEYWORDS)
        for name, text in (overrides or {}).items():
            if name not in Command.__members__.values():
                valid = ", ".join(Command)
                raise ValueError(f"routing.control.keywords has no command {name!r}; use {valid}")
            texts[Command(name)] = " ".join(text.split())
        return cls(tuple((command, text) for command, text in texts.items() if text))


def _keyword_pattern(by_command: tuple[tuple[Command, str], ...]) -> re.Pattern[str]:
    # Longest first, so "go now" wins over "go" where both would match. Each word matches with
    # ASCII-only case folding: otherwise U+017F (long s) would match 's', U+212A (Kelvin) 'k'.
    ordered = sorted(by_command, key=lambda pair: -len(pair[1]))
    words = {c: _GAP.join(f"(?a:{re.escape(w)})" for w in t.split()) for c, t in ordered}
    alternatives = "|".join(f"(?P<{command}>{regex})" for command, regex in words.items())
    return re.compile(f"{_BEFORE}(?:{alternatives or '(?!)'}){_AFTER}", re.IGNORECASE)


def find_commands(body: str, keywords: Keywords) -> tuple[Command, ...]:
    """Return each distinct command whose keyword ``body`` contains, in order of appearance.

    Expects a comment or review body; quotes and code are skipped (:func:`strip_quotes_and_code`).
    The phase-selection gate must read ``execute`` through this too, with the same
    :class:`Keywords` (fixes discrepancies 1 and 2: a stale key, a looser substring test).
    Never raises.
    """
    found = keywords.pattern.finditer(strip_quotes_and_code(body))
    return tuple(dict.fromkeys(Command(match.lastgroup or "") for match in found))


class Verdict(StrEnum):
    """What a comment's keywords amount to."""

    NONE = "none"
    COMMAND = "command"
    AMBIGUOUS = "ambiguous"
    UNAUTHORIZED = "unauthorized-actor"
    NOT_NEW = "comment-not-new"


@dataclass(frozen=True)
class CommandRecord:
    """One recognised command, for the event log."""

    command: Command
    keyword: str
    actor: str | None
    comment_id: int | None
    delivery_id: str


@dataclass(frozen=True)
class ControlReading:
    """The verdict on a comment and a record per distinct command it named."""

    verdict: Verdict
    records: tuple[CommandRecord, ...] = ()

    @property
    def command(self) -> Command | None:
        """The command to run, only when the verdict is ``COMMAND``."""
        return self.records[0].command if self.verdict is Verdict.COMMAND else None


def read_command(
    envelope: Envelope, *, keywords: Keywords, authorization: Authorization
) -> ControlReading:
    """Read the control command in a comment or review event, if any.

    Expects the envelope and the policy's decision on its actor. Only ``ALLOWED`` actors
    command (CI and close-only events never do). Checks in order: keywords present, a
    new comment (fixes B10), an authorized actor, one distinct command. Never raises.
    """
    comment = envelope.comment
    if envelope.event not in COMMENT_EVENTS or comment is None:
        return ControlReading(Verdict.NONE)
    actor, texts = event_actor(envelope), dict(keywords.by_command)
    login = actor.login if actor else None
    records = tuple(
        CommandRecord(command, texts[command], login, comment.id, envelope.delivery_id)
        for command in find_commands(comment.body, keywords)
    )
    if not records:
        return ControlReading(Verdict.NONE)
    if envelope.action not in NEW_COMMENT_ACTIONS:
        return ControlReading(Verdict.NOT_NEW, records)
    if authorization is not Authorization.ALLOWED:
        return ControlReading(Verdict.UNAUTHORIZED, records)
    return ControlReading(Verdict.COMMAND if len(records) == 1 else Verdict.AMBIGUOUS, records)


class Signal(StrEnum):
    """A lifecycle input to the control state that is not a typed command."""

    ARM = "arm"
    CLOSE = "close"


def envelope_labels(envelope: Envelope) -> list[str]:
    """Return the labels of the issue or pull request an event is on."""
    if envelope.issue is not None:
        return envelope.issue.labels
    return envelope.pull_request.labels if envelope.pull_request else []


def read_signal(
    envelope: Envelope, *, auto_execute_label: str | None, authorization: Authorization
) -> Signal | None:
    """Return ``CLOSE`` for a closed issue or PR, ``ARM`` when it gets the auto-execute label.

    Expects ``routing.autoExecuteLabel`` (None or "" arms nothing; names compared exactly)
    and the policy's decision. A close counts from anyone (``CLOSE_ONLY``); arming needs an
    ``ALLOWED`` actor, as arming alone may start a session. Never raises.
    """
    if envelope.event not in LIFECYCLE_EVENTS:
        return None
    if envelope.action == "closed":
        allowed = {Authorization.ALLOWED, Authorization.CLOSE_ONLY}
        return Signal.CLOSE if authorization in allowed else None
    if not auto_execute_label or authorization is not Authorization.ALLOWED:
        return None
    labels = envelope_labels(envelope)
    labeled = envelope.action == "labeled" and envelope.label == auto_execute_label
    present = envelope.action in ARMING_ACTIONS and auto_execute_label in labels
    return Signal.ARM if labeled or present else None


class ControlState(StrEnum):
    """Where a work item stands, as far as humans' commands go."""

    IDLE = "idle"
    ARMED = "armed"
    STARTED = "started"
    PAUSED = "paused"
    STOPPED = "stopped"
    CLEANED = "cleaned"


class Action(StrEnum):
    """What to do to the work item's sessions: SPAWN its session; TERMINATE it (the checkout
    stays); PAUSE (hold events, not replayed) and RESUME; EXECUTE (freeze the phase selection and
    hand the comment to the session); CLEANUP (end every session, release local resources)."""

    SPAWN = "spawn"
    TERMINATE = "terminate"
    PAUSE = "pause"
    RESUME = "resume"
    EXECUTE = "execute"
    CLEANUP = "cleanup"


@dataclass(frozen=True)
class NoOp:
    """Nothing to do, and why."""

    reason: str


Effect = Action | NoOp


class Transition(NamedTuple):
    """The state after an input, and what to do about it."""

    state: ControlState
    effects: tuple[Effect, ...]


# Scenario (requireStartCommand on). The label lands on issue #7: IDLE -> ARMED, nothing runs
# ("awaiting-start"). An authorized "the-loop start": ARMED -> STARTED, SPAWN. "the-loop pause":
# -> PAUSED, PAUSE (later events held, delivered in order on resume; or dropped, with
# routing.pausedEvents: drop). "the-loop resume", or another start: -> STARTED, RESUME.
# "the-loop stop": -> STOPPED, TERMINATE; the item stays armed, so a later start spawns again.
# The issue closes: -> IDLE (TERMINATE if a session runs), as closing clears the control
# record; reopening it labelled arms it again. "the-loop cleanup", from any state: -> CLEANED,
# CLEANUP; only a new label arms it again. A start on an item never armed, a resume with nothing
# paused, a stop with nothing running: NoOp with a reason, state unchanged.
# A start on a started item whose own session exited or was lost respawns it (SPAWN).
# With requireStartCommand off, arming is the start.
_S, _C = ControlState, Command
_ARMABLE = frozenset({_S.IDLE, _S.CLEANED, _S.STOPPED, _S.ARMED})
_TABLE: Mapping[tuple[ControlState, Command | Signal], tuple[ControlState, Effect]] = {
    (_S.ARMED, _C.START): (_S.STARTED, Action.SPAWN),
    (_S.STOPPED, _C.START): (_S.STARTED, Action.SPAWN),
    (_S.STARTED, _C.START): (_S.STARTED, NoOp("already-started")),
    (_S.PAUSED, _C.START): (_S.STARTED, Action.RESUME),
    (_S.ARMED, _C.STOP): (_S.STOPPED, NoOp("nothing-running")),
    (_S.STARTED, _C.STOP): (_S.STOPPED, Action.TERMINATE),
    (_S.PAUSED, _C.STOP): (_S.STOPPED, Action.TERMINATE),
    (_S.STOPPED, _C.STOP): (_S.STOPPED, NoOp("already-stopped")),
    (_S.STARTED, _C.PAUSE): (_S.PAUSED, Action.PAUSE),
    (_S.PAUSED, _C.PAUSE): (_S.PAUSED, NoOp("already-paused")),
    (_S.PAUSED, _C.RESUME): (_S.STARTED, Action.RESUME),
    (_S.STARTED, _C.EXECUTE): (_S.STARTED, Action.EXECUTE),
    (_S.PAUSED, _C.EXECUTE): (_S.PAUSED, NoOp("paused")),
    (_S.STARTED, Signal.CLOSE): (_S.IDLE, Action.TERMINATE),
    (_S.PAUSED, Signal.CLOSE): (_S.IDLE, Action.TERMINATE),
    (_S.ARMED, Signal.CLOSE): (_S.IDLE, NoOp("nothing-running")),
    (_S.STOPPED, Signal.CLOSE): (_S.IDLE, NoOp("nothing-running")),
    (_S.STARTED, Signal.ARM): (_S.STARTED, NoOp("already-started")),
    (_S.PAUSED, Signal.ARM): (_S.PAUSED, NoOp("paused")),
}
_UNCHANGED: Mapping[Command | Signal, str] = {
    _C.START: "not-armed",
    _C.STOP: "nothing-to-stop",
    _C.PAUSE: "nothing-to-pause",
    _C.RESUME: "nothing-to-resume",
    _C.EXECUTE: "not-started",
    _C.CLEANUP: "cleaned",
    Signal.CLOSE: "nothing-running",
    Signal.ARM: "already-armed",
}


def apply_command(
    state: ControlState,
    command: Command | Signal,
    *,
    require_start: bool = True,
    session_running: bool = True,
) -> Transition:
    """Return the work item's next control state and the effects of ``command`` (see above).

    Expects the current state, an authorized command or a lifecycle signal,
    ``routing.control.requireStartCommand`` and whether the work item's own session runs
    (pending or live): a start on a started item whose harness exited or was lost respawns it.
    Cleanup works from any state. Never raises.
    """
    if command is Command.START and state is _S.STARTED and not session_running:
        return Transition(_S.STARTED, (Action.SPAWN,))
    if command is Command.CLEANUP:
        return Transition(_S.CLEANED, (Action.CLEANUP,))
    if command is Signal.ARM and state in _ARMABLE:
        if not require_start:
            return Transition(_S.STARTED, (Action.SPAWN,))
        if state is not _S.ARMED:
            return Transition(_S.ARMED, (NoOp("awaiting-start"),))
    new_state, effect = _TABLE.get((state, command), (state, NoOp(_UNCHANGED[command])))
    return Transition(new_state, (effect,))
