"""Open the configured store and runner registry: the one place that knows their adapters."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from looprelay.config.model import Config
from looprelay.datadir import STORE_FILE
from looprelay.errors import ConfigError
from looprelay.ports import RunnerRegistry, Store, WorkItemStore


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
    return data_dir / STORE_FILE


def open_runner_registry(config: Config, *, data_dir: Path | None) -> RunnerRegistry:
    """Return the runner registry next to the configured store.

    Raises ``ConfigError`` when SQLite has no path, ``Transient`` when unreachable.
    """
    if config.store.backend == "firestore":
        from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry

        return FirestoreRunnerRegistry.from_config(config.store.firestore)
    from looprelay.adapters.sqlite.runners import SqliteRunnerRegistry

    return SqliteRunnerRegistry(_sqlite_path(config, data_dir))


def open_work_item_store(config: Config, *, data_dir: Path | None) -> WorkItemStore:
    """Return the work-item store next to the configured store.

    Raises ``ConfigError`` when SQLite has no path, ``Transient`` when unreachable.
    """
    if config.store.backend == "firestore":
        from looprelay.adapters.firestore.work_items import FirestoreWorkItemStore

        return FirestoreWorkItemStore.from_config(config.store.firestore)
    from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore

    return SqliteWorkItemStore(_sqlite_path(config, data_dir))


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
