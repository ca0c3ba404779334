"""Fixture plugin: the embedded queue, not dispatching, for the queue contract suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from looprelay.adapters.sqlite.queue import SqliteQueue
from looprelay.config.model import EmbeddedQueueConfig, RetryConfig


class EmbeddedQueueHarness:
    """An embedded queue whose dispatcher is not started, so what it holds stays put."""

    def __init__(self, path: Path) -> None:
        self.queue = SqliteQueue(path, retry=RetryConfig(), settings=EmbeddedQueueConfig())

    def held(self) -> dict[str, bytes]:
        return {task.name: task.body for task in self.queue.list_tasks()}

    def due(self, name: str) -> float | None:
        [task] = [task for task in self.queue.list_tasks() if task.name == name]
        return None if task.eta <= task.created_at else task.eta


@pytest.fixture
def embedded_queue_harness(tmp_path: Path) -> Iterator[EmbeddedQueueHarness]:
    harness = EmbeddedQueueHarness(tmp_path / "queue.db")
    yield harness
    harness.queue.close()
