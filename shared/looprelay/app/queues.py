"""Open the configured queue for enqueueing: one place that knows every Queue adapter."""

from __future__ import annotations

from pathlib import Path

from looprelay.config.model import Config
from looprelay.datadir import QUEUE_FILE
from looprelay.errors import ConfigError
from looprelay.ports import Queue


def open_queue(config: Config, *, data_dir: Path | None) -> Queue:
    """Return the queue ``config.queue.backend`` names, ready to enqueue (not dispatch).

    Raises ``ConfigError`` when the embedded queue has no data directory.
    """
    if config.queue.backend == "cloudtasks":
        from looprelay.adapters.gcp.cloud_tasks import CloudTasksQueue

        return CloudTasksQueue.from_config(config.queue.cloudtasks)
    if data_dir is None:
        raise ConfigError("the embedded queue needs a data directory (--data)")
    from looprelay.adapters.sqlite.queue import SqliteQueue

    return SqliteQueue(
        data_dir / QUEUE_FILE, retry=config.queue.retry, settings=config.queue.embedded
    )
