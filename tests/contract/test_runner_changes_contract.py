"""The RunnerChanges contract: SQLite and Firestore tell the same changes of the same writes.

A revoke, a rotation and a heartbeat with a new status are told, by runner id, once the feed
is live; a heartbeat that only says the runner is alive, and a change refused (a revoked
runner), are not; a closed feed is not live.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from looprelay.adapters.sqlite.runner_changes import SqliteRunnerChanges
from looprelay.adapters.sqlite.runners import SqliteRunnerRegistry
from looprelay.core.model import RunnerRecord
from looprelay.ports import RunnerChanges, RunnerRegistry, RunnerStatus
from tests.conftest import STORE_BACKENDS
from tests.fake_harness import wait_until

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ONE, TWO, MARKER = "r-0000000000000001", "r-0000000000000002", "r-00000000000000ff"


@dataclass
class Told:
    """What a feed told, in order (None: a drop)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    news: list[set[str] | None] = field(default_factory=list)

    def __call__(self, runner_ids: object) -> None:
        with self.lock:
            self.news.append(None if runner_ids is None else set(runner_ids))  # type: ignore[call-overload]

    def ids(self) -> set[str]:
        with self.lock:
            return set().union(*(n for n in self.news if n is not None))


@dataclass
class Fed:
    registry: RunnerRegistry
    changes: RunnerChanges
    told: Told


@pytest.fixture(params=STORE_BACKENDS)
def fed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fed]:
    """A registry and its changes feed, started and live, of each backend."""
    told = Told()
    if request.param == "sqlite":
        registry: RunnerRegistry = SqliteRunnerRegistry(tmp_path / "store.db")
        changes: RunnerChanges = SqliteRunnerChanges(tmp_path / "store.db", look_seconds=0.02)
    else:
        from looprelay.adapters.firestore.runner_changes import FirestoreRunnerChanges
        from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry

        client = request.getfixturevalue("firestore_client")
        prefix = f"t{uuid.uuid4().hex[:12]}_"
        registry = FirestoreRunnerRegistry(client, collection_prefix=prefix)
        changes = FirestoreRunnerChanges(client, collection_prefix=prefix, check_seconds=0.05)
    changes.start(told)
    wait_until(changes.live, what="the feed to be live")
    for runner_id in (ONE, TWO, MARKER):
        registry.add_runner(_runner(runner_id))
    yield Fed(registry, changes, told)
    changes.close()
    if request.param == "sqlite":
        registry.close()  # type: ignore[attr-defined]


def _runner(runner_id: str) -> RunnerRecord:
    return RunnerRecord(runner_id=runner_id, name="laptop", secret_hash="a" * 64, registered_at=T0)


def _then_marker(fed: Fed) -> set[str]:
    """Everything told up to a change of ``MARKER`` written last: what was told before it."""
    assert fed.registry.rotate_runner_secret(MARKER, secret_hash="m" * 64)
    wait_until(lambda: MARKER in fed.told.ids(), what="the marker's change")
    return fed.told.ids() - {MARKER}


def test_a_revocation_is_told(fed: Fed) -> None:
    assert fed.registry.revoke_runner(ONE, at=T0)
    assert _then_marker(fed) == {ONE}


def test_a_rotation_is_told(fed: Fed) -> None:
    assert fed.registry.rotate_runner_secret(TWO, secret_hash="b" * 64)
    assert _then_marker(fed) == {TWO}


def test_a_heartbeat_with_a_new_status_is_told(fed: Fed) -> None:
    status = RunnerStatus(version="0.2.0", repositories=("octo/app",), sessions=1)
    assert fed.registry.record_heartbeat(ONE, at=T0, status=status)
    assert _then_marker(fed) == {ONE}


def test_being_alive_and_a_refused_change_are_not_told(fed: Fed) -> None:
    assert fed.registry.revoke_runner(TWO, at=T0)
    wait_until(lambda: TWO in fed.told.ids(), what="the revocation")
    with fed.told.lock:
        fed.told.news.clear()
    fed.registry.record_alive(ONE, at=T0)
    assert not fed.registry.rotate_runner_secret(TWO, secret_hash="c" * 64)  # revoked
    assert not fed.registry.revoke_runner(TWO, at=T0)
    assert _then_marker(fed) == set()


def test_a_closed_feed_is_not_live(fed: Fed) -> None:
    assert fed.changes.live()
    fed.changes.close()
    wait_until(lambda: not fed.changes.live(), what="the feed to stop")
