"""Resolve the ``routing`` config section into the core's ``RoutingPolicy`` and ``Templates``."""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta

from looprelay.config.model import AuthorizedUser, RoutingConfig
from looprelay.config.templates import (
    CHECKLIST_COMMENT,
    CONFIRMATION_COMMENT,
    EVENT_PROMPT,
    SPAWN_PROMPT,
    bundled_template,
    operator_template,
)
from looprelay.core.checklist import Phase
from looprelay.core.control import Keywords
from looprelay.core.forks import ForkSessions
from looprelay.core.interaction import resolve_mode
from looprelay.core.plan import PausedEvents, RoutingPolicy, Templates
from looprelay.core.policy import AuthorizedUsers, CloseEndsSession, UserPin
from looprelay.core.prsessions import resolve_session_per_pr
from looprelay.core.render import TemplateError, check_prompt_template
from looprelay.errors import ConfigError

log = logging.getLogger("looprelay.routing")


def routing_policy(config: RoutingConfig) -> RoutingPolicy:
    """Build the policy, logging a warning for each value that fell back to a default and for
    logins authorized without a user id.

    Raises ``ConfigError`` for values that cannot mean anything (a bad login, a login pinned
    to two ids, two commands sharing a keyword, a malformed phase token).
    """
    interaction = resolve_mode(config.interaction.mode, runner_kind=config.runner_kind)
    session_per_pr, warning = resolve_session_per_pr(config.session_per_pr)
    for text in (interaction.warning, warning):
        if text:
            log.warning(text)
    try:
        users = AuthorizedUsers.from_config(
            [_core_entry(entry) for entry in config.authorized_users]
        )
        if not config.authorized_users:
            log.warning(
                "routing.authorizedUsers is empty: every event and command from a person is "
                "refused (fail closed); list who may drive sessions as `{login: LOGIN, id: ID}`"
            )
        if users.logins:
            log.warning(_unpinned_warning(users.logins))
        return RoutingPolicy(
            users=users,
            bot_logins=frozenset(config.bot_logins),
            keywords=Keywords.from_config(config.control.keywords),
            auto_execute_label=config.auto_execute_label,
            require_start=config.control.require_start_command,
            session_per_pr=session_per_pr,
            interaction=interaction,
            harness=config.harness,
            harness_labels=tuple(config.harness_labels.items()),
            runner_kind=config.runner_kind,
            phases=tuple(Phase(p.token, p.label, p.opt_in) for p in config.phases),
            close_ends_session=CloseEndsSession(config.close_ends_session),
            pr_session_wait=timedelta(seconds=config.pr_session_wait_seconds),
            fork_sessions=ForkSessions(config.fork_sessions),
            paused_events=PausedEvents(config.paused_events),
            answer_strangers=config.answer_strangers,
        )
    except ValueError as exc:
        raise ConfigError(f"routing: {exc}") from exc


def _core_entry(entry: str | int | AuthorizedUser) -> str | int | UserPin:
    if isinstance(entry, AuthorizedUser):
        return UserPin(entry.login, entry.id)
    return entry


def _unpinned_warning(logins: frozenset[str]) -> str:
    names = ", ".join(sorted(logins))
    return (
        f"routing.authorizedUsers lists {names} by login alone: each login is pinned to the "
        "user id of the first event seen with it, so whoever holds a login then is trusted; "
        "write `{login: LOGIN, id: ID}` to pin it now (`gh api users/LOGIN --jq .id`)"
    )


class TemplateSource:
    """The prompt and comment templates; each decision gets a fresh boundary."""

    def __init__(self, config: RoutingConfig) -> None:
        """Read and compile the operator's templates now, so a start (and `config validate`)
        refuses what would fail every delivery. Raises ``ConfigError`` naming the file when
        one is missing, unreadable, does not compile or reads an unknown variable."""
        self._event_path = config.prompt_template
        self._spawn_path = config.spawn_prompt_template
        self._read()

    def _read(self) -> tuple[str, str]:
        return (
            _prompt_template(self._event_path, EVENT_PROMPT),
            _prompt_template(self._spawn_path, SPAWN_PROMPT),
        )

    def for_decision(self) -> Templates:
        """Return the templates with a new random UNTRUSTED-block boundary.

        The operator's files are read again each time, so a template fixed after a dead letter
        serves its replay without a restart. Raises ``ConfigError`` as ``__init__`` does."""
        event, spawn = self._read()
        return Templates(
            event_prompt=event,
            spawn_prompt=spawn,
            checklist_comment=bundled_template(CHECKLIST_COMMENT),
            confirmation_comment=bundled_template(CONFIRMATION_COMMENT),
            boundary=secrets.token_hex(16),
            sandboxed_event=self._event_path is not None,
            sandboxed_spawn=self._spawn_path is not None,
        )


def _prompt_template(path: str | None, bundled: str) -> str:
    if not path:
        return bundled_template(bundled)
    source = operator_template(path)
    try:
        check_prompt_template(source, sandboxed=True)
    except TemplateError as exc:
        raise ConfigError(f"the prompt template {path}: {exc}") from exc
    return source


def check_routing(config: RoutingConfig) -> None:
    """Refuse what a start refuses in the routing section, with the same warnings: the one
    check ``config validate`` and the services share."""
    routing_policy(config)
    TemplateSource(config)
