"""Which dispatch a polling runner gets: order per work item, affinity, liveness, targeting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from looprelay.core.model import DispatchRecord, RunnerRecord
from looprelay.core.scheduling import (
    Waiting,
    choose_dispatch,
    heads_of_line,
    is_live,
    reports_new_status,
    waiting_reasons,
    why_not,
    with_last_seen,
)
from looprelay.ports import RunnerStatus

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LOST_AFTER = timedelta(seconds=120)
ITEM_A = "github:octo/widgets#7"
ITEM_B = "github:octo/widgets#8"
REPOSITORY = "octo/widgets"


def _dispatch(
    dispatch_id: str, *, seq: int = 1, work_item: str = ITEM_A, age: int = 0, **changes: object
) -> DispatchRecord:
    """A pending spawn for ``work_item``; ``age`` seconds before T0 it was created."""
    base = DispatchRecord(
        dispatch_id=dispatch_id,
        delivery_id=f"d-{dispatch_id}",
        work_item=work_item,
        endpoint=work_item,
        seq=seq,
        kind="spawn",
        repository=REPOSITORY,
        session_name="loop-github-octo-widgets-7",
        session_id="5f0c6a52-36a4-4d55-9a83-2d9f0b5a4e11",
        created_at=T0 - timedelta(seconds=age),
    )
    return base.model_copy(update=changes)


def _leased(dispatch_id: str, *, expires_in: int, **changes: Any) -> DispatchRecord:
    return _dispatch(
        dispatch_id,
        status="leased",
        lease_holder="r-holder",
        lease_expires_at=T0 + timedelta(seconds=expires_in),
        **changes,
    )


def _runner(runner_id: str = "r-a", **changes: object) -> RunnerRecord:
    """A live runner with a checkout of octo/widgets and one free session slot."""
    base = RunnerRecord(
        runner_id=runner_id,
        name=runner_id,
        secret_hash="0" * 64,
        registered_at=T0 - timedelta(hours=1),
        last_seen_at=T0,
        repositories=[REPOSITORY],
    )
    return base.model_copy(update=changes)


def _ids(dispatches: list[DispatchRecord]) -> list[str]:
    return [d.dispatch_id for d in dispatches]


class TestHeadsOfLine:
    @pytest.mark.parametrize(
        ("dispatches", "expected"),
        [
            pytest.param([], [], id="nothing-open"),
            pytest.param([_dispatch("one")], ["one"], id="a-pending-dispatch-is-offerable"),
            pytest.param(
                [_dispatch("s2", seq=2, age=9), _dispatch("s1", seq=1)],
                ["s1"],
                id="the-lower-seq-goes-first-even-when-created-later",
            ),
            pytest.param(
                [_leased("s1", expires_in=30), _dispatch("s2", seq=2)],
                [],
                id="a-leased-unexpired-head-blocks-its-work-item",
            ),
            pytest.param(
                [_leased("s1", expires_in=-1), _dispatch("s2", seq=2)],
                ["s1"],
                id="a-lapsed-lease-is-offerable-again",
            ),
            pytest.param(
                [_leased("s1", expires_in=0)],
                [],
                id="a-lease-expiring-right-now-still-holds",
            ),
            pytest.param(
                [_dispatch("s1", status="leased", lease_expires_at=None)],
                [],
                id="a-leased-dispatch-without-expiry-is-not-offered",
            ),
            pytest.param(
                [_dispatch("s1", status="succeeded"), _dispatch("s2", seq=2)],
                ["s2"],
                id="a-settled-dispatch-blocks-nothing",
            ),
            pytest.param(
                [_dispatch("s1", status="failed"), _dispatch("s2", seq=2)],
                ["s2"],
                id="a-failed-dispatch-blocks-nothing",
            ),
            pytest.param(
                [_leased("a1", expires_in=30), _dispatch("b1", work_item=ITEM_B)],
                ["b1"],
                id="work-items-are-independent",
            ),
            pytest.param(
                [
                    _dispatch("new", work_item=ITEM_B, age=1),
                    _dispatch("old", age=5),
                ],
                ["old", "new"],
                id="oldest-first",
            ),
            pytest.param(
                [_dispatch("zz", work_item=ITEM_B), _dispatch("aa")],
                ["aa", "zz"],
                id="same-age-ties-break-on-the-dispatch-id",
            ),
        ],
    )
    def test_offers_each_work_items_first_unsettled_dispatch(
        self, dispatches: list[DispatchRecord], expected: list[str]
    ) -> None:
        assert _ids(heads_of_line(dispatches, now=T0)) == expected


class TestIsLive:
    @pytest.mark.parametrize(
        ("changes", "live"),
        [
            pytest.param({}, True, id="just-heard-from"),
            pytest.param({"last_seen_at": T0 - LOST_AFTER}, True, id="silent-exactly-the-limit"),
            pytest.param(
                {"last_seen_at": T0 - LOST_AFTER - timedelta(seconds=1)},
                False,
                id="silent-past-the-limit",
            ),
            pytest.param(
                {"last_seen_at": None, "registered_at": T0 - timedelta(seconds=5)},
                False,
                id="never-heard-from-but-just-registered",
            ),
            pytest.param(
                {"last_seen_at": None, "registered_at": T0 - timedelta(hours=1)},
                False,
                id="never-heard-from-since-long-ago",
            ),
            pytest.param({"revoked_at": T0}, False, id="revoked"),
        ],
    )
    def test_liveness(self, changes: dict[str, Any], live: bool) -> None:
        runner = _runner(**changes)
        assert is_live(runner, now=T0, lost_after=LOST_AFTER) is live


class TestWithLastSeen:
    @pytest.mark.parametrize(
        ("own", "apart", "expected"),
        [
            pytest.param(T0, None, T0, id="nothing-apart"),
            pytest.param(None, T0, T0, id="heard-only-apart"),
            pytest.param(T0, T0 + timedelta(seconds=30), T0 + timedelta(seconds=30), id="later"),
            pytest.param(T0, T0 - timedelta(seconds=30), T0, id="earlier-apart-is-ignored"),
            pytest.param(None, None, None, id="never-heard-from"),
        ],
    )
    def test_the_later_of_the_two_wins(
        self, own: datetime | None, apart: datetime | None, expected: datetime | None
    ) -> None:
        merged = with_last_seen(_runner(last_seen_at=own), apart)
        assert merged == _runner(last_seen_at=expected)

    def test_a_revoked_runner_stays_revoked(self) -> None:
        merged = with_last_seen(_runner(revoked_at=T0), T0 + timedelta(minutes=1))
        assert merged.revoked and not is_live(merged, now=T0, lost_after=LOST_AFTER)


class TestReportsNewStatus:
    HELD = RunnerStatus(version="1.0", capacity=2, repositories=(REPOSITORY,), sessions=1)

    @pytest.mark.parametrize(
        ("reported", "new"),
        [
            pytest.param(HELD, False, id="the-same"),
            pytest.param(RunnerStatus(**{**HELD.__dict__, "version": "1.1"}), True, id="version"),
            pytest.param(RunnerStatus(**{**HELD.__dict__, "capacity": 3}), True, id="capacity"),
            pytest.param(
                RunnerStatus(**{**HELD.__dict__, "repositories": ()}), True, id="repositories"
            ),
            pytest.param(
                RunnerStatus(**{**HELD.__dict__, "workspace": True}), True, id="workspace"
            ),
            pytest.param(RunnerStatus(**{**HELD.__dict__, "sessions": 0}), True, id="sessions"),
        ],
    )
    def test_only_a_difference_is_new(self, reported: RunnerStatus, new: bool) -> None:
        runner = _runner(version="1.0", capacity=2, sessions=1, last_seen_at=None)
        assert reports_new_status(runner, reported) is new


class TestWhyNot:
    @pytest.mark.parametrize(
        ("dispatch", "runner", "live", "reason"),
        [
            pytest.param(_dispatch("d"), _runner(), ["r-a"], None, id="eligible"),
            pytest.param(
                _dispatch("d", kind="deliver", runner_id="r-b"),
                _runner(),
                ["r-a", "r-b"],
                "session-on-another-runner",
                id="affinity-to-a-live-other-runner",
            ),
            pytest.param(
                _dispatch("d", kind="deliver", runner_id="r-b"),
                _runner(),
                ["r-a"],
                None,
                id="affinity-to-a-lost-runner-is-takeable",
            ),
            pytest.param(
                _dispatch("d", kind="deliver", runner_id="r-a"),
                _runner(),
                ["r-a"],
                None,
                id="affinity-to-this-runner",
            ),
            pytest.param(
                _dispatch("d"),
                _runner(sessions=1, capacity=1),
                ["r-a"],
                "runner-at-capacity",
                id="a-new-spawn-needs-a-free-slot",
            ),
            pytest.param(
                _dispatch("d"),
                _runner(sessions=1, capacity=2),
                ["r-a"],
                None,
                id="a-new-spawn-fits-a-free-slot",
            ),
            pytest.param(
                _dispatch("d", kind="deliver"),
                _runner(sessions=1, capacity=1),
                ["r-a"],
                None,
                id="capacity-does-not-hold-back-a-delivery",
            ),
            pytest.param(
                _dispatch("d", runner_id="r-a", resume=True),
                _runner(sessions=1, capacity=1),
                ["r-a"],
                None,
                id="capacity-does-not-hold-back-a-respawn-on-its-own-runner",
            ),
            pytest.param(
                _dispatch("d"),
                _runner(repositories=["octo/other"]),
                ["r-a"],
                "repository-not-served",
                id="repository-not-served",
            ),
            pytest.param(
                _dispatch("d"),
                _runner(repositories=["Octo/Widgets"]),
                ["r-a"],
                None,
                id="repository-names-compare-case-blind",
            ),
            pytest.param(
                _dispatch("d"),
                _runner(repositories=[], workspace=True),
                ["r-a"],
                None,
                id="a-workspace-serves-any-repository",
            ),
            pytest.param(
                _dispatch("d", labels={"os": "linux", "gpu": "yes"}),
                _runner(labels={"os": "linux", "gpu": "yes", "zone": "b"}),
                ["r-a"],
                None,
                id="every-label-matches",
            ),
            pytest.param(
                _dispatch("d", labels={"os": "linux", "gpu": "yes"}),
                _runner(labels={"os": "linux"}),
                ["r-a"],
                "labels-missing:gpu",
                id="labels-are-anded",
            ),
            pytest.param(
                _dispatch("d", labels={"os": "linux", "gpu": "yes"}),
                _runner(labels={"os": "mac", "gpu": "no"}),
                ["r-a"],
                "labels-missing:gpu,os",
                id="a-label-with-another-value-is-missing",
            ),
        ],
    )
    def test_reason(
        self,
        dispatch: DispatchRecord,
        runner: RunnerRecord,
        live: list[str],
        reason: str | None,
    ) -> None:
        assert why_not(dispatch, runner, live=live) == reason


class TestChooseDispatch:
    @pytest.mark.parametrize(
        ("candidates", "expected"),
        [
            pytest.param([], None, id="nothing-to-choose"),
            pytest.param([_dispatch("a"), _dispatch("b", work_item=ITEM_B)], "a", id="the-first"),
            pytest.param(
                [
                    _dispatch("theirs", kind="deliver", runner_id="r-b"),
                    _dispatch("elsewhere", work_item=ITEM_B, repository="octo/other"),
                    _dispatch("mine", work_item="github:octo/widgets#9"),
                ],
                "mine",
                id="skips-what-it-may-not-take",
            ),
            pytest.param(
                [_dispatch("theirs", kind="deliver", runner_id="r-b")],
                None,
                id="none-it-may-take",
            ),
        ],
    )
    def test_oldest_it_may_take(
        self, candidates: list[DispatchRecord], expected: str | None
    ) -> None:
        pick = choose_dispatch(candidates, _runner(), live=["r-a", "r-b"])
        assert (pick.dispatch_id if pick else None) == expected


class TestWaitingReasons:
    def test_without_a_live_runner_everything_waits_for_one(self) -> None:
        candidates = [_dispatch("a"), _dispatch("b", work_item=ITEM_B)]
        silent = _runner(last_seen_at=T0 - timedelta(hours=1))
        assert waiting_reasons(candidates, [silent], live=[]) == [
            Waiting("a", "no-live-runner"),
            Waiting("b", "no-live-runner"),
        ]

    def test_when_every_live_runner_refuses_the_first_ones_reason_is_given(self) -> None:
        runners = [
            _runner("r-a", repositories=["octo/other"]),
            _runner("r-b", labels={"gpu": "yes"}),
            _runner("r-gone"),
        ]
        gpu = _dispatch("gpu", labels={"gpu": "yes"})
        anywhere = _dispatch("anywhere", work_item=ITEM_B)
        assert waiting_reasons([gpu, anywhere], runners, live=["r-a", "r-b"]) == []
        needs_zone = _dispatch("zone", labels={"zone": "b"})
        assert waiting_reasons([needs_zone, anywhere], runners, live=["r-a", "r-b"]) == [
            Waiting("zone", "repository-not-served")
        ]

    def test_a_runner_serving_only_codex_is_never_given_claude_work_and_says_why(self) -> None:
        codex_only = _runner("r-a", harnesses=["codex"])
        claude = _dispatch("claude")
        codex = _dispatch("codex", work_item=ITEM_B, harness="codex")
        assert choose_dispatch([claude, codex], codex_only, live=["r-a"]) == codex
        assert waiting_reasons([claude], [codex_only], live=["r-a"]) == [
            Waiting("claude", "harness-missing:claude")
        ]
        # A runner that never said which harnesses it has (an older agent) takes any; a stop
        # needs no harness.
        assert choose_dispatch([claude], _runner("r-a"), live=["r-a"]) == claude
        stop = _dispatch("stop", kind="terminate", runner_id="r-a")
        assert choose_dispatch([stop], codex_only, live=["r-a"]) == stop

    def test_a_runner_that_is_not_live_is_not_asked(self) -> None:
        runners = [_runner("r-gone", repositories=["octo/other"]), _runner("r-b", capacity=0)]
        assert waiting_reasons([_dispatch("a")], runners, live=["r-b"]) == [
            Waiting("a", "runner-at-capacity")
        ]


class TestSessionLines:
    PR = "github:octo/widgets#9"

    def test_each_endpoint_of_a_work_item_has_its_own_head(self) -> None:
        own1 = _dispatch("own1", seq=1)
        pr2 = _dispatch("pr2", seq=2, endpoint=self.PR)
        own3 = _dispatch("own3", seq=3, kind="deliver")
        pr4 = _dispatch("pr4", seq=4, endpoint=self.PR, kind="deliver")
        heads = heads_of_line([pr4, own3, pr2, own1], now=T0)
        assert [d.dispatch_id for d in heads] == ["own1", "pr2"]
        later = heads_of_line([pr2, own3, pr4], now=T0)
        assert {d.dispatch_id for d in later} == {"pr2", "own3"}


class TestSessionSlots:
    def test_a_spawn_needs_a_slot_unless_its_endpoint_holds_one(self) -> None:
        runner = _runner(capacity=2, sessions=0)  # its heartbeat's count is not used
        spawn = _dispatch("s", work_item=ITEM_B, endpoint=ITEM_B)
        assert why_not(spawn, runner, live=["r-a"], holding=[ITEM_A]) is None
        assert why_not(spawn, runner, live=["r-a"], holding=[ITEM_A, "x"]) == "runner-at-capacity"
        held = _dispatch("s", work_item=ITEM_A, endpoint=ITEM_A, runner_id="r-a")
        assert why_not(held, runner, live=["r-a"], holding=[ITEM_A, "x"]) is None

    def test_a_respawn_pinned_to_the_runner_needs_a_slot_too(self) -> None:
        runner = _runner(capacity=1)
        respawn = _dispatch("s", runner_id="r-a", resume=True)
        assert why_not(respawn, runner, live=["r-a"], holding=["other"]) == "runner-at-capacity"
        deliver = _dispatch("d", runner_id="r-a", kind="deliver")
        assert why_not(deliver, runner, live=["r-a"], holding=["other"]) is None

    def test_the_operators_view_counts_the_same_slots(self) -> None:
        runner = _runner(capacity=1)
        spawn = _dispatch("s")
        waits = waiting_reasons([spawn], [runner], live=["r-a"], holding={"r-a": ["other"]})
        assert waits == [Waiting("s", "runner-at-capacity")]
