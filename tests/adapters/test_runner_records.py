"""The cloud runner API's cache of runners on the Firestore emulator: once a runner was read,
its idle polls and heartbeats read nothing; revocation and rotation by another client take
effect as soon as the runner changes feed pushes them; whatever the cache cannot vouch for (an
unknown id, a secret it does not hold, no live feed) is decided on a read of the registry; and
the cache holds at most its size, not the fleet.

Served by ``tests/cloud_rig.py``.
"""

from __future__ import annotations

import os
import select
import signal
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
import requests
from google.api_core import exceptions as gexc
from google.cloud import firestore

from bench.storecount import OpCounts
from looprelay.adapters.firestore.runner_changes import (
    BUCKET_SECONDS,
    MARGIN_SECONDS,
    RENEW_SECONDS,
    SHARDS,
    FirestoreRunnerChanges,
)
from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry
from looprelay.core.model import RunnerRecord
from looprelay.service.runner_cache import RunnerRecords
from looprelay.service.runner_secrets import hash_credential, new_runner_id, new_runner_secret
from tests.cloud_rig import WOKEN_WITHIN, Cloud
from tests.fake_harness import wait_until
from tests.test_leases import HTTP_TIMEOUT, Runner

pytestmark = pytest.mark.firestore

ALIVE = {
    "call.RunnerRegistry.record_alive": 1,
    "port.write": 1,
    "doc.commits": 1,
    "doc.writes": 1,
}
"""What a heartbeat that reports nothing new costs: one blind write of the liveness document."""
LOOKUP = {"call.RunnerRegistry.get_runner": 1, "port.read": 1, "doc.reads": 2}
"""What authenticating a runner costs when the cache cannot vouch for it: its runner and
liveness documents, in one batch get."""


def make_runner(runner_id: str) -> RunnerRecord:
    return RunnerRecord(
        runner_id=runner_id,
        name=runner_id,
        secret_hash=hash_credential(new_runner_secret()),
        registered_at=datetime.now(UTC),
    )


def _spent(cloud: Cloud, action: Callable[[], object]) -> dict[str, int]:
    """What ``action`` cost: store calls and documents (the listeners' reads apart)."""
    before = cloud.counts.snapshot()
    action()
    return OpCounts.minus(cloud.counts.snapshot(), before)


def test_once_read_polls_and_heartbeats_read_nothing(cloud: Cloud) -> None:
    runner = cloud.runner("a")
    listened = cloud.records.changes.reads
    assert _spent(cloud, lambda: _status(cloud.desk.poll(runner), 204)) == {}
    cloud.desk.clock.advance(30)
    assert _spent(cloud, lambda: cloud.desk.heartbeat(runner)) == ALIVE
    assert cloud.records.changes.reads == listened  # the heartbeat announced nothing
    seen = cloud.elsewhere.registry.get_runner(runner.runner_id)
    assert seen is not None and seen.last_seen_at == cloud.desk.clock.now()
    listed = cloud.elsewhere.registry.list_runners()
    assert [r.last_seen_at for r in listed] == [cloud.desk.clock.now()]


def test_a_heartbeat_with_a_new_status_is_read_again_once(cloud: Cloud) -> None:
    runner = cloud.runner("a")
    listened = cloud.records.changes.reads
    spent = _spent(cloud, lambda: cloud.desk.heartbeat(runner, sessions=1))
    assert spent["doc.reads"] == 1  # the conditional update's read; authentication none
    wait_until(lambda: cloud.records.find(runner.runner_id) is None, what="the push of the change")
    assert cloud.records.changes.reads == listened + 1  # one small change document
    assert _spent(cloud, lambda: _status(cloud.desk.poll(runner, 0), 204)) == LOOKUP
    held = cloud.records.find(runner.runner_id)
    assert held is not None and held.sessions == 1
    assert _spent(cloud, lambda: _status(cloud.desk.poll(runner, 0), 204)) == {}


