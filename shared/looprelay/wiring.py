"""Assemble the worker's router and the runner API from a config: the one place both
``looprelay up`` and the Cloud Functions build them, so the two never differ."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

from looprelay.config import Config
from looprelay.leases import DispatchWaker, LeaseDesk
from looprelay.ports import Clock, GitHub, RunnerRegistry, Store, WorkItemStore
from looprelay.progress import Progress
from looprelay.router import Router
from looprelay.routingpolicy import TemplateSource, routing_policy
from looprelay.runnerapi import RunnerApi
from looprelay.stores import open_runner_registry, open_work_item_store

log = logging.getLogger("looprelay.wiring")


def github_client(config: Config, environ: Mapping[str, str]) -> GitHub | None:
    """Return the GitHub client, or None when no credentials are configured (comments and
    reactions are then skipped, routing still works). Raises ``ConfigError`` for credentials
    named but missing."""
    if config.github.app_id is None and config.github.token_env is None:
        log.warning("github.appId/github.tokenEnv unset: no comments or reactions on GitHub")
        return None
    from looprelay.adapters.github_rest import GitHubRest

    return GitHubRest.from_config(config.github, environ)


def build_router(
    config: Config,
    *,
    store: Store,
    clock: Clock,
    data_dir: Path | None,
    github: GitHub | None,
    waker: DispatchWaker | None,
    work_items: WorkItemStore | None = None,
    runners: RunnerRegistry | None = None,
) -> Router:
    """The worker's delivery handler; the work-item store and runner registry are opened
    unless given. Raises ``ConfigError`` for an unusable routing section."""
    return Router(
        store=store,
        work_items=work_items or open_work_item_store(config, data_dir=data_dir),
        runners=runners or open_runner_registry(config, data_dir=data_dir),
        github=github,
        policy=routing_policy(config.routing),
        templates=TemplateSource(config.routing),
        clock=clock,
        on_dispatch=waker.notify if waker else lambda: None,
        order_wait=timedelta(seconds=config.routing.order_wait_seconds),
    )


def build_runner_api(
    config: Config,
    *,
    store: Store,
    clock: Clock,
    data_dir: Path | None,
    github: GitHub | None,
    waker: DispatchWaker | None,
    work_items: WorkItemStore | None = None,
    runners: RunnerRegistry | None = None,
) -> RunnerApi:
    """The runner API with its lease desk; stores are opened unless given."""
    registry = runners or open_runner_registry(config, data_dir=data_dir)
    work_items = work_items or open_work_item_store(config, data_dir=data_dir)
    progress = Progress(
        work_items=work_items,
        store=store,
        github=github,
        clock=clock,
        bot_logins=config.routing.bot_logins,
        headless_replies=config.routing.headless_replies,
    )
    desk = LeaseDesk(
        registry=registry,
        work_items=work_items,
        store=store,
        clock=clock,
        config=config.runners,
        progress=progress,
        waker=waker,
    )
    return RunnerApi(registry=registry, store=store, clock=clock, config=config.runners, desk=desk)
