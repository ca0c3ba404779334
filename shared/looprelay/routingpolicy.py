"""Resolve the ``routing`` config section into the core's ``RoutingPolicy`` and ``Templates``."""

from __future__ import annotations

import logging
import secrets

from looprelay.config import RoutingConfig
from looprelay.core.checklist import Phase
from looprelay.core.control import Keywords
from looprelay.core.interaction import resolve_mode
from looprelay.core.plan import RoutingPolicy, Templates
from looprelay.core.policy import AuthorizedUsers
from looprelay.core.prsessions import resolve_session_per_pr
from looprelay.errors import ConfigError
from looprelay.templateloader import (
    CHECKLIST_COMMENT,
    CONFIRMATION_COMMENT,
    EVENT_PROMPT,
    SPAWN_PROMPT,
    bundled_template,
    operator_template,
)

log = logging.getLogger("looprelay.routing")


def routing_policy(config: RoutingConfig) -> RoutingPolicy:
    """Build the policy, logging a warning for each value that fell back to a default.

    Raises ``ConfigError`` for values that cannot mean anything (a bad login, two commands
    sharing a keyword, a malformed phase token).
    """
    interaction = resolve_mode(config.interaction.mode, runner_kind=config.runner_kind)
    session_per_pr, warning = resolve_session_per_pr(config.session_per_pr)
    for text in (interaction.warning, warning):
        if text:
            log.warning(text)
    try:
        return RoutingPolicy(
            users=AuthorizedUsers.from_config(config.authorized_users),
            bot_logins=frozenset(config.bot_logins),
            keywords=Keywords.from_config(config.control.keywords),
            auto_execute_label=config.auto_execute_label,
            require_start=config.control.require_start_command,
            session_per_pr=session_per_pr,
            interaction=interaction,
            harness=config.harness,
            runner_kind=config.runner_kind,
            phases=tuple(Phase(p.token, p.label, p.opt_in) for p in config.phases),
        )
    except ValueError as exc:
        raise ConfigError(f"routing: {exc}") from exc


class TemplateSource:
    """The prompt and comment templates, read once; each decision gets a fresh boundary."""

    def __init__(self, config: RoutingConfig) -> None:
        """Read the operator's templates now. Raises ``ConfigError`` when one is unreadable."""
        self._event = (
            operator_template(config.prompt_template)
            if config.prompt_template
            else bundled_template(EVENT_PROMPT)
        )
        self._spawn = (
            operator_template(config.spawn_prompt_template)
            if config.spawn_prompt_template
            else bundled_template(SPAWN_PROMPT)
        )
        self._sandboxed_event = config.prompt_template is not None
        self._sandboxed_spawn = config.spawn_prompt_template is not None

    def for_decision(self) -> Templates:
        """Return the templates with a new random UNTRUSTED-block boundary."""
        return Templates(
            event_prompt=self._event,
            spawn_prompt=self._spawn,
            checklist_comment=bundled_template(CHECKLIST_COMMENT),
            confirmation_comment=bundled_template(CONFIRMATION_COMMENT),
            boundary=secrets.token_hex(16),
            sandboxed_event=self._sandboxed_event,
            sandboxed_spawn=self._sandboxed_spawn,
        )