def test_a_runner_revoked_elsewhere_is_refused_once_the_push_arrives(cloud: Cloud) -> None:
    runner = cloud.runner("a")
    assert cloud.elsewhere.registry.revoke_runner(runner.runner_id, at=cloud.desk.clock.now())
    wait_until(
        lambda: cloud.desk.poll(runner).status_code == 401,
        seconds=WOKEN_WITHIN,
        what="the revocation to reach the cache",
    )
    response = cloud.desk.post("heartbeat", {}, auth=runner.auth)
    assert response.status_code == 401 and "revoked" in response.text


def test_a_poll_waiting_when_its_runner_is_revoked_elsewhere_ends_refused(cloud: Cloud) -> None:
    """Polls are held for minutes: one already authenticated must not lease work after its
    runner was revoked. The change wakes it; it reads the runner again and is refused."""
    runner = cloud.runner("a")
    with ThreadPoolExecutor(1) as pool:
        answer = cloud.poll_in_background(pool, runner)
        wait_until(lambda: cloud.desk.waker.waiting() == 1, what="the poll to wait")
        assert cloud.elsewhere.registry.revoke_runner(runner.runner_id, at=cloud.desk.clock.now())
        response = answer.result(timeout=WOKEN_WITHIN + HTTP_TIMEOUT)
    assert response.status_code == 401, response.text
    assert "revoked" in response.text


def test_a_rotated_secret_works_at_once_and_the_old_one_stops(cloud: Cloud) -> None:
    old = cloud.runner("a")
    new = Runner(old.runner_id, new_runner_secret(), old.name)
    assert cloud.elsewhere.registry.rotate_runner_secret(
        old.runner_id, secret_hash=hash_credential(new.secret)
    )
    # Before the push arrives the cache holds the old hash: the new secret is then checked on
    # a read, never refused.
    _status(cloud.desk.poll(new), 204)
    wait_until(
        lambda: cloud.desk.poll(old).status_code == 401,
        seconds=WOKEN_WITHIN,
        what="the rotation to reach the cache",
    )
    assert _spent(cloud, lambda: _status(cloud.desk.poll(new), 204)) == {}


def test_an_unknown_runner_is_refused_after_reading_the_registry(cloud: Cloud) -> None:
    cloud.runner("a")
    stranger = Runner(new_runner_id(), new_runner_secret(), "stranger")
    assert _spent(cloud, lambda: _status(cloud.desk.poll(stranger), 401)) == LOOKUP


def test_a_wrong_secret_is_refused_after_reading_the_registry(cloud: Cloud) -> None:
    runner = cloud.runner("a")
    guess = Runner(runner.runner_id, new_runner_secret(), runner.name)
    assert _spent(cloud, lambda: _status(cloud.desk.poll(guess), 401)) == LOOKUP


def test_until_the_feed_listens_every_request_reads_its_runner(records_down: Cloud) -> None:
    runner = records_down.runner("a")
    assert not records_down.records.listening()
    for _ in range(2):
        assert _spent(records_down, lambda: _status(records_down.desk.poll(runner), 204)) == LOOKUP
    stranger = Runner(new_runner_id(), new_runner_secret(), "stranger")
    assert _spent(records_down, lambda: _status(records_down.desk.poll(stranger), 401)) == LOOKUP


def test_a_dropped_listener_is_opened_again_and_what_was_held_is_read_again(
    cloud: Cloud,
) -> None:
    """A change may have been missed while no listener was open: nothing read before the
    drop is trusted, and the runner is read once again."""
    runner = cloud.runner("a")
    changes = cloud.records.changes
    changes._listened._watch.close()  # as the client library does on a fatal error
    wait_until(
        lambda: changes.listeners_opened == 2 and changes.live(),
        what="a second listener's first push",
    )
    assert cloud.records.find(runner.runner_id) is None
    assert _spent(cloud, lambda: _status(cloud.desk.poll(runner, 0), 204)) == LOOKUP
    assert _spent(cloud, lambda: _status(cloud.desk.poll(runner, 0), 204)) == {}


