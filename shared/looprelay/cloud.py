"""Build the Cloud Functions' handlers from the environment.

Each builder imports only what its function needs, and this module imports none of it: the
webhook must stay light on cold start (no Firestore client, no Jinja2, no tmux);
``tests/infra/test_coldstart.py`` keeps it so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from looprelay.config import Config, load_config
from looprelay.errors import ConfigError

if TYPE_CHECKING:
    from looprelay.ingress import Ingress
    from looprelay.runnerapi import RunnerApi
    from looprelay.sweeper import Sweeper
    from looprelay.worker import Worker

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
    from looprelay.ingress import Ingress
    from looprelay.queues import open_queue
    from looprelay.secrets_env import webhook_secrets_from_env

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
    if config.worker.oidc is None:
        raise ConfigError(
            "worker.oidc is unset: set serviceAccountEmail and audience so only Cloud Tasks "
            "can call the worker"
        )
    from looprelay.adapters.clock import SystemClock
    from looprelay.adapters.oidc_auth import OidcTaskAuthenticator
    from looprelay.stores import open_store
    from looprelay.wiring import build_router, github_client
    from looprelay.worker import Worker, handler_budget

    store = open_store(config, data_dir=None)
    clock = SystemClock()
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
        authenticator=OidcTaskAuthenticator(
            audience=config.worker.oidc.audience,
            service_account_email=config.worker.oidc.service_account_email,
            platform_verifies_signature=config.worker.oidc.platform_verifies_signature,
        ),
        clock=clock,
        handler=router,
        handler_budget_seconds=handler_budget(config.queue.cloudtasks.dispatch_deadline_seconds),
    )


def build_runner_api(config: Config, environ: Mapping[str, str]) -> RunnerApi:
    """The runner API's handler, on the configured store; long polls look again every
    second, as no in-process signal reaches them from the worker function."""
    from looprelay.adapters.clock import SystemClock
    from looprelay.stores import open_store
    from looprelay.wiring import build_runner_api as wire
    from looprelay.wiring import github_client

    return wire(
        config,
        store=open_store(config, data_dir=None),
        clock=SystemClock(),
        data_dir=None,
        github=github_client(config, environ),
        waker=None,
    )


def build_sweeper(config: Config, environ: Mapping[str, str]) -> Sweeper:
    """The sweeper: redelivers the App's failed deliveries the ledger lacks.

    Raises ``ConfigError`` when GitHub App auth is not configured (``sweeper.app_github``):
    a cloud deployment refuses to start rather than fail every scheduled run.
    """
    from looprelay.adapters.clock import SystemClock
    from looprelay.stores import open_store
    from looprelay.sweeper import Sweeper, app_github

    return Sweeper(
        github=app_github(config.github, environ),
        store=open_store(config, data_dir=None),
        clock=SystemClock(),
        settings=config.sweeper,
    )
