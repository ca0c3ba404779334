"""What the server says runs is what runs (issue 23, the server's side), on both stores.

Each case drives the runner API over real HTTP (the async long poll ``looprelay up`` serves),
then reads the operator's view as ``looprelay status --json`` does (``StatusReader``) and
checks that every runner's slots are the sessions the server believes live
(``core.slots.believed_slots``): a slot never outlives its harness, and no harness runs
without one.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import requests

from looprelay.core.model import SessionRecord, WorkItemRecord
from looprelay.core.prsessions import tmux_session_name
from looprelay.core.slots import believed_slots
from looprelay.service.runners import mint_registration_token
from tests.dispatches import work_item_ref
from tests.fake_github import REPOSITORY, FakeGitHub
from tests.rigs import Stores, status_json
from tests.test_leases import CONFIG, HTTP_TIMEOUT, Desk, Runner, serve_desk

PR = 30
"""The pull request of work item #7 that has a session of its own."""


@pytest.fixture
def desk(stores: Stores, fake_github: FakeGitHub) -> Iterator[Desk]:
    yield from serve_desk(stores, fake_github)


def _ref(number: int) -> str:
    return work_item_ref(REPOSITORY, number)


def _status(desk: Desk) -> dict[str, Any]:
    """The view ``looprelay status --json`` prints, from the desk's stores."""
    return status_json(desk.stores, desk.clock, lost_after_seconds=CONFIG.lost_after_seconds)


def _runner_row(view: dict[str, Any], runner: Runner) -> dict[str, Any]:
    [row] = [r for r in view["runners"] if r["runner_id"] == runner.runner_id]
    return row


def _session_rows(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["endpoint"]: row for row in view["sessions"]}


def _waiting(view: dict[str, Any]) -> dict[str, str | None]:
    return {row["dispatch_id"]: row["waiting"] for row in view["dispatches"]}


def _assert_slots_are_sessions(desk: Desk, *runners: Runner) -> None:
    """Every runner's slots equal what the server believes runs on it."""
    items = desk.stores.work_items
    work_items = {item.ref: item for item in items.list_work_items()}
    believed = believed_slots(work_items, items.list_dispatches(statuses=("leased",)))
    for runner in runners:
        held = items.held_sessions(runner.runner_id)
        expected = {s.endpoint: s.work_item for s in believed if s.runner_id == runner.runner_id}
        assert held == expected, f"{runner.name} holds {held}, runs {expected}"


def _seed_sessions(desk: Desk, number: int, *dispatches: Any, **sessions: SessionRecord) -> None:
    """Save work item ``number`` with exactly ``sessions`` (by endpoint) and ``dispatches``."""
    ref = _ref(number)
    current = desk.stores.work_items.get_work_item(ref)
    item = current or WorkItemRecord(ref=ref, repository=REPOSITORY, number=number)
    item = item.model_copy(
        update={
            "sessions": {s.endpoint: s for s in sessions.values()},
            "updated_at": desk.clock.now(),
        }
    )
    saved = desk.stores.work_items.save_work_item(
        item, expected_version=current.version if current else 0, dispatches=dispatches
    )
    assert saved


def _session(endpoint: str, **changes: Any) -> SessionRecord:
    fields: dict[str, Any] = {
        "endpoint": endpoint,
        "session_name": tmux_session_name(endpoint),
        "session_id": f"sid-{tmux_session_name(endpoint)}",
        "harness": "claude",
        "runner_kind": "tmux",
        "interaction": "work-item",
    }
    return SessionRecord(**(fields | changes))


