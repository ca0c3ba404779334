"""Interaction mode: where a session takes its answers from, and the directive that says so.

Seeds 000-002 (and F7): ``routing.interaction.mode`` is ``work-item`` (the default) or
``cli``. The directive is constant text per mode, chosen by a closed enum and never built from
payload data, so there is no path from a commenter's text into it (security). Prompt
templates carry it in the ``interaction_directive`` variable; a template that does not use the
variable gets the directive appended, so a template edit cannot drop the rule (abuse case 3).

The mode is deployment-wide: a per-work-item mode is out of scope (docs/traceability.md).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Final, Literal

InteractionMode = Literal["work-item", "cli"]

MODE_WORK_ITEM: Final = "work-item"
MODE_CLI: Final = "cli"
MODES: Final[tuple[InteractionMode, ...]] = ("work-item", "cli")
DEFAULT_MODE: Final[InteractionMode] = "work-item"
PLACEHOLDER: Final = "interaction_directive"
RUNNER_PROCESS: Final = "process"
AGENT_COMMENT_MARKER: Final = "<!-- looprelay:agent-comment -->"
"""Ends every comment a session posts, so loop prevention drops it."""

_BY_NAME: Final[dict[str, InteractionMode]] = {mode: mode for mode in MODES}
_WARNING_VALUE_CAP = 80

ARTIFACT_RULE: Final = (
    "Artifacts are reviewed on their pull request. Once brainstorm.md, requirements.md or "
    "bugfix.md, design.md or tasks.md exists, iterate on it only through pull-request review: "
    "commit and push it, open or update the pull request that carries it, and take feedback as "
    "review comments and replies there. Never paste an artifact's contents into a work-item "
    "comment, and never settle an artifact in an interactive exchange that leaves no trail."
)

SESSION_COMMANDS: Final = (
    "Post on GitHub through looprelay, never with your own gh or git credentials: "
    "`looprelay session comment --body-file FILE` ('-' reads stdin) posts a comment on the "
    "work item (on the pull request, in a pull request's session), marked as yours, and "
    "`looprelay session ask --question '...'` (or --question-file FILE) posts a question and "
    "marks this session awaiting input. Only if these commands are missing or refuse this "
    f"session, post by hand and end the comment with the line {AGENT_COMMENT_MARKER} so it is "
    "recognised as your own."
)

DIRECTIVE_WORK_ITEM: Final = (
    "## Interaction mode: work-item\n"
    "\n"
    "Do not assume anyone is watching this terminal: it may be a headless pipe or a tmux pane "
    "nobody has attached to. Ask every question, and request every decision, approval or review, "
    "with `looprelay session ask` on the work item or its pull request. Then stop and wait: the "
    "reply arrives in this session as a new event. Never block on an interactive prompt and "
    "never read silence as consent; if you are blocked, say so once on the work item and move "
    "on to what you can still do.\n"
    "\n" + SESSION_COMMANDS + "\n"
    "\n" + ARTIFACT_RULE + "\n"
)

DIRECTIVE_CLI: Final = (
    "## Interaction mode: cli\n"
    "\n"
    "A human is attached to this session: ask your questions here, interactively. The paper "
    "trail still holds: record the outcome of every human decision with `looprelay session "
    "comment` on the work item.\n"
    "\n" + SESSION_COMMANDS + "\n"
    "\n" + ARTIFACT_RULE + "\n"
)

DIRECTIVES: Final[dict[InteractionMode, str]] = {
    "work-item": DIRECTIVE_WORK_ITEM,
    "cli": DIRECTIVE_CLI,
}


@dataclass(frozen=True)
class ModeResolution:
    """The resolved mode and, when the configured value deserved one, a warning to log."""

    mode: InteractionMode
    warning: str | None = None

    @property
    def directive(self) -> str:
        """The constant directive text of :attr:`mode`."""
        return DIRECTIVES[self.mode]


def resolve_mode(raw: object, *, runner_kind: str) -> ModeResolution:
    """Resolve the configured ``routing.interaction.mode`` value.

    Expects the raw value (None when absent) and the runner kind (``tmux`` | ``process``).
    Strings are trimmed and lower-cased (``"  CLI "`` is ``cli``). None resolves to
    ``work-item`` silently: nothing was declared, so nothing is wrong. Any other value,
    ``""``, ``"terminal"``, ``7`` or a list included, resolves to ``work-item``, never ``cli``,
    with a warning naming the value and the valid set (abuse case 2). ``cli``
    with the headless ``process`` runner is kept, with a warning: nobody can answer in a pipe,
    but the operator's declaration stands. Never raises.
    """
    if raw is None:
        return ModeResolution(DEFAULT_MODE)
    mode = _BY_NAME.get(raw.strip().lower()) if isinstance(raw, str) else None
    if mode is None:
        return ModeResolution(
            DEFAULT_MODE,
            f"routing.interaction.mode: {_capped_repr(raw)} is not one of "
            f"{', '.join(MODES)}; using {DEFAULT_MODE}",
        )
    if mode == "cli" and runner_kind == RUNNER_PROCESS:
        return ModeResolution(
            mode,
            "routing.interaction.mode is cli but the runner is process: a headless session has "
            "no terminal for a human to answer in; use work-item or the tmux runner",
        )
    return ModeResolution(mode)


def directive_for(mode: InteractionMode) -> str:
    """Return the constant directive text of ``mode``.

    Expects a resolved mode (see :func:`resolve_mode`). Raises ``KeyError`` for anything else.
    """
    return DIRECTIVES[mode]


def needs_directive_appended(template_variables: AbstractSet[str]) -> bool:
    """Tell whether a rendered template must have the directive appended.

    Expects the template's undeclared variables, as ``jinja2.meta.find_undeclared_variables``
    reports them (a parse, not a substring search, so a comment or string mentioning the name
    does not count). True when :data:`PLACEHOLDER` is not among them. Never
    raises.
    """
    return PLACEHOLDER not in template_variables


def append_directive(text: str, directive: str) -> str:
    """Append the directive after a rendered prompt: right-stripped, a blank line, the directive.

    Expects the rendered prompt and one of :data:`DIRECTIVES`' values. Raises ``ValueError``
    when ``directive`` is not one of them: the directive is never built from data.
    """
    if directive not in DIRECTIVES.values():
        raise ValueError("append_directive takes one of the constant DIRECTIVES, not built text")
    body = text.rstrip()
    return f"{body}\n\n{directive}" if body else directive


def _capped_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _WARNING_VALUE_CAP else text[: _WARNING_VALUE_CAP - 3] + "..."
