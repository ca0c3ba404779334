"""Assemble the worker's router and the runner API from a config: the one place both
``looprelay up`` and the Cloud Functions build them, so the two never differ."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from looprelay.app.adapters import open_runner_registry, open_work_item_store
from looprelay.config.model import Config
from looprelay.config.routing import TemplateSource, routing_policy
from looprelay.ports import (
    Clock,
    DispatchFeed,
    GitHub,
    PollCursors,
    Queue,
    RunnerRegistry,
    Store,
    WorkItemStore,
)
from looprelay.service.lease_desk import LeaseDesk
from looprelay.service.results import Progress
from looprelay.service.route import Router
from looprelay.service.runner_cache import RunnerRecords
from looprelay.service.runners import RunnerApi
from looprelay.service.session_comments import SessionComments
from looprelay.service.waker import DispatchWaker

if TYPE_CHECKING:
    from looprelay.service.poller import Poller

log = logging.getLogger("looprelay.app.services")


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
        on_dispatch=waker.notify if waker else lambda _dispatches: None,
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
    feed: DispatchFeed | None = None,
    records: RunnerRecords | None = None,
) -> RunnerApi:
    """The runner API with its lease desk; stores are opened unless given. ``feed`` (which
    rings ``waker``) lets waiting polls learn of new work without reading the store;
    ``records`` (the runners read lately, told of changes) lets authentication and the
    choice among runners read no runner they hold."""
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
        feed=feed,
        expire_unserved=feed is None,
        records=records,
    )
    return RunnerApi(
        registry=registry,
        store=store,
        clock=clock,
        config=config.runners,
        desk=desk,
        records=records,
        sessions=SessionComments(
            work_items=work_items,
            store=store,
            github=github,
            clock=clock,
            bot_logins=config.routing.bot_logins,
        ),
    )


def build_poller(
    config: Config,
    environ: Mapping[str, str],
    *,
    store: Store,
    queue: Queue,
    cursors: PollCursors,
    clock: Clock,
) -> Poller:
    """The poll ingress over ``config.github.poll``, queueing into ``queue`` as the webhook
    does. Raises ``ConfigError`` without GitHub credentials (``adapters.poll_github``)."""
    from looprelay.app.adapters import poll_github
    from looprelay.service.poller import Poller

    return Poller(
        github=poll_github(config.github, environ),
        cursors=cursors,
        ledger=store,
        queue=queue,
        clock=clock,
        config=config.github.poll,
        webhook=config.webhook,
    )