class TestFailover:
    def test_capacity_one_on_both_runners_and_the_old_one_coming_back(self, desk: Desk) -> None:
        old, new = desk.runner("old", capacity=1), desk.runner("new", capacity=1)
        desk.seed(7, desk.dispatch(7))
        assert desk.polled_id(old) == "dp-7-1"
        assert desk.report(old, "dp-7-1", status="spawned").status_code == 200
        _assert_slots_are_sessions(desk, old, new)
        # The old runner falls silent; a plain comment on #7 follows the session there.
        desk.clock.advance(CONFIG.lost_after_seconds + 1)
        desk.heartbeat(new)
        comment = desk.dispatch(7, 2, kind="deliver", runner_id=old.runner_id)
        desk.seed(7, comment, session_status="live", session_runner=old.runner_id)
        assert desk.polled_id(new) == "dp-7-2"
        # The move took the new runner's slot and freed the old one's, in the lease's write.
        assert desk.stores.work_items.held_sessions(new.runner_id) == {_ref(7): _ref(7)}
        assert desk.stores.work_items.held_sessions(old.runner_id) == {}
        assert desk.report(new, "dp-7-2", status="spawned", resumed=True).status_code == 200
        # The old one comes back naming its copy: it is told the session moved.
        held = [{"work_item": _ref(7), "endpoint": _ref(7), "session_name": "loop-x"}]
        answer = desk.post(
            "heartbeat",
            {"capacity": 1, "repositories": [REPOSITORY], "held": held},
            auth=old.auth,
        )
        assert [m["runner_id"] for m in answer.json()["moved"]] == [new.runner_id]
        _assert_slots_are_sessions(desk, old, new)
        view = _status(desk)
        assert (_runner_row(view, old)["sessions"], _runner_row(view, new)["sessions"]) == (0, 1)
        assert _session_rows(view)[_ref(7)]["runner_id"] == new.runner_id
        # The old runner's free slot takes the next issue; the new one is full.
        desk.seed(8, desk.dispatch(8))
        assert desk.polled_id(new) is None
        assert desk.polled_id(old) == "dp-8-1"
        _assert_slots_are_sessions(desk, old, new)

    def test_a_spawn_whose_lease_lapsed_frees_the_first_holders_slot(self, desk: Desk) -> None:
        first, second = desk.runner("first", capacity=1), desk.runner("second", capacity=1)
        desk.seed(7, desk.dispatch(7))
        assert desk.polled_id(first) == "dp-7-1"
        desk.clock.advance(CONFIG.lease_seconds + 1)
        desk.heartbeat(first)
        desk.heartbeat(second)
        assert desk.polled_id(second) == "dp-7-1"
        assert desk.stores.work_items.held_sessions(first.runner_id) == {}
        _assert_slots_are_sessions(desk, first, second)


class TestCleanup:
    def test_the_cleanups_of_two_sessions_of_one_work_item_go_one_at_a_time(
        self, desk: Desk
    ) -> None:
        runner = desk.runner("box", capacity=2, workspace=True)
        pr = f"github:{REPOSITORY}#{PR}"
        _seed_sessions(
            desk,
            7,
            desk.dispatch(7),
            desk.dispatch(7, 2, endpoint=pr, session_name=tmux_session_name(pr)),
            own=_session(_ref(7)),
            pr=_session(pr),
        )
        for _ in range(2):
            leased = desk.polled_id(runner)
            assert leased is not None
            assert desk.report(runner, leased, status="spawned").status_code == 200
        _assert_slots_are_sessions(desk, runner)
        assert len(desk.stores.work_items.held_sessions(runner.runner_id)) == 2
        item = desk.stores.work_items.get_work_item(_ref(7))
        assert item is not None
        ended = {e: s.model_copy(update={"status": "cleaned"}) for e, s in item.sessions.items()}
        cleanups = [
            desk.dispatch(7, 3, kind="cleanup", runner_id=runner.runner_id),
            desk.dispatch(
                7,
                4,
                kind="cleanup",
                runner_id=runner.runner_id,
                endpoint=pr,
                session_name=tmux_session_name(pr),
            ),
        ]
        _seed_sessions(desk, 7, *cleanups, **{str(n): s for n, s in enumerate(ended.values())})
        assert desk.polled_id(runner) == "dp-7-3"
        assert desk.polled_id(runner) is None  # the second waits for the first
        assert _waiting(_status(desk))["dp-7-4"] == "after-earlier-dispatch-of-its-session"
        assert desk.report(runner, "dp-7-3", status="done").status_code == 200
        assert desk.polled_id(runner) == "dp-7-4"
        assert desk.report(runner, "dp-7-4", status="done").status_code == 200
        assert desk.stores.work_items.held_sessions(runner.runner_id) == {}
        _assert_slots_are_sessions(desk, runner)
        assert _runner_row(_status(desk), runner)["sessions"] == 0


class TestHeadless:
    def test_turns_of_one_issue_stay_on_its_runner_and_hold_no_slot_between_turns(
        self, desk: Desk
    ) -> None:
        a, b = desk.runner("a", capacity=1), desk.runner("b", capacity=1)
        headless = {"runner_kind": "process", "interaction": "work-item"}
        _seed_sessions(
            desk,
            7,
            desk.dispatch(7, **headless),
            # Routed while the first turn was pending: it names no runner yet.
            desk.dispatch(7, 2, kind="deliver", **headless),
            own=_session(_ref(7), runner_kind="process"),
        )
        assert desk.polled_id(a) == "dp-7-1"
        assert desk.stores.work_items.held_sessions(a.runner_id) == {_ref(7): _ref(7)}
        _assert_slots_are_sessions(desk, a, b)
        assert desk.report(a, "dp-7-1", status="done", session_id="conv-7").status_code == 200
        # Between turns nothing runs: a's slot is free, and the session is placed on a.
        assert desk.stores.work_items.held_sessions(a.runner_id) == {}
        assert [e["runner_id"] for e in desk.events("session.spawned")] == [a.runner_id]
        row = _session_rows(_status(desk))[_ref(7)]
        assert (row["state"], row["runner_id"], row["attach"]) == ("live", a.runner_id, None)
        assert desk.polled_id(b) is None  # the next turn follows the conversation to a
        assert desk.polled_id(a) == "dp-7-2"
        _assert_slots_are_sessions(desk, a, b)
        assert desk.report(a, "dp-7-2", status="done", session_id="conv-7").status_code == 200
        # With capacity 1, another issue's first turn runs on a between two of #7's.
        _seed_sessions(
            desk, 8, desk.dispatch(8, **headless), own=_session(_ref(8), runner_kind="process")
        )
        assert desk.polled_id(a) == "dp-8-1"
        _assert_slots_are_sessions(desk, a, b)
        assert _runner_row(_status(desk), a)["sessions"] == 1


