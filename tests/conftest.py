"""Shared fixtures: every Store and Queue adapter behind one parametrized fixture."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from looprelay.adapters.sqlite_runners import SqliteRunnerRegistry
from looprelay.adapters.sqlite_store import SqliteStore
from looprelay.adapters.sqlite_work_items import SqliteWorkItemStore
from looprelay.ports import RunnerRegistry, Store, WorkItemStore
from tests.queue_harness import QueueHarness

pytest_plugins = [
    "tests.firestore_emulator",
    "tests.cloudtasks_recorder",
    "tests.embedded_queue_harness",
    "tests.fake_github",
    "tests.fake_harness",
]

STORE_BACKENDS = ["sqlite", pytest.param("firestore", marks=pytest.mark.firestore)]


@pytest.fixture(params=STORE_BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh, empty store of each backend."""
    if request.param == "sqlite":
        sqlite = SqliteStore(tmp_path / "store.db")
        yield sqlite
        sqlite.close()
    else:
        yield request.getfixturevalue("firestore_store")


@pytest.fixture(params=STORE_BACKENDS)
def runner_registry(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunnerRegistry]:
    """A fresh, empty runner registry of each backend."""
    if request.param == "sqlite":
        sqlite = SqliteRunnerRegistry(tmp_path / "store.db")
        yield sqlite
        sqlite.close()
    else:
        yield request.getfixturevalue("firestore_runner_registry")


@pytest.fixture(params=STORE_BACKENDS)
def work_item_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorkItemStore]:
    """A fresh, empty work-item store of each backend."""
    if request.param == "sqlite":
        sqlite = SqliteWorkItemStore(tmp_path / "store.db")
        yield sqlite
        sqlite.close()
    else:
        yield request.getfixturevalue("firestore_work_item_store")


QUEUE_BACKENDS = ["embedded", "cloudtasks"]


@pytest.fixture(params=QUEUE_BACKENDS)
def queue_harness(request: pytest.FixtureRequest) -> QueueHarness:
    """A fresh queue of each backend, with a view of what its backend holds."""
    harness: QueueHarness = request.getfixturevalue(f"{request.param}_queue_harness")
    return harness
