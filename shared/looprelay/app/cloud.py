"""Build the Cloud Functions' handlers from the environment.

Each builder imports only what its function needs, and this module imports none of it: the
webhook must stay light on cold start (no Firestore client, no Jinja2, no tmux);
``tests/infra/test_coldstart.py`` keeps it so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from looprelay.config.model import Config, load_config
from looprelay.config.order import order_rules
from looprelay.errors import ConfigError

if TYPE_CHECKING:
    from looprelay.ports import DispatchFeed
    from looprelay.service.ingress import Ingress
    from looprelay.service.poller import Poller
    from looprelay.service.runner_cache import RunnerRecords
    from looprelay.service.runners import RunnerApi
    from looprelay.service.status import StatusReader
    from looprelay.service.sweeper import Sweeper
    from looprelay.service.worker import Worker

CONFIG_ENV = "LOOPRELAY_CONFIG"


def cloud_config(environ: Mapping[str, str]) -> Config:
    """Load the config named by ``LOOPRELAY_CONFIG`` (if any) plus env overrides."""
    return load_config(environ.get(CONFIG_ENV) or None, environ=environ)


def build_ingress(config: Config, environ: Mapping[str, str]) -> Ingress:
    """The webhook's handler: verified, with the configured queue.

    Raises ``ConfigError`` when no webhook secret is configured: a cloud deployment refuses
    to start rather than accept unsigned deliveries.
    """
    if not config.github.webhook_secrets:
        raise ConfigError(
            "github.webhookSecrets is empty: a cloud deployment needs at least one secret "
            "(the name of an environment variable wired from Secret Manager)"
        )
    from looprelay.app.adapters import open_queue
    from looprelay.config.secrets import webhook_secrets_from_env
    from looprelay.service.ingress import Ingress

    return Ingress(
        secrets=webhook_secrets_from_env(config.github, environ),
        queue=open_queue(config, data_dir=None),
        config=config.webhook,
    )


def build_worker(config: Config, environ: Mapping[str, str]) -> Worker:
    """The worker's handler: OIDC-authenticated, routing on the configured store.

    Raises ``ConfigError`` when ``worker.oidc`` is unset: in the cloud only the queue's
    identity may call the worker.
    """
    from datetime import timedelta

    from looprelay.app.adapters import (
        github_client,
        open_queue,
        open_store,
        queue_authenticator,
        system_clock,
    )
    from looprelay.app.services import build_router
    from looprelay.service.worker import Worker, handler_budget

    authenticator = queue_authenticator(config)
    store = open_store(config, data_dir=None)
    clock = system_clock()
    router = build_router(
        config,
        store=store,
        clock=clock,
        data_dir=None,
        github=github_client(config, environ),
        waker=None,
    )
    return Worker(
        store=store,
        authenticator=authenticator,
        clock=clock,
        handler=router,
        allowed_events=config.webhook.allowed_events(),
        order_wait=timedelta(seconds=config.routing.order_wait_seconds),
        order_rules=order_rules(config.routing),
        handler_budget_seconds=handler_budget(config.queue.cloudtasks.dispatch_deadline_seconds),
        wakes=open_queue(config, data_dir=None) if config.queue.backend == "cloudtasks" else None,
    )


@dataclass(frozen=True)
class CloudRunnerApi:
    """The runner API's handler and the listeners it reads, which are not started:
    :meth:`start` them in the process that serves (``app.asgi.build_asgi``'s ``start``)."""

    api: RunnerApi
    listeners: tuple[DispatchFeed | RunnerRecords, ...]

    def start(self) -> None:
        """Open each listener in this process (once a process)."""
        for listener in self.listeners:
            listener.start()


def build_runner_api(config: Config, environ: Mapping[str, str]) -> CloudRunnerApi:
    """The runner API's handler, on the configured store. No signal crosses from the worker
    function, so one change feed per instance (a Firestore listener) wakes the waiting polls
    when open dispatches change; without one, polls look again every second. A second
    listener, on the runners that changed lately, keeps a bounded cache of runners honest, so
    authenticating a runner read lately reads nothing.

    Neither listens yet, and no client has connected: building happens where
    functions-framework imports the functions, before gunicorn forks the process that serves.
    Until the listeners are started there, polls look at the store and every runner is
    authenticated by a read (the cache vouches for nobody).
    """
    from looprelay.app.adapters import (
        github_client,
        open_dispatch_feed,
        open_runner_changes,
        open_store,
        system_clock,
    )
    from looprelay.app.services import build_runner_api as wire
    from looprelay.service.runner_cache import RunnerRecords
    from looprelay.service.waker import DispatchWaker

    waker = DispatchWaker()
    feed = open_dispatch_feed(config, on_change=waker.notify)
    # A change to a runner wakes its waiting polls, which read it again (revoked: 401).
    records = RunnerRecords(
        open_runner_changes(config, data_dir=None),
        size=config.runners.cached_runners,
        told=lambda ids: waker.notify((), runners=ids),
    )
    api = wire(
        config,
        store=open_store(config, data_dir=None),
        clock=system_clock(),
        data_dir=None,
        github=github_client(config, environ),
        waker=waker if feed is not None else None,
        feed=feed,
        records=records,
    )
    return CloudRunnerApi(api, (records,) if feed is None else (feed, records))


def build_sweeper(config: Config, environ: Mapping[str, str]) -> Sweeper:
    """The sweeper: redelivers the App's failed deliveries the ledger lacks, and expires
    dispatches no live runner serves (the runner API's polls read nothing while idle).

    Raises ``ConfigError`` when GitHub App auth is not configured (``adapters.app_github``):
    a cloud deployment refuses to start rather than fail every scheduled run.
    """
    from looprelay.app.adapters import (
        app_github,
        open_runner_registry,
        open_store,
        open_work_item_store,
        system_clock,
    )
    from looprelay.service.expiry import DispatchExpiry
    from looprelay.service.sweeper import Sweeper

    store, clock = open_store(config, data_dir=None), system_clock()
    expiry = DispatchExpiry(
        work_items=open_work_item_store(config, data_dir=None),
        registry=open_runner_registry(config, data_dir=None),
        store=store,
        clock=clock,
        config=config.runners,
    )
    return Sweeper(
        github=app_github(config.github, environ),
        store=store,
        clock=clock,
        settings=config.sweeper,
        expiry=expiry,
    )


def build_poller(config: Config, environ: Mapping[str, str]) -> Poller:
    """The poll ingress, one round per scheduled call: it queues into the configured queue,
    as the webhook does, and keeps its cursors next to the store.

    With ``github.poll.repositories`` empty a round polls nothing (infra pauses its
    schedule then). Raises ``ConfigError`` when no GitHub credentials are configured.
    """
    from looprelay.app.adapters import open_poll_cursors, open_queue, open_store, system_clock
    from looprelay.app.services import build_poller as wire

    return wire(
        config,
        environ,
        store=open_store(config, data_dir=None),
        queue=open_queue(config, data_dir=None),
        cursors=open_poll_cursors(config, data_dir=None),
        clock=system_clock(),
    )


def build_status_reader(config: Config) -> StatusReader:
    """The status page's reader, on the configured stores (the ``status`` function's, behind
    IAM). It only reads: the function's identity may read Firestore and nothing else."""
    from datetime import timedelta

    from looprelay.adapters.clock import SystemClock
    from looprelay.app.adapters import (
        open_poll_cursors,
        open_runner_registry,
        open_store,
        open_work_item_store,
    )
    from looprelay.service.status import StatusReader

    polled = config.github.poll.repositories
    return StatusReader(
        store=open_store(config, data_dir=None),
        work_items=open_work_item_store(config, data_dir=None),
        runners=open_runner_registry(config, data_dir=None),
        clock=SystemClock(),
        lost_after=timedelta(seconds=config.runners.lost_after_seconds),
        poll_cursors=open_poll_cursors(config, data_dir=None) if polled else None,
    )