def test_the_listener_holds_a_few_bucket_documents_however_many_runners_change(
    firestore_client: firestore.Client,
) -> None:
    """200 runners changed: the result is a few bucket documents, not one per runner (nor
    per change), and each change is told by runner."""
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    registry = FirestoreRunnerRegistry(firestore_client, collection_prefix=prefix)
    told: list[set[str]] = []
    changes = FirestoreRunnerChanges(firestore_client, collection_prefix=prefix, check_seconds=0.05)
    changes.start(lambda ids: told.append(set(ids or ())))
    try:
        wait_until(changes.live, what="the first push")
        runners = [make_runner(f"r-{n:016x}") for n in range(200)]
        for runner in runners:
            registry.add_runner(runner)
            assert registry.rotate_runner_secret(runner.runner_id, secret_hash="b" * 64)
        wanted = {r.runner_id for r in runners}
        wait_until(lambda: wanted <= set().union(*told), what="every change told")
        result = changes._listened.current()
        buckets = (MARGIN_SECONDS + RENEW_SECONDS) / BUCKET_SECONDS + 2
        assert result is not None and len(result.documents) <= SHARDS * buckets
    finally:
        changes.close()


def test_a_renewed_listener_stays_live_and_still_hears_changes(
    firestore_client: firestore.Client,
) -> None:
    """The listener is replaced on a moved window: the feed stays live throughout (the cache
    keeps what it holds), and a revocation written after the renewals is told."""
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    registry = FirestoreRunnerRegistry(firestore_client, collection_prefix=prefix)
    told: list[set[str] | None] = []
    changes = FirestoreRunnerChanges(
        firestore_client, collection_prefix=prefix, check_seconds=0.05, renew_seconds=0.5
    )
    changes.start(lambda ids: told.append(None if ids is None else set(ids)))
    try:
        wait_until(lambda: changes.listeners_opened >= 3, what="two renewals")
        assert changes.live() and None not in told
        registry.add_runner(make_runner("r1"))
        _revoke_past_emulator_cancels(registry, "r1")
        wait_until(lambda: any(ids and "r1" in ids for ids in told), what="the revocation")
        assert None not in told
    finally:
        changes.close()


def _revoke_past_emulator_cancels(registry: FirestoreRunnerRegistry, runner_id: str) -> None:
    """Revoke ``runner_id``. The emulator (not Firestore) fails a write with CANCELLED when it
    lands as a renewed-away listener on the same documents is closing: it tells the closed
    stream and its error reaches the writer. The write may have landed, so the registry is
    read before it is tried again."""
    for _ in range(5):
        try:
            assert registry.revoke_runner(runner_id, at=datetime.now(UTC))
            return
        except gexc.Cancelled:
            record = registry.get_runner(runner_id)
            if record is not None and record.revoked_at is not None:
                return
    raise AssertionError(f"the emulator cancelled every revocation of {runner_id}")


MANY = 50
"""Runners registered where choosing a dispatch must not read each of them."""


def _pinned_to(cloud: Cloud, owner: Runner) -> None:
    """A comment for the session ``owner`` holds: its dispatch follows the session there."""
    dispatch = cloud.desk.dispatch(1, kind="deliver", runner_id=owner.runner_id)
    cloud.desk.seed(1, dispatch, session_status="live", session_runner=owner.runner_id)
    wait_until(lambda: cloud.open_count() == 1, what="the push of the dispatch")


def test_choosing_reads_only_the_liveness_of_the_runner_a_dispatch_follows(cloud: Cloud) -> None:
    """Among 50 runners, a look at a dispatch pinned to one of them reads that runner's
    liveness document alone, once per ``runnerListMaxAgeSeconds``; its own runner, live as
    it asks, reads none to lease it."""
    owner, other, third, *_ = [cloud.runner(f"r{n}") for n in range(MANY)]
    _pinned_to(cloud, owner)
    spent = _spent(cloud, lambda: _status(cloud.desk.poll(other, 0), 204))
    # The owner's liveness document; not the slots the poller holds, as it may take nothing.
    assert spent == {"call.RunnerRegistry.list_last_seen": 1, "port.read": 1, "doc.reads": 1}
    assert _spent(cloud, lambda: _status(cloud.desk.poll(third, 0), 204)) == {}  # read just now
    spent = _spent(cloud, lambda: _status(cloud.desk.poll(owner, 0), 200))
    assert not any("RunnerRegistry" in k for k in spent), spent


