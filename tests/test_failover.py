"""Failover over real HTTP: a restarted runner's leases offered again at once, a returning
runner told which sessions moved away, and the new runner announced on the work item.

The runner API as ``looprelay.app.services.build_runner_api`` builds it, on stores of each backend
(``tests.test_leases`` serves it), with a clock the test moves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from looprelay.core.model import RunnerRecord
from looprelay.core.prsessions import tmux_session_name
from looprelay.service.waker import Opened
from tests.fake_github import REPOSITORY, FakeGitHub
from tests.rigs import Stores
from tests.test_leases import CONFIG, Desk, Runner, _lease_desk, serve_desk


@pytest.fixture
def desk(stores: Stores, fake_github: FakeGitHub) -> Iterator[Desk]:
    yield from serve_desk(stores, fake_github)


def _held(desk: Desk, number: int) -> dict[str, str]:
    ref = desk.dispatch(number).work_item
    return {"work_item": ref, "endpoint": ref, "session_name": tmux_session_name(ref)}


def _beat(desk: Desk, runner: Runner, **fields: Any) -> dict[str, Any]:
    answer = desk.post("heartbeat", {"repositories": [REPOSITORY], **fields}, auth=runner.auth)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


class TestRestartedRunner:
    def test_its_leases_are_offered_again_at_once_and_no_other_runners(self, desk: Desk) -> None:
        box, other = desk.runner("box"), desk.runner("other")
        desk.seed(1, desk.dispatch(1))
        desk.seed(2, desk.dispatch(2))
        assert desk.polled_id(box) == "dp-1-1"
        assert desk.polled_id(other) == "dp-2-1"

        assert _beat(desk, box, restarted=True)["released_leases"] == 1

        # No clock moved: the lease did not lapse, it was given up.
        assert (desk.stored("dp-1-1").status, desk.stored("dp-2-1").status) == (
            "pending",
            "leased",
        )
        assert desk.polled_id(box) == "dp-1-1"
        assert desk.stored("dp-1-1").attempts == 2
        [event] = desk.events("lease.released")
        assert event == {
            "runner_id": box.runner_id,
            "dispatch_id": "dp-1-1",
            "reason": "runner-restarted",
        }

    def test_a_plain_heartbeat_releases_nothing(self, desk: Desk) -> None:
        box = desk.runner("box")
        desk.seed(1, desk.dispatch(1))
        assert desk.polled_id(box) == "dp-1-1"
        assert _beat(desk, box)["released_leases"] == 0
        assert desk.stored("dp-1-1").status == "leased"


class TestMovedSessions:
    def test_a_runner_back_from_lost_is_told_which_sessions_moved_and_its_release_is_logged(
        self, desk: Desk
    ) -> None:
        old, new = desk.runner("old"), desk.runner("new")
        desk.seed(
            1,
            desk.dispatch(1, kind="deliver", runner_id=old.runner_id),
            session_status="live",
            session_runner=old.runner_id,
        )
        desk.seed(2, session_status="live", session_runner=old.runner_id)
        desk.clock.advance(CONFIG.lost_after_seconds + 1)  # old fell silent
        desk.heartbeat(new)
        assert desk.polled_id(new) == "dp-1-1"
        assert desk.report(new, "dp-1-1", status="spawned", resumed=True).status_code == 200

        moved = _beat(desk, old, held=[_held(desk, 1), _held(desk, 2)])["moved"]

        assert moved == [{**_held(desk, 1), "runner_id": new.runner_id}]  # #2 stayed
        released = {**_held(desk, 1), "outcome": "harness terminated; tmux session killed"}
        assert _beat(desk, old, released=[released])["moved"] == []
        [event] = desk.events("session.released")
        assert event == {
            "runner_id": old.runner_id,
            "endpoint": released["endpoint"],
            "session_name": released["session_name"],
            "outcome": released["outcome"],
        }

    def test_the_respawn_on_another_runner_gets_an_attach_comment_naming_it(
        self, desk: Desk
    ) -> None:
        old, new = desk.runner("old-box"), desk.runner("new-box")
        desk.seed(1, desk.dispatch(1))
        assert desk.polled_id(old) == "dp-1-1"
        assert desk.report(old, "dp-1-1", status="spawned", tmux_target="loop-a").status_code == 200
        desk.seed(
            1,
            desk.dispatch(1, 2, kind="deliver", runner_id=old.runner_id),
            session_status="live",
            session_runner=old.runner_id,
        )
        desk.clock.advance(CONFIG.lost_after_seconds + 1)
        desk.heartbeat(new)
        assert desk.polled_id(new) == "dp-1-2"
        # A respawn (resumed): on the same runner it is never announced again.
        reported = desk.report(new, "dp-1-2", status="spawned", resumed=True, tmux_target="loop-b")
        assert reported.status_code == 200

        first, second = desk.attach_comments(1)
        assert "**old-box**" in first and "**new-box**" in second
        assert "attach -t loop-b" in second


class TestLivenessAsRead:
    """Whether a session's runner is live is read again only once ``runnerListMaxAgeSeconds``
    passed since it was last read: a runner back from silence is noticed that much later."""

    def test_a_runner_heard_from_again_is_live_once_it_is_read_again(self, desk: Desk) -> None:
        old, new = desk.runner("old"), desk.runner("new")
        comment = desk.dispatch(1, kind="deliver", runner_id=old.runner_id)
        desk.seed(1, comment, session_status="live", session_runner=old.runner_id)
        ticks = [0.0]
        lease_desk = _lease_desk(
            desk.stores,
            clock=desk.clock,
            waker=None,
            github=desk.github,
            monotonic=lambda: ticks[0],
        )
        assert lease_desk.try_lease(_record(desk, new)) is None  # old is live: read now

        desk.clock.advance(CONFIG.lost_after_seconds + 1)
        desk.heartbeat(old)
        desk.heartbeat(new)
        wants = lease_desk.wants(_record(desk, new))
        opened = Opened((desk.stored(comment.dispatch_id),))
        assert wants(opened)  # as last read, old fell silent: the session may move
        ticks[0] = CONFIG.runner_list_max_age_seconds
        assert not wants(opened)  # read again: old is back
        assert lease_desk.try_lease(_record(desk, new)) is None
        assert desk.polled_id(old) == comment.dispatch_id


def _record(desk: Desk, runner: Runner) -> RunnerRecord:
    record = desk.stores.registry.get_runner(runner.runner_id)
    assert record is not None
    return record
