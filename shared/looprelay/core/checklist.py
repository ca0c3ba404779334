"""The phase-selection checklist: render its rows, parse ticks, freeze the answer.

When a work item starts, looprelay posts one checklist comment: a row per
selectable phase, the surface row ``outer-loop-on-pull-request`` and three radio rows
``pr-sessions-*`` with the operator's default pre-ticked. An authorized reply carrying the
execute keyword freezes whatever is ticked at that moment.

Predecessor discrepancies fixed here (reference, "Observed discrepancies"):

- #1: the execute keyword and the pre-ticked ``sessionPerPr`` default are arguments the caller
  resolves from the current config, never read from a stale location.
- #3: :func:`freeze_selection` reads only the body of looprelay's *own recorded* checklist
  comment (by the id recorded when it was posted), never whichever comment carries the marker.
- #2 is the caller's: deciding that a reply *is* an execute command is control parsing
  (whole-token), not a substring test here.

The rendered body carries no loop marker; the module that posts it appends one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from looprelay.core.prsessions import SESSION_PER_PR_MODES, SessionPerPr

Surface = Literal["work-item", "pull-request"]
SelectionSource = Literal["reply", "recorded-comment", "default"]

SURFACE_TOKEN: Final = "outer-loop-on-pull-request"  # noqa: S105  # a row token, not a secret
PR_SESSIONS_PREFIX: Final = "pr-sessions-"
PR_SESSIONS_TOKENS: Final[dict[str, SessionPerPr]] = {
    PR_SESSIONS_PREFIX + mode: mode for mode in SESSION_PER_PR_MODES
}
_PR_SESSIONS_MEANING: Final[dict[SessionPerPr, str]] = {
    "never": "every pull request talks to the work item's session",
    "cross-repository": "a pull request in another repository gets its own session",
    "always": "every linked pull request gets its own session",
}
_PHASE_TOKEN = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
# A task-list item: bullet, box, one token (bare or in backticks) ending at a space or the line.
_ROW = re.compile(r"[ \t]*[-*+][ \t]+\[([ xX])\][ \t]+(`?)([A-Za-z0-9][A-Za-z0-9_.-]{0,99})\2")
# Fences count at any indent (a list item indents them), as in policy.py: reading less is the
# safe side, since an unread row falls back to the recorded comment or the defaults.
_FENCE = re.compile(r"[ \t]*(`{3,}|~{3,})")
# CommonMark's line endings only: str.splitlines would also split on U+2028 and friends, which
# GitHub renders inside one line, so a row could hide in what readers see as prose.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Phase:
    """A selectable phase: its token, a human label, and whether it runs only when ticked."""

    token: str
    label: str
    opt_in: bool = False


@dataclass(frozen=True)
class ChecklistRow:
    """One checklist row as written: its token and whether its box is ticked."""

    token: str
    ticked: bool


@dataclass(frozen=True)
class GraphSelection:
    """The frozen answer of one work item's phase-selection gate.

    ``source`` says which body answered: the execute ``reply``, looprelay's
    ``recorded-comment``, or ``default`` when neither carried a row of this checklist.
    ``notes`` say, for the confirmation comment, why a default applied.
    """

    phases_selected: tuple[str, ...]
    phases_skipped: tuple[str, ...]
    surface: Surface
    session_per_pr: SessionPerPr
    actor: str
    at: datetime
    source: SelectionSource
    notes: tuple[str, ...] = ()


def render_checklist(
    *, phases: Sequence[Phase], default_session_per_pr: SessionPerPr, execute_keyword: str
) -> str:
    """Render the checklist comment body as GitHub task-list markdown, without a marker.

    Expects the selectable phases in process order (protected phases are not rows), the
    operator's resolved default (pre-ticked) and the configured execute keyword. The output is
    a pure function of the arguments. Raises ``ValueError`` for a phase token outside
    ``[a-z0-9][a-z0-9-]*`` (at most 64 chars), a reserved or repeated token, or an execute
    keyword that is empty or holds a backtick or line break.
    """
    _check_phases(phases)
    if not execute_keyword.strip() or any(c in execute_keyword for c in "`\r\n"):
        raise ValueError("the execute keyword must be one line of text without backticks")
    lines = [
        "### Phase selection",
        "",
        "Untick a phase to skip it; tick an optional phase to run it where it is listed. Then "
        f"reply `{execute_keyword}` to freeze the selection: until then the session reads, "
        "plans and asks. A reply that carries its own copy of these rows wins over the boxes "
        "here.",
        "",
        "**Phases**",
        "",
        *(_phase_row(phase) for phase in phases),
        *(() if phases else ("Every phase of this loop runs; none can be skipped here.",)),
        "",
        "**Where the outer loop iterates**",
        "",
        f"- [ ] `{SURFACE_TOKEN}` — iterate on the pull request instead of the work item",
        "",
        "**Sessions for pull requests** (tick exactly one; this deployment's default is "
        f"`{default_session_per_pr}`)",
        "",
        *(_pr_sessions_row(mode, mode == default_session_per_pr) for mode in SESSION_PER_PR_MODES),
    ]
    return "\n".join(lines) + "\n"


def parse_checklist(body: str) -> tuple[ChecklistRow, ...]:
    """Return every task-list row of a comment body, in order.

    Expects a comment body. A row is ``- [x] token``, ``* [X] token`` or ``- [ ] token`` (also
    ``+``, any indentation), the token bare or in backticks and followed by a space or the end
    of the line; tokens are kept exactly as written (case matters). Rows inside fenced code
    blocks (backticks or tildes, per CommonMark) and quoted lines (``> - [x] ...``, someone
    else's words) are not rows; a fence opens at any indentation. Never raises.
    """
    rows = []
    for line in _unfenced_lines(body):
        match = _ROW.match(line)
        if match and line[match.end() :][:1] in ("", " ", "\t"):
            rows.append(ChecklistRow(token=match.group(3), ticked=match.group(1) != " "))
    return tuple(rows)


def ticked_tokens(rows: Sequence[ChecklistRow]) -> frozenset[str]:
    """Return the tokens that at least one row ticks.

    Expects rows from :func:`parse_checklist`. A token both ticked and unticked counts as
    ticked: a skip must be stated without contradiction. Never raises.
    """
    return frozenset(row.token for row in rows if row.ticked)


def freeze_selection(
    *,
    reply_body: str,
    recorded_body: str | None,
    phases: Sequence[Phase],
    default_session_per_pr: SessionPerPr,
    actor: str,
    at: datetime,
) -> GraphSelection:
    """Freeze the selection an authorized execute reply makes.

    Expects the execute reply's body, the current body of looprelay's OWN recorded checklist
    comment (None when absent or unreadable), the phases the checklist was rendered with, the
    operator's resolved default, the replying actor and a timezone-aware time. The caller must
    have checked the actor is authorized and that ``recorded_body`` was read by the comment id
    looprelay recorded when posting, never found by searching for a marker a third party can
    copy (discrepancy #3). A reply carrying any row of this checklist wins; else the recorded
    body; else the checklist's defaults. Raises ``ValueError`` for invalid phases, an empty
    actor or a naive time.
    """
    _check_phases(phases)
    if not actor:
        raise ValueError("a frozen selection names the actor who made it")
    if at.tzinfo is None:
        raise ValueError("a frozen selection's time must be timezone-aware")
    source, rows, notes = _answering_rows(reply_body, recorded_body, phases)
    ticked = ticked_tokens(rows)
    mentioned = frozenset(row.token for row in rows)
    selected = tuple(p.token for p in phases if _runs(p, ticked=ticked, mentioned=mentioned))
    mode, mode_note = _session_per_pr(ticked, default_session_per_pr)
    return GraphSelection(
        phases_selected=selected,
        phases_skipped=tuple(p.token for p in phases if p.token not in selected),
        surface="pull-request" if SURFACE_TOKEN in ticked else "work-item",
        session_per_pr=mode,
        actor=actor,
        at=at,
        source=source,
        notes=notes + ((mode_note,) if mode_note else ()),
    )


def _answering_rows(
    reply_body: str, recorded_body: str | None, phases: Sequence[Phase]
) -> tuple[SelectionSource, tuple[ChecklistRow, ...], tuple[str, ...]]:
    known = {p.token for p in phases} | {SURFACE_TOKEN}
    reply_rows = _own_rows(parse_checklist(reply_body), known)
    if reply_rows:
        return "reply", reply_rows, ()
    recorded_rows = _own_rows(parse_checklist(recorded_body or ""), known)
    if recorded_rows:
        return "recorded-comment", recorded_rows, ()
    why = "unreadable or absent" if recorded_body is None else "without checklist rows"
    return "default", (), (f"no checklist rows in the reply; recorded checklist {why}",)


def _own_rows(rows: tuple[ChecklistRow, ...], known: set[str]) -> tuple[ChecklistRow, ...]:
    # Only rows of this checklist count, so an unrelated to-do list in a reply does not
    # discard the ticks on looprelay's comment; any pr-sessions-* token counts.
    return tuple(r for r in rows if r.token in known or r.token.startswith(PR_SESSIONS_PREFIX))


def _runs(phase: Phase, *, ticked: frozenset[str], mentioned: frozenset[str]) -> bool:
    # C9: an opt-in phase runs only when ticked; a default-on phase runs unless a row names it
    # and none ticks it (an unmentioned phase runs).
    if phase.opt_in:
        return phase.token in ticked
    return phase.token in ticked or phase.token not in mentioned


def _session_per_pr(
    ticked: frozenset[str], default: SessionPerPr
) -> tuple[SessionPerPr, str | None]:
    # C11: exactly one distinct ticked pr-sessions-* row is the answer; none, several or an
    # unknown token keep the operator's default (the value in force before the reply).
    chosen = sorted(t for t in ticked if t.startswith(PR_SESSIONS_PREFIX))
    if len(chosen) == 1 and chosen[0] in PR_SESSIONS_TOKENS:
        return PR_SESSIONS_TOKENS[chosen[0]], None
    if not chosen:
        why = "no pr-sessions row ticked"
    elif len(chosen) > 1:
        why = f"{len(chosen)} pr-sessions rows ticked ({', '.join(chosen)})"
    else:
        why = f"unknown row {chosen[0]} ticked"
    return default, f"{why}; kept the default sessionPerPr {default}"


def _check_phases(phases: Sequence[Phase]) -> None:
    seen: set[str] = set()
    for phase in phases:
        if not _PHASE_TOKEN.fullmatch(phase.token):
            raise ValueError(f"phase token {phase.token!r} is not [a-z0-9][a-z0-9-]* (≤ 64)")
        if phase.token == SURFACE_TOKEN or phase.token.startswith(PR_SESSIONS_PREFIX):
            raise ValueError(f"phase token {phase.token!r} is reserved for a non-phase row")
        if phase.token in seen:
            raise ValueError(f"phase token {phase.token!r} is listed twice")
        seen.add(phase.token)


def _phase_row(phase: Phase) -> str:
    box = "[ ]" if phase.opt_in else "[x]"
    label = " ".join(phase.label.split())
    suffix = " (optional)" if phase.opt_in else ""
    return f"- {box} `{phase.token}`" + (f" — {label}{suffix}" if label or suffix else "")


def _pr_sessions_row(mode: SessionPerPr, ticked: bool) -> str:
    box = "[x]" if ticked else "[ ]"
    return f"- {box} `{PR_SESSIONS_PREFIX}{mode}` — {_PR_SESSIONS_MEANING[mode]}"


def _unfenced_lines(body: str) -> Iterator[str]:
    # CommonMark fenced code: opened by ≥3 backticks or tildes, closed by a line of the same
    # character at least as long with nothing after it; an unclosed fence runs to the end.
    fence: str | None = None
    for line in _LINE_BREAK.split(body):
        opener = _FENCE.match(line)
        if fence is None:
            if opener:
                fence = opener.group(1)
            else:
                yield line
        elif opener and _closes(line, opener.group(1), fence):
            fence = None


def _closes(line: str, run: str, fence: str) -> bool:
    return run[0] == fence[0] and len(run) >= len(fence) and not line.strip()[len(run) :].strip()
