"""Open the configured store: one place that knows every Store adapter."""

from __future__ import annotations

from pathlib import Path

from looprelay.config import Config
from looprelay.datadir import STORE_FILE
from looprelay.ports import Store


def open_store(config: Config, *, data_dir: Path | None) -> Store:
    """Return the store ``config.store.backend`` names.

    SQLite lives in ``store.sqlite.path`` or the data directory. Raises ``ConfigError`` when
    SQLite has neither, ``Transient`` when the store cannot be reached.
    """
    if config.store.backend == "firestore":
        from looprelay.adapters.firestore_store import FirestoreStore

        return FirestoreStore.from_config(
            config.store.firestore, retention_days=config.store.retention_days
        )
    from looprelay.adapters.sqlite_store import SqliteStore

    if config.store.sqlite.path:
        return SqliteStore(config.store.sqlite.path)
    if data_dir is None:
        from looprelay.errors import ConfigError

        raise ConfigError("store.sqlite.path is unset and there is no data directory")
    return SqliteStore(data_dir / STORE_FILE)
