"""The cloud runner API's runner directory on the Firestore emulator: once its listener has
pushed, an idle runner's polls and heartbeats read nothing; revocation and rotation by another
client take effect as soon as the push arrives; and whatever the directory cannot vouch for
(an unknown id, a secret it does not hold, no listener) is decided on a read of the registry.

Served by ``tests/cloud_rig.py``.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable

import pytest
import requests

from bench.storecount import OpCounts
from looprelay.service.runner_secrets import hash_credential, new_runner_id, new_runner_secret
from tests.cloud_rig import WOKEN_WITHIN, Cloud
from tests.fake_harness import wait_until
from tests.test_leases import Runner

pytestmark = pytest.mark.firestore

ALIVE = {
    "call.RunnerRegistry.record_alive": 1,
    "port.write": 1,
    "doc.commits": 1,
    "doc.writes": 1,
}
"""What a heartbeat that reports nothing new costs: one blind write of the liveness document."""
LOOKUP = {"call.RunnerRegistry.get_runner": 1, "port.read": 1, "doc.reads": 2}
"""What authenticating a runner costs when the directory cannot vouch for it: its runner and
liveness documents, in one batch get."""


def _spent(cloud: Cloud, action: Callable[[], object]) -> dict[str, int]:
    """What ``action`` cost: store calls and documents (the listeners' reads apart)."""
    before = cloud.counts.snapshot()
    action()
    return OpCounts.minus(cloud.counts.snapshot(), before)


def test_once_pushed_polls_and_heartbeats_read_nothing(cloud: Cloud) -> None:
    runner = cloud.runner("a")
    listened = cloud.directory.reads
    assert _spent(cloud, lambda: _status(cloud.desk.poll(runner), 204)) == {}
    cloud.desk.clock.advance(30)
    assert _spent(cloud, lambda: cloud.desk.heartbeat(runner)) == ALIVE
    assert cloud.directory.reads == listened  # no listener heard the heartbeat
    seen = cloud.elsewhere.registry.get_runner(runner.runner_id)
    assert seen is not None and seen.last_seen_at == cloud.desk.clock.now()
    listed = cloud.elsewhere.registry.list_runners()
    assert [r.last_seen_at for r in listed] == [cloud.desk.clock.now()]


def test_a_heartbeat_with_a_new_status_updates_the_runner_and_the_directory(
    cloud: Cloud,
) -> None:
    runner = cloud.runner("a")
    listened = cloud.directory.reads
    spent = _spent(cloud, lambda: cloud.desk.heartbeat(runner, sessions=1))
    assert spent["doc.reads"] == 1  # the conditional update's read; authentication none
    wait_until(
        lambda: (held := cloud.directory.find(runner.runner_id)) and held.sessions == 1,
        what="the push of the new status",
    )
    assert cloud.directory.reads == listened + 1


def test_a_runner_revoked_elsewhere_is_refused_once_the_push_arrives(cloud: Cloud) -> None:
    runner = cloud.runner("a")
    assert cloud.elsewhere.registry.revoke_runner(runner.runner_id, at=cloud.desk.clock.now())
    wait_until(
        lambda: cloud.desk.poll(runner).status_code == 401,
        seconds=WOKEN_WITHIN,
        what="the revocation to reach the directory",
    )
    assert cloud.directory.find(runner.runner_id) is None
    response = cloud.desk.post("heartbeat", {}, auth=runner.auth)
    assert response.status_code == 401 and "revoked" in response.text


def test_a_rotated_secret_works_at_once_and_the_old_one_stops(cloud: Cloud) -> None:
    old = cloud.runner("a")
    new = Runner(old.runner_id, new_runner_secret(), old.name)
    assert cloud.elsewhere.registry.rotate_runner_secret(
        old.runner_id, secret_hash=hash_credential(new.secret)
    )
    # Before the push arrives the directory holds the old hash: the new secret is then
    # checked on a read, never refused.
    _status(cloud.desk.poll(new), 204)
    wait_until(
        lambda: cloud.desk.poll(old).status_code == 401,
        seconds=WOKEN_WITHIN,
        what="the rotation to reach the directory",
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


def test_until_the_directory_listens_every_request_reads_its_runner(
    directory_down: Cloud,
) -> None:
    runner = directory_down.runner("a")
    assert not directory_down.directory.listening()
    assert _spent(directory_down, lambda: _status(directory_down.desk.poll(runner), 204)) == LOOKUP
    stranger = Runner(new_runner_id(), new_runner_secret(), "stranger")
    assert _spent(directory_down, lambda: _status(directory_down.desk.poll(stranger), 401)) == (
        LOOKUP
    )


def test_a_dropped_listener_is_opened_again(cloud: Cloud) -> None:
    runner = cloud.runner("a")
    cloud.directory._listened._watch.close()  # as the client library does on a fatal error
    wait_until(
        lambda: cloud.directory.listeners_opened == 2 and cloud.directory.listening(),
        what="a second listener's first push",
    )
    assert _spent(cloud, lambda: _status(cloud.desk.poll(runner), 204)) == {}


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


def test_a_runner_the_directory_does_not_hold_is_read_whole(cloud: Cloud) -> None:
    """Revoked elsewhere, the session's runner leaves the directory: the look reads it (its
    two documents), finds it revoked, and the session fails over."""
    owner, other = cloud.runner("owner"), cloud.runner("other")
    _pinned_to(cloud, owner)
    assert cloud.elsewhere.registry.revoke_runner(owner.runner_id, at=cloud.desk.clock.now())
    wait_until(lambda: cloud.directory.find(owner.runner_id) is None, what="the revocation")
    spent = _spent(cloud, lambda: _status(cloud.desk.poll(other, 0), 200))
    assert spent.get("call.RunnerRegistry.get_runners") == 1, spent
    assert "call.RunnerRegistry.list_last_seen" not in spent


def test_until_the_directory_listens_choosing_reads_the_runners_asked_about(
    directory_down: Cloud,
) -> None:
    owner, other = directory_down.runner("owner"), directory_down.runner("other")
    _pinned_to(directory_down, owner)
    spent = _spent(directory_down, lambda: _status(directory_down.desk.poll(other, 0), 204))
    assert spent.get("call.RunnerRegistry.get_runners") == 1, spent
    assert "call.RunnerRegistry.list_runners" not in spent


def _status(response: requests.Response, expected: int) -> None:
    assert response.status_code == expected, response.text


def test_a_process_forked_from_a_listening_one_vouches_for_nobody(cloud: Cloud) -> None:
    # gunicorn forks its worker from the arbiter that built the app: a copy of the
    # directory there would hold a result nothing updates (a revoked runner still in it).
    runner = cloud.runner("a")
    assert cloud.directory.find(runner.runner_id) is not None
    assert cloud.feed.open_dispatches() is not None

    in_child = _in_a_forked_child(
        lambda: (
            cloud.directory.find(runner.runner_id) is None and cloud.feed.open_dispatches() is None
        )
    )

    assert in_child is True
    assert cloud.directory.find(runner.runner_id) is not None  # the parent still listens


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
