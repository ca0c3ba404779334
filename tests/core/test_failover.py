"""Failover and resending, as pure decisions: which held sessions moved away, what a resend of
an interrupted dispatch is, and that a restarted runner at capacity takes its own work back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from looprelay.core.failover import Held, Moved, moved_away
from looprelay.core.model import DispatchRecord, RunnerRecord, SessionRecord, WorkItemRecord
from looprelay.core.prsessions import tmux_session_name
from looprelay.core.resend import resend, resend_id
from looprelay.core.scheduling import why_not

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
REPOSITORY = "octo/widgets"


def _ref(number: int) -> str:
    return f"github:{REPOSITORY}#{number}"


def _item(number: int, *, runner_id: str | None, next_seq: int = 5) -> WorkItemRecord:
    ref = _ref(number)
    session = SessionRecord(
        endpoint=ref,
        session_name=tmux_session_name(ref),
        session_id="5f0c6a52-36a4-4d55-9a83-2d9f0b5a4e11",
        harness="claude",
        runner_kind="tmux",
        interaction="work-item",
        status="live",
        runner_id=runner_id,
    )
    return WorkItemRecord(
        ref=ref, repository=REPOSITORY, number=number, sessions={ref: session}, next_seq=next_seq
    )


def _held(number: int) -> Held:
    return Held(_ref(number), _ref(number), tmux_session_name(_ref(number)))


def _dispatch(**changes: object) -> DispatchRecord:
    base = DispatchRecord(
        dispatch_id="dp-7-3",
        delivery_id="d-7-3",
        work_item=_ref(7),
        endpoint=_ref(7),
        seq=3,
        kind="deliver",
        repository=REPOSITORY,
        session_name=tmux_session_name(_ref(7)),
        session_id="5f0c6a52-36a4-4d55-9a83-2d9f0b5a4e11",
        prompt="New comment: ship it",
        runner_id="r-a",
        status="failed",
        lease_holder="r-a",
        attempts=2,
        result="interrupted",
        detail="the agent stopped while applying it; not applied again",
        created_at=T0,
        comment_id=42,
    )
    return base.model_copy(update=changes)


class TestMovedAway:
    def test_only_sessions_recorded_on_another_runner_moved(self) -> None:
        items = {
            _ref(1): _item(1, runner_id="r-b"),  # respawned on r-b
            _ref(2): _item(2, runner_id="r-a"),  # still here
            _ref(3): _item(3, runner_id=None),  # its spawn not reported yet
        }
        held = [_held(1), _held(2), _held(3), _held(4)]  # #4: gone from the server

        assert moved_away(held, items, runner_id="r-a") == [Moved(_held(1), "r-b")]


class TestResend:
    def test_the_resend_has_its_own_id_the_next_seq_and_the_same_prompt(self) -> None:
        original = _dispatch()
        item, again = resend(original, _item(7, runner_id="r-b"), now=T0 + timedelta(hours=1))

        assert again.dispatch_id == resend_id("dp-7-3") != "dp-7-3"
        assert (again.seq, item.next_seq) == (5, 6)
        assert (again.prompt, again.kind, again.comment_id) == (original.prompt, "deliver", 42)
        # Pending for the runner the session lives on now, with nothing of the old result.
        assert (again.status, again.runner_id, again.lease_holder, again.attempts) == (
            "pending",
            "r-b",
            None,
            0,
        )
        assert (again.result, again.detail, again.created_at) == ("", "", T0 + timedelta(hours=1))

    def test_without_a_session_it_goes_to_the_runner_that_was_applying_it(self) -> None:
        item = _item(7, runner_id=None)
        _, again = resend(_dispatch(runner_id=None), item, now=T0)
        assert again.runner_id == "r-a"

    @pytest.mark.parametrize(
        "changes",
        [{"result": "harness-failed"}, {"status": "succeeded", "result": "delivered"}],
    )
    def test_only_an_interrupted_dispatch_is_sent_again(self, changes: dict[str, str]) -> None:
        with pytest.raises(ValueError, match="not interrupted"):
            resend(_dispatch(**changes), _item(7, runner_id="r-a"), now=T0)


class TestRestartAtCapacity:
    def test_a_full_runner_takes_back_a_spawn_it_leased_before_and_no_other(self) -> None:
        runner = RunnerRecord(
            runner_id="r-a",
            name="r-a",
            secret_hash="x",
            registered_at=T0,
            repositories=[REPOSITORY],
            capacity=1,
            sessions=1,  # the session of the spawn it was applying when it was killed
        )
        released = _dispatch(kind="spawn", runner_id=None, status="pending", result="")
        other = "github:octo/widgets#8"
        fresh = released.model_copy(
            update={
                "dispatch_id": "dp-8-1",
                "lease_holder": None,
                "endpoint": other,
                "work_item": other,
            }
        )
        # The slot the spawn took when it was first leased outlives the restart's release.
        holding = {released.endpoint: released.work_item}

        assert why_not(released, runner, live=["r-a"], holding=holding) is None
        assert why_not(fresh, runner, live=["r-a"], holding=holding) == "runner-at-capacity"
