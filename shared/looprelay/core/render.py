"""Rendering prompts and comments from Jinja2 templates ("Prompts").

Bundled templates render in a plain environment; an operator's template renders sandboxed, so
it can format data but not reach Python objects. Either way only the variables below exist,
and a prompt template that does not use ``interaction_directive`` (found with ``jinja2.meta``,
not a substring search) gets the directive appended, so a template edit cannot drop the rule;
the same holds for a non-empty ``trust_notice``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from functools import cache, lru_cache
from typing import Any

from jinja2 import Environment, StrictUndefined, Template, TemplateSyntaxError, meta
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

from looprelay.core.forks import FORK_NOTICE
from looprelay.core.interaction import append_directive, needs_directive_appended

TRUST_NOTICES = frozenset({"", FORK_NOTICE})
"""The only texts ``trust_notice`` may hold: constants, never built from a payload."""

PROMPT_VARIABLES = frozenset(
    {
        "work_item",
        "endpoint",
        "event",
        "action",
        "repository",
        "delivery_id",
        "interaction_directive",
        "graph_context",
        "payload_excerpt",
        "trust_notice",
    }
)
_NAME = re.compile(r"^[a-z0-9_]{1,64}$")  # event and action names (projects_v2_item)
_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")
_DELIVERY = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_COMPILED_TEMPLATES = 64
"""Bundled and operator templates kept compiled (a handful in practice)."""


class TemplateError(ValueError):
    """A template cannot be rendered: bad syntax, an unknown variable, or a sandbox breach."""


@dataclass(frozen=True)
class PromptContext:
    """The only values a prompt template sees. ``payload_excerpt`` is the wrapped UNTRUSTED
    block; every other value is checked here so no payload text lands outside it."""

    work_item: str
    event: str
    action: str
    repository: str
    delivery_id: str
    interaction_directive: str
    graph_context: str
    payload_excerpt: str
    endpoint: str = ""
    """The session's own ref: a pull request's for a PR session, else the work item's."""
    trust_notice: str = ""
    """Constant text about untrusted code the event concerns (an unapproved fork head)."""

    def __post_init__(self) -> None:
        if not self.endpoint:
            object.__setattr__(self, "endpoint", self.work_item)
        if self.trust_notice not in TRUST_NOTICES:
            raise TemplateError("trust_notice must be one of the constant notices")
        # event/action/repository/delivery come from the payload: only their safe shapes may
        # stand outside the UNTRUSTED block.
        if not _NAME.match(self.event) or (self.action and not _NAME.match(self.action)):
            raise TemplateError("event and action must be lower-case names")
        if not _REPOSITORY.match(self.repository) or not _DELIVERY.match(self.delivery_id):
            raise TemplateError("repository or delivery id has an unexpected shape")


@cache
def _environment(sandboxed: bool) -> Environment:
    kind = SandboxedEnvironment if sandboxed else Environment
    return kind(autoescape=False, undefined=StrictUndefined, keep_trailing_newline=True)


@lru_cache(maxsize=_COMPILED_TEMPLATES)
def _compiled(source: str, sandboxed: bool) -> Template:
    # Compiling is most of a render's cost (milliseconds); the same few templates serve
    # every delivery, and a compiled template renders safely from many threads.
    return _environment(sandboxed).from_string(source)


@lru_cache(maxsize=_COMPILED_TEMPLATES)
def template_variables(source: str, *, sandboxed: bool = True) -> frozenset[str]:
    """Return the variables ``source`` reads; raises ``TemplateError`` on bad syntax."""
    try:
        return frozenset(meta.find_undeclared_variables(_environment(sandboxed).parse(source)))
    except TemplateSyntaxError as exc:
        raise TemplateError(f"template syntax error on line {exc.lineno}: {exc.message}") from exc


def check_prompt_template(source: str, *, sandboxed: bool) -> frozenset[str]:
    """Return the variables a prompt template reads; ``TemplateError`` when it does not parse
    or reads one that does not exist (checked at start, and again on each render)."""
    used = template_variables(source, sandboxed=sandboxed)
    unknown = sorted(used - PROMPT_VARIABLES)
    if unknown:
        known = ", ".join(sorted(PROMPT_VARIABLES))
        raise TemplateError(f"template uses unknown variables {unknown}; known: {known}")
    return used


def render_prompt(source: str, context: PromptContext, *, sandboxed: bool) -> str:
    """Render a prompt template, appending the directive when the template leaves it out.

    Expects template text and a checked context. Raises ``TemplateError`` when the template
    does not parse, reads a variable that does not exist, or breaks out of the sandbox.
    """
    used = check_prompt_template(source, sandboxed=sandboxed)
    text = _render(source, asdict(context), sandboxed=sandboxed)
    if needs_directive_appended(used):
        text = append_directive(text, context.interaction_directive)
    if context.trust_notice and "trust_notice" not in used:
        text = f"{text.rstrip()}\n\n{context.trust_notice}"
    return text


def render_comment(source: str, values: dict[str, Any]) -> str:
    """Render a bundled comment template with ``values``; raises ``TemplateError``."""
    return _render(source, values, sandboxed=True).strip() + "\n"


def _render(source: str, values: dict[str, Any], *, sandboxed: bool) -> str:
    try:
        return _compiled(source, sandboxed).render(**values)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"template syntax error on line {exc.lineno}: {exc.message}") from exc
    except (UndefinedError, SecurityError) as exc:
        raise TemplateError(f"template cannot render: {exc}") from exc
