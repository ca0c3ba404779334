"""What a waiting poll decides from the pushed open dispatches, without reading the store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from looprelay.core.feed import how_many_may_take, next_lapse, worth_a_look
from looprelay.core.model import DispatchRecord, RunnerRecord
from tests.dispatches import make_dispatch

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RUNNER = RunnerRecord(
    runner_id="r-1",
    name="a",
    secret_hash="0" * 64,
    registered_at=T0,
    labels={"os": "linux"},
    repositories=["Octo/App"],
    capacity=2,
)


def test_only_heads_this_runner_may_take_are_worth_a_look() -> None:
    mine = make_dispatch(repository="octo/app", number=1, created_at=T0)
    behind_mine = make_dispatch(repository="octo/app", number=1, seq=2, created_at=T0)
    other_repository = make_dispatch(repository="octo/other", number=2, created_at=T0)
    other_labels = make_dispatch(
        repository="octo/app", number=3, created_at=T0, labels={"os": "macos"}
    )
    held = make_dispatch(
        repository="octo/app",
        number=4,
        created_at=T0,
        status="leased",
        lease_expires_at=T0 + timedelta(seconds=30),
    )
    lapsed = held.model_copy(
        update={
            "work_item": "github:octo/app#5",
            "endpoint": "github:octo/app#5",
            "lease_expires_at": T0 - timedelta(seconds=1),
        }
    )
    pushed = [behind_mine, mine, other_repository, other_labels, held, lapsed]
    assert [d.dispatch_id for d in worth_a_look(pushed, RUNNER, now=T0)] == [
        mine.dispatch_id,
        lapsed.dispatch_id,
    ]
    full = RUNNER.model_copy(update={"sessions": 2})
    assert worth_a_look([mine], full, now=T0) == []


def test_a_poll_wakes_when_the_earliest_running_lease_lapses() -> None:
    def leased(number: int, seconds: int) -> DispatchRecord:
        return make_dispatch(
            repository="octo/app",
            number=number,
            created_at=T0,
            status="leased",
            lease_expires_at=T0 + timedelta(seconds=seconds),
        )

    pushed = [leased(1, 40), leased(2, 10), leased(3, -5)]
    pushed.append(make_dispatch(repository="octo/app", number=4, created_at=T0))
    assert next_lapse(pushed, now=T0) == T0 + timedelta(seconds=10)
    assert next_lapse([], now=T0) is None


def test_a_ring_is_for_a_runner_as_often_as_it_might_take_one_of_its_dispatches() -> None:
    spawn = make_dispatch(repository="octo/app", number=1, created_at=T0)
    on_r2 = make_dispatch(
        repository="octo/app", number=2, created_at=T0, kind="deliver", runner_id="r-2"
    )
    assert how_many_may_take([spawn], RUNNER, live=["r-2"])
    # A session on another live runner keeps its dispatch; once that runner is lost, any may.
    assert not how_many_may_take([on_r2], RUNNER, live=["r-2"])
    assert how_many_may_take([on_r2], RUNNER, live=[])
    assert how_many_may_take([on_r2.model_copy(update={"runner_id": "r-1"})], RUNNER, live=["r-1"])
    other = make_dispatch(repository="octo/other", number=3, created_at=T0)
    gpu = make_dispatch(repository="octo/app", number=4, created_at=T0, labels={"gpu": "yes"})
    assert not how_many_may_take([other, gpu], RUNNER, live=[])
    # Capacity is the look's to judge (its heartbeat's count may be stale): a full one looks.
    assert how_many_may_take([spawn], RUNNER.model_copy(update={"sessions": 2}), live=[])
    assert not how_many_may_take([], RUNNER, live=[])
    # As many as it might take: that many of the runner's waiting polls look.
    assert how_many_may_take([spawn, on_r2, other], RUNNER, live=[]) == 2
