"""Which adapter serves which port for a configuration: the one module that names them.

Everything else (the composition in ``app.compose`` and ``app.cloud``, the CLI) asks here, so
a new backend is added in one place. Adapters are imported inside the functions: a Cloud
Function's cold start loads only the ones its configuration picks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from looprelay.config.model import Config, GitHubConfig
from looprelay.datadir import QUEUE_FILE, STORE_FILE
from looprelay.errors import ConfigError
from looprelay.ports import (
    Clock,
    DispatchFeed,
    DispatchRing,
    GitHub,
    GitHubListings,
    PollCursors,
    Queue,
    RunnerChanges,
    RunnerRegistry,
    Store,
    TaskAuthenticator,
    WorkItemStore,
)

if TYPE_CHECKING:
    from looprelay.adapters.sqlite.queue import SqliteQueue

log = logging.getLogger("looprelay.app.adapters")


def open_store(config: Config, *, data_dir: Path | None) -> Store:
    """Return the store ``config.store.backend`` names.

    SQLite lives in ``store.sqlite.path`` or the data directory. Raises ``ConfigError`` when
    SQLite has neither, ``Transient`` when the store cannot be reached.
    """
    if config.store.backend == "firestore":
        from looprelay.adapters.firestore.store import FirestoreStore

        return FirestoreStore.from_config(
            config.store.firestore, retention_days=config.store.retention_days
        )
    from looprelay.adapters.sqlite.store import SqliteStore

    return SqliteStore(_sqlite_path(config, data_dir))


def _sqlite_path(config: Config, data_dir: Path | None) -> Path:
    if config.store.sqlite.path:
        return Path(config.store.sqlite.path)
    if data_dir is None:
        raise ConfigError("store.sqlite.path is unset and there is no data directory")
    return _existing(data_dir) / STORE_FILE


def _existing(data_dir: Path) -> Path:
    """``data_dir``, refused in one line saying the fix when nothing created it yet (`up`
    creates it before it opens anything; SQLite's own words would be "unable to open")."""
    if not data_dir.is_dir():
        raise ConfigError(
            f"no data directory at {data_dir} yet: start looprelay once with `looprelay up` "
            "(or ./dev up), or pass --data with the directory `up` uses"
        )
    return data_dir


def open_runner_registry(config: Config, *, data_dir: Path | None) -> RunnerRegistry:
    """Return the runner registry next to the configured store.

    Raises ``ConfigError`` when SQLite has no path, ``Transient`` when unreachable.
    """
    if config.store.backend == "firestore":
        from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry

        return FirestoreRunnerRegistry.from_config(config.store.firestore)
    from looprelay.adapters.sqlite.runners import SqliteRunnerRegistry

    return SqliteRunnerRegistry(_sqlite_path(config, data_dir))


def open_poll_cursors(config: Config, *, data_dir: Path | None) -> PollCursors:
    """Return the poll ingress's cursors next to the configured store.

    Raises ``ConfigError`` when SQLite has no path, ``Transient`` when unreachable.
    """
    if config.store.backend == "firestore":
        from looprelay.adapters.firestore.poll_cursors import FirestorePollCursors

        return FirestorePollCursors.from_config(config.store.firestore)
    from looprelay.adapters.sqlite.poll_cursors import SqlitePollCursors

    return SqlitePollCursors(_sqlite_path(config, data_dir))


def open_work_item_store(config: Config, *, data_dir: Path | None) -> WorkItemStore:
    """Return the work-item store next to the configured store.

    Raises ``ConfigError`` when SQLite has no path, ``Transient`` when unreachable.
    """
    if config.store.backend == "firestore":
        from looprelay.adapters.firestore.work_items import FirestoreWorkItemStore

        return FirestoreWorkItemStore.from_config(config.store.firestore)
    from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore

    return SqliteWorkItemStore(_sqlite_path(config, data_dir))


def open_dispatch_feed(config: Config, *, on_change: DispatchRing) -> DispatchFeed | None:
    """Return the store's change feed of open dispatches, calling ``on_change`` after each
    change once started, and not started: its thread and stream must be opened by the process
    that serves (``start()``, see ``app.asgi.build_asgi``). None when the store pushes none
    (SQLite: ``looprelay up``'s router rings its polls itself). Raises ``ConfigError`` without
    credentials."""
    if config.store.backend != "firestore":
        return None
    from looprelay.adapters.firestore.dispatch_feed import FirestoreDispatchFeed

    return FirestoreDispatchFeed.from_config(config.store.firestore, on_change=on_change)


def open_runner_changes(config: Config, *, data_dir: Path | None) -> RunnerChanges:
    """Return the store's feed of changed runners, not started: the process that serves
    starts it (``RunnerRecords.start``), and until then nothing is vouched for from memory.
    Raises ``ConfigError`` without credentials, or without a SQLite path."""
    if config.store.backend == "firestore":
        from looprelay.adapters.firestore.runner_changes import FirestoreRunnerChanges

        return FirestoreRunnerChanges.from_config(config.store.firestore)
    from looprelay.adapters.sqlite.runner_changes import SqliteRunnerChanges

    return SqliteRunnerChanges(_sqlite_path(config, data_dir))


@dataclass(frozen=True)
class OpenStores:
    """The ledger and event store, the work-item store and the runner registry of one
    backend, as one process uses them all (``looprelay up``)."""

    store: Store
    work_items: WorkItemStore
    runners: RunnerRegistry

    def close(self) -> None:
        """Close every connection the three hold."""
        for adapter in (self.store, self.work_items, self.runners):
            close = getattr(adapter, "close", None)
            if callable(close):
                close()


def open_stores(config: Config, *, data_dir: Path | None) -> OpenStores:
    """Open all three; on SQLite they share one connection to the one file.

    Raises ``ConfigError`` when SQLite has no path, ``Transient`` when unreachable.
    """
    if config.store.backend == "firestore":
        return OpenStores(
            open_store(config, data_dir=data_dir),
            open_work_item_store(config, data_dir=data_dir),
            open_runner_registry(config, data_dir=data_dir),
        )
    from looprelay.adapters.sqlite.database import SqliteDatabase
    from looprelay.adapters.sqlite.runners import SqliteRunnerRegistry
    from looprelay.adapters.sqlite.store import SqliteStore
    from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore

    database = SqliteDatabase(_sqlite_path(config, data_dir), schema="", what="SQLite store")
    return OpenStores(
        SqliteStore(database), SqliteWorkItemStore(database), SqliteRunnerRegistry(database)
    )


def open_queue(config: Config, *, data_dir: Path | None) -> Queue:
    """Return the queue ``config.queue.backend`` names, ready to enqueue (not dispatch).

    Raises ``ConfigError`` when the embedded queue has no data directory.
    """
    if config.queue.backend == "cloudtasks":
        from looprelay.adapters.gcp.cloud_tasks import CloudTasksQueue

        return CloudTasksQueue.from_config(config.queue.cloudtasks)
    if data_dir is None:
        raise ConfigError("the embedded queue needs a data directory (--data)")
    return open_local_queue(config, data_dir=data_dir)


def open_local_queue(config: Config, *, data_dir: Path) -> SqliteQueue:
    """Return the embedded queue of ``data_dir``: enqueue, list, retry, or dispatch.

    Raises ``Transient`` when its database cannot be opened.
    """
    from looprelay.adapters.sqlite.queue import SqliteQueue

    return SqliteQueue(
        _existing(data_dir) / QUEUE_FILE,
        retry=config.queue.retry,
        settings=config.queue.embedded,
    )


def system_clock() -> Clock:
    """Return the system's UTC clock."""
    from looprelay.adapters.clock import SystemClock

    return SystemClock()


def github_client(config: Config, environ: Mapping[str, str]) -> GitHub | None:
    """Return the GitHub client, or None when no credentials are configured (comments and
    reactions are then skipped, routing still works). Raises ``ConfigError`` for credentials
    named but missing."""
    if config.github.app_id is None and config.github.token_env is None:
        log.warning("github.appId/github.tokenEnv unset: no comments or reactions on GitHub")
        return None
    from looprelay.adapters.github.rest import GitHubRest

    return GitHubRest.from_config(config.github, environ)


def app_github(config: GitHubConfig, environ: Mapping[str, str]) -> GitHub:
    """The GitHub client a sweep needs, with App auth: only the App itself (its JWT) may list
    and redeliver its webhook deliveries.

    Raises ``ConfigError`` when ``github.appId`` or the App's key (``github.privateKeyEnv``
    or ``github.privateKeyFile``) is unset, and as ``GitHubRest.from_config`` does (naming the
    variable or file) when the key is missing or unusable.
    """
    if config.app_id is None or not (config.private_key_env or config.private_key_file):
        raise ConfigError(
            "the redelivery sweep needs GitHub App auth: set github.appId and "
            "github.privateKeyEnv (the name of an environment variable holding the App's "
            "private key), or run `looprelay app create`; a token cannot list the App's "
            "deliveries"
        )
    from looprelay.adapters.github.rest import GitHubRest

    return GitHubRest.from_config(config, environ)


def poll_github(config: GitHubConfig, environ: Mapping[str, str]) -> GitHubListings:
    """The GitHub client the poll ingress reads with (App or token auth).

    Raises ``ConfigError`` when no credentials are configured, and as
    ``GitHubRest.from_config`` does (naming the variable) when a secret is missing.
    """
    if config.app_id is None and config.token_env is None:
        raise ConfigError(
            "github.poll.repositories needs GitHub credentials to read them: set github.appId "
            "and github.privateKeyEnv (App auth) or github.tokenEnv (token auth)"
        )
    from looprelay.adapters.github.rest import GitHubRest

    return GitHubRest.from_config(config, environ)


def queue_authenticator(config: Config) -> TaskAuthenticator:
    """Return the check that a worker call is the cloud queue's: its OIDC token.

    Raises ``ConfigError`` when ``worker.oidc`` is unset: in the cloud only the queue's
    identity may call the worker.
    """
    if config.worker.oidc is None:
        raise ConfigError(
            "worker.oidc is unset: set serviceAccountEmail and audience so only Cloud Tasks "
            "can call the worker"
        )
    from looprelay.adapters.gcp.oidc import OidcTaskAuthenticator

    return OidcTaskAuthenticator(
        audience=config.worker.oidc.audience,
        service_account_email=config.worker.oidc.service_account_email,
        platform_verifies_signature=config.worker.oidc.platform_verifies_signature,
    )


def local_queue_authenticator(worker_token: str) -> TaskAuthenticator:
    """Return the check that a worker call is the embedded queue's: its bearer secret."""
    from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator

    return SharedSecretAuthenticator(worker_token)
