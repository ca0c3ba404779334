"""Shared fixtures: every Store and Queue adapter behind one parametrized fixture."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from looprelay.adapters.firestore.poll_cursors import FirestorePollCursors
from looprelay.adapters.sqlite.poll_cursors import SqlitePollCursors
from looprelay.adapters.sqlite.runners import SqliteRunnerRegistry
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore
from looprelay.ports import PollCursors, RunnerRegistry, Store, WorkItemStore
from tests.queue_harness import QueueHarness
from tests.rigs import Stores

pytest_plugins = [
    "tests.firestore_emulator",
    "tests.firestore_queries",
    "tests.claude_cli",
    "tests.cloudtasks_recorder",
    "tests.embedded_queue_harness",
    "tests.fake_github",
    "tests.fake_harness",
    "tests.cloud_rig",
    "tests.deployed_functions",
]

FUZZ_FACTOR = 20
"""How many times more examples ``--fuzz`` runs than CI (tests/fuzz)."""
_CI_EXAMPLES = 25
settings.register_profile(
    "ci",
    max_examples=_CI_EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples every run: CI never flakes on a new draw
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",
    max_examples=_CI_EXAMPLES * FUZZ_FACTOR,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # random draws; failures are kept in .hypothesis/ and replayed first


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz",
        action="store_true",
        help=f"run the property-based tests (tests/fuzz) with {FUZZ_FACTOR}x the examples",
    )


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("fuzz" if config.getoption("--fuzz") else "ci")


STORE_BACKENDS = ["sqlite", pytest.param("firestore", marks=pytest.mark.firestore)]


def _backend(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    make_sqlite: Callable[[Path], Any],
    firestore_fixture: str,
) -> Iterator[Any]:
    if request.param == "sqlite":
        sqlite = make_sqlite(tmp_path / "store.db")
        yield sqlite
        sqlite.close()
    else:
        yield request.getfixturevalue(firestore_fixture)


@pytest.fixture(params=STORE_BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh, empty store of each backend."""
    yield from _backend(request, tmp_path, SqliteStore, "firestore_store")


@pytest.fixture(params=STORE_BACKENDS)
def runner_registry(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunnerRegistry]:
    """A fresh, empty runner registry of each backend."""
    yield from _backend(request, tmp_path, SqliteRunnerRegistry, "firestore_runner_registry")


@pytest.fixture(params=STORE_BACKENDS)
def work_item_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorkItemStore]:
    """A fresh, empty work-item store of each backend."""
    yield from _backend(request, tmp_path, SqliteWorkItemStore, "firestore_work_item_store")


@pytest.fixture(params=STORE_BACKENDS)
def poll_cursors(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PollCursors]:
    """Fresh, empty poll cursors of each backend."""
    if request.param == "sqlite":
        yield from _backend(request, tmp_path, SqlitePollCursors, "")
    else:
        client = request.getfixturevalue("firestore_client")
        yield FirestorePollCursors(client, collection_prefix=f"t{uuid.uuid4().hex[:12]}_")


@pytest.fixture(params=STORE_BACKENDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    """The three stores the runner API uses, all of one backend, sharing one SQLite file."""
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        opened = (SqliteRunnerRegistry(path), SqliteWorkItemStore(path), SqliteStore(path))
        yield Stores(*opened)
        for adapter in opened:
            adapter.close()
    else:
        yield Stores(
            request.getfixturevalue("firestore_runner_registry"),
            request.getfixturevalue("firestore_work_item_store"),
            request.getfixturevalue("firestore_store"),
        )


QUEUE_BACKENDS = ["embedded", "cloudtasks"]


@pytest.fixture(params=QUEUE_BACKENDS)
def queue_harness(request: pytest.FixtureRequest) -> QueueHarness:
    """A fresh queue of each backend, with a view of what its backend holds."""
    harness: QueueHarness = request.getfixturevalue(f"{request.param}_queue_harness")
    return harness


@pytest.fixture(autouse=True)
def private_claude_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Claude's config directory for this test, never the machine's: the runner agent (in
    process or as a child) pre-accepts folder trust and looks for transcripts there."""
    directory = tmp_path_factory.mktemp("claude-config")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CLAUDE_CONFIG_DIR", str(directory))
        yield directory