class TestPullRequestSessions:
    def test_a_pr_session_goes_only_to_a_runner_that_can_make_its_checkout(
        self, desk: Desk
    ) -> None:
        plain = desk.runner("plain", capacity=2)
        pr = f"github:{REPOSITORY}#{PR}"
        spawn = desk.dispatch(7, endpoint=pr, session_name=tmux_session_name(pr))
        _seed_sessions(desk, 7, spawn, pr=_session(pr))
        assert desk.polled_id(plain) is None
        assert _waiting(_status(desk))["dp-7-1"] == "no-separate-checkout"
        roomy = desk.runner("roomy", capacity=2, workspace=True)
        assert desk.polled_id(roomy) == "dp-7-1"


class TestTruthfulStatus:
    def test_a_registered_runner_that_never_ran_is_not_started_and_serves_nothing(
        self, desk: Desk
    ) -> None:
        token = mint_registration_token(
            desk.stores.registry, now=desk.clock.now(), ttl=timedelta(hours=1)
        )
        answer = requests.post(
            f"{desk.url}/runner/v1/register",
            json={"token": token, "name": "idle", "labels": {}},
            timeout=HTTP_TIMEOUT,
        )
        assert answer.status_code == 201
        desk.seed(7, desk.dispatch(7))
        view = _status(desk)
        [row] = view["runners"]
        assert row["state"] == "not-started"
        assert view["totals"]["runners_live"] == 0
        assert _waiting(view)["dp-7-1"] == "no-live-runner"

    def test_an_unserved_repository_is_the_reason_even_when_the_runner_is_full(
        self, desk: Desk
    ) -> None:
        runner = desk.runner("box", capacity=1)
        desk.seed(7, desk.dispatch(7))
        assert desk.polled_id(runner) == "dp-7-1"
        elsewhere = desk.dispatch(8).model_copy(update={"repository": "octo/elsewhere"})
        desk.seed(8, elsewhere)
        assert _waiting(_status(desk))["dp-8-1"] == "repository-not-served"


class TestOneAgentPerRunner:
    def _beat(self, desk: Desk, runner: Runner, **body: Any) -> requests.Response:
        return desk.post("heartbeat", {"repositories": [REPOSITORY], **body}, auth=runner.auth)

    def test_a_second_live_agent_on_the_same_credentials_is_refused(self, desk: Desk) -> None:
        runner = desk.runner("box")
        assert self._beat(desk, runner, agent_id="first", restarted=True).status_code == 200
        refused = self._beat(desk, runner, agent_id="second", restarted=True)
        assert refused.status_code == 409
        assert "served by another live agent (id first" in refused.json()["error"]
        assert "`looprelay runner register`" in refused.json()["error"]
        poll = desk.post("poll", {"wait_seconds": 0, "agent_id": "second"}, auth=runner.auth)
        assert poll.status_code == 409
        own = desk.post("poll", {"wait_seconds": 0, "agent_id": "first"}, auth=runner.auth)
        assert own.status_code == 204
        assert [e["agent_id"] for e in desk.events("runner.second_agent_refused")] == [
            "second",
            "second",
        ]

    def test_a_restart_on_the_dead_agents_state_directory_is_accepted_at_once(
        self, desk: Desk
    ) -> None:
        runner = desk.runner("box")
        assert self._beat(desk, runner, agent_id="first").status_code == 200
        restarted = self._beat(desk, runner, agent_id="again", replaces="first", restarted=True)
        assert restarted.status_code == 200
        assert self._beat(desk, runner, agent_id="first").status_code == 409  # it is gone

    def test_an_agent_is_accepted_once_the_one_before_fell_silent(self, desk: Desk) -> None:
        runner = desk.runner("box")
        assert self._beat(desk, runner, agent_id="first").status_code == 200
        desk.clock.advance(CONFIG.lost_after_seconds + 1)
        assert self._beat(desk, runner, agent_id="elsewhere").status_code == 200
        record = desk.stores.registry.get_runner(runner.runner_id)
        assert record is not None and record.agent_id == "elsewhere"