def test_a_runner_the_cache_does_not_hold_is_read_whole(cloud: Cloud) -> None:
    """Revoked elsewhere, the session's runner leaves the cache: the look reads it (its two
    documents), finds it revoked, and the session fails over."""
    owner, other = cloud.runner("owner"), cloud.runner("other")
    _pinned_to(cloud, owner)
    assert cloud.elsewhere.registry.revoke_runner(owner.runner_id, at=cloud.desk.clock.now())
    wait_until(lambda: cloud.records.find(owner.runner_id) is None, what="the revocation")
    spent = _spent(cloud, lambda: _status(cloud.desk.poll(other, 0), 200))
    assert spent.get("call.RunnerRegistry.get_runners") == 1, spent
    assert "call.RunnerRegistry.list_last_seen" not in spent


def test_until_the_feed_listens_choosing_reads_the_runners_asked_about(
    records_down: Cloud,
) -> None:
    owner, other = records_down.runner("owner"), records_down.runner("other")
    _pinned_to(records_down, owner)
    spent = _spent(records_down, lambda: _status(records_down.desk.poll(other, 0), 204))
    assert spent.get("call.RunnerRegistry.get_runners") == 1, spent
    assert "call.RunnerRegistry.list_runners" not in spent


def _status(response: requests.Response, expected: int) -> None:
    assert response.status_code == expected, response.text


def test_the_cache_holds_at_most_its_size(firestore_client: firestore.Client) -> None:
    """Not the fleet: the least recently used runner is dropped first, and read again when
    it comes back."""
    changes = FirestoreRunnerChanges(
        firestore_client, collection_prefix=f"t{uuid.uuid4().hex[:12]}_", check_seconds=0.05
    )
    records = RunnerRecords(changes, size=2)
    records.start()
    try:
        wait_until(changes.live, what="the first push")
        for name in ("r1", "r2", "r3"):
            records.keep(make_runner(name), records.mark())
        assert len(records) == 2
        assert records.find("r1") is None
        assert records.find("r3") is not None
    finally:
        records.close()
    assert records.find("r3") is None  # closed: vouches for nobody


def test_a_record_read_before_a_change_is_told_is_not_kept(cloud: Cloud) -> None:
    """A read that raced a revocation: the record read may predate it, so it is not kept."""
    runner = cloud.runner("a")
    held = cloud.records.find(runner.runner_id)
    assert held is not None
    mark = cloud.records.mark()
    cloud.records.changed({runner.runner_id})
    cloud.records.keep(held, mark)
    assert cloud.records.find(runner.runner_id) is None


def test_a_process_forked_from_a_listening_one_vouches_for_nobody(cloud: Cloud) -> None:
    # gunicorn forks its worker from the arbiter that built the app: a copy of the cache
    # there would hold records nothing tells of changes (a revoked runner still in it).
    runner = cloud.runner("a")
    assert cloud.records.find(runner.runner_id) is not None
    assert cloud.feed.open_dispatches() is not None

    in_child = _in_a_forked_child(
        lambda: (
            cloud.records.find(runner.runner_id) is None and cloud.feed.open_dispatches() is None
        )
    )

    assert in_child is True
    assert cloud.records.find(runner.runner_id) is not None  # the parent still listens


def _in_a_forked_child(check: Callable[[], bool]) -> bool | None:
    """What ``check`` answers in a forked child (which touches no gRPC and exits at once),
    or None when it did not answer within ``WOKEN_WITHIN``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, then leave without running any cleanup
        try:
            os.write(write, b"1" if check() else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], WOKEN_WITHIN)
        answer = os.read(read, 1) if ready else b""
    finally:
        os.close(read)
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return {b"1": True, b"0": False}.get(answer)
