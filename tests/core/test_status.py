"""The status view's builder and the retry of an interrupted dispatch: values in, values out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from looprelay.core.attach import attach_command, runner_socket
from looprelay.core.deliveries import build_delivery_page, fold_deliveries
from looprelay.core.model import (
    DeliveryRecord,
    DispatchRecord,
    EventRecord,
    RunnerRecord,
    SessionRecord,
    WorkItemRecord,
)
from looprelay.core.resend import resend
from looprelay.core.status import (
    AFTER_EARLIER,
    DETAIL_CHARS,
    StatusInputs,
    StatusView,
    build_status,
    explain_waits,
)

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
LOST_AFTER = timedelta(seconds=120)
REF = "github:octo/demo#7"


def _runner(runner_id: str, **changes: object) -> RunnerRecord:
    base = RunnerRecord(
        runner_id=runner_id,
        name=runner_id,
        secret_hash="h",
        registered_at=NOW - timedelta(days=1),
        last_seen_at=NOW - timedelta(seconds=5),
        repositories=["octo/demo"],
        capacity=2,
    )
    return base.model_copy(update=changes)


def _session(endpoint: str = REF, **changes: object) -> SessionRecord:
    base = SessionRecord(
        endpoint=endpoint,
        session_name="loop-octo-demo-7",
        session_id="s-7",
        harness="claude",
        runner_kind="tmux",
        interaction="work-item",
        status="live",
        runner_id="r-a",
    )
    return base.model_copy(update=changes)


def _item(*sessions: SessionRecord) -> WorkItemRecord:
    return WorkItemRecord(
        ref=REF,
        repository="octo/demo",
        number=7,
        sessions={s.endpoint: s for s in sessions},
        next_seq=5,
    )


def _dispatch(dispatch_id: str, seq: int, **changes: object) -> DispatchRecord:
    base = DispatchRecord(
        dispatch_id=dispatch_id,
        delivery_id=f"d-{seq}",
        work_item=REF,
        endpoint=REF,
        seq=seq,
        kind="deliver",
        repository="octo/demo",
        session_name="loop-octo-demo-7",
        session_id="s-7",
        prompt="the prompt",
        created_at=NOW - timedelta(minutes=seq),
    )
    return base.model_copy(update=changes)


def _view(**inputs: Any) -> StatusView:
    base: dict[str, Any] = {
        "runners": [],
        "work_items": [],
        "open_dispatches": [],
        "heads": [],
        "deliveries": [],
        "dead_letters": [],
        "failed_dispatches": [],
    }
    return build_status(StatusInputs(**(base | inputs)), now=NOW, lost_after=LOST_AFTER)


class TestRunners:
    @pytest.mark.parametrize(
        ("changes", "state"),
        [
            ({}, "live"),
            ({"last_seen_at": NOW - timedelta(minutes=10)}, "lost"),
            ({"revoked_at": NOW}, "revoked"),
        ],
    )
    def test_each_runner_is_live_lost_or_revoked(
        self, changes: dict[str, object], state: str
    ) -> None:
        view = _view(runners=[_runner("r-a", **changes)])
        assert [r.state for r in view.runners] == [state]


class TestSessions:
    def test_a_tmux_session_gets_the_attach_command_of_the_socket_it_reported(self) -> None:
        view = _view(work_items=[_item(_session(tmux_socket="my-socket"))])
        [row] = view.sessions
        assert row.attach == "tmux -L my-socket attach -t loop-octo-demo-7"

    def test_without_a_reported_socket_it_is_the_runners_default(self) -> None:
        view = _view(work_items=[_item(_session())], runners=[_runner("r-a", name="laptop")])
        [row] = view.sessions
        assert row.attach == attach_command(socket=runner_socket("r-a"), session="loop-octo-demo-7")
        assert row.runner == "laptop"

    @pytest.mark.parametrize(
        "changes",
        [
            {"runner_kind": "process"},
            {"status": "terminated"},
            {"status": "pending", "runner_id": None},
        ],
    )
    def test_no_attach_command_where_there_is_nothing_to_attach_to(
        self, changes: dict[str, object]
    ) -> None:
        view = _view(work_items=[_item(_session(**changes))])
        assert [row.attach for row in view.sessions] == [None]

    @pytest.mark.parametrize(
        ("changes", "activity"),
        [
            ({"activity": "pasted", "active_at": NOW - timedelta(minutes=2)}, "pasted 2 m ago"),
            (
                {"activity": "turn running", "active_at": NOW - timedelta(seconds=40)},
                "turn running 40 s",
            ),
            (
                {
                    "activity": "turn running",
                    "active_at": NOW - timedelta(hours=3),
                    "status": "lost",
                },
                "turn running 3 h ago",
            ),
            ({"activity": "asked", "active_at": NOW - timedelta(days=2)}, "asked 2 d ago"),
            ({}, ""),
        ],
    )
    def test_each_says_what_it_last_did_and_when(
        self, changes: dict[str, object], activity: str
    ) -> None:
        view = _view(work_items=[_item(_session(**changes))])
        assert [row.activity for row in view.sessions] == [activity]

    def test_a_live_session_that_asked_awaits_input_and_still_counts_live(self) -> None:
        view = _view(work_items=[_item(_session(awaiting_input_at=NOW))])
        [row] = view.sessions
        assert (row.state, row.awaiting_input_since, view.totals.sessions_live) == (
            "awaiting-input",
            NOW,
            1,
        )

    def test_the_work_item_and_endpoint_link_to_github(self) -> None:
        [row] = _view(work_items=[_item(_session())]).sessions
        assert row.work_item_url == row.endpoint_url == "https://github.com/octo/demo/issues/7"


class TestDeliveries:
    def _delivery(self, delivery_id: str, group: str, minutes: int) -> DeliveryRecord:
        return DeliveryRecord(
            delivery_id=delivery_id,
            event="issue_comment",
            received_at=NOW - timedelta(minutes=minutes),
            order_group=group,
        )

    def test_they_fold_by_issue_the_newest_group_first(self) -> None:
        records = [
            self._delivery("d-3", "octo/demo#7", 1),
            self._delivery("d-2", "", 2),
            self._delivery("d-1", "octo/demo#7", 3),
        ]
        folds = fold_deliveries(_view(deliveries=records).deliveries)
        assert [(f.subject, f.url, [d.delivery_id for d in f.deliveries]) for f in folds] == [
            ("octo/demo#7", "https://github.com/octo/demo/issues/7", ["d-3", "d-1"]),
            ("", "", ["d-2"]),
        ]

    def test_a_deliverys_page_lists_its_events_fields_on_one_short_line_each(self) -> None:
        events = [
            EventRecord(name="delivery.received", at=NOW, delivery_id="d-1"),
            EventRecord(
                name="dispatch.failed",
                at=NOW,
                delivery_id="d-1",
                data={"detail": "line\n" * 500, "attempts": 3, "labels": ["a"]},
            ),
        ]
        page = build_delivery_page(self._delivery("d-1", "octo/demo#7", 1), events, now=NOW)
        assert page.delivery.subject_url == "https://github.com/octo/demo/issues/7"
        assert [e.name for e in page.events] == ["delivery.received", "dispatch.failed"]
        data = page.events[1].data
        assert (data["attempts"], data["labels"]) == ("3", '["a"]')
        assert "\n" not in data["detail"] and len(data["detail"]) == DETAIL_CHARS


class TestWaits:
    def test_a_dispatch_behind_its_work_items_head_says_so(self) -> None:
        head, behind = _dispatch("dp-1", 1), _dispatch("dp-2", 2)
        waits = explain_waits([head, behind], [head], [], live=[])
        assert waits == {"dp-1": "no-live-runner", "dp-2": AFTER_EARLIER}

    def test_a_head_a_live_runner_may_take_does_not_wait(self) -> None:
        head = _dispatch("dp-1", 1)
        assert explain_waits([head], [head], [_runner("r-a")], live=["r-a"]) == {}


class TestReplays:
    def test_dead_letters_and_interrupted_dispatches_carry_their_commands(self) -> None:
        dead = DeliveryRecord(
            delivery_id="d-dead",
            event="issues",
            outcome="failed",
            detail="x" * 500 + "\nsecond line",
            received_at=NOW,
        )
        cut = _dispatch("dp-cut", 3, status="failed", result="interrupted")
        other = _dispatch("dp-other", 4, status="failed", result="session-missing")
        view = _view(
            dead_letters=[dead],
            failed_dispatches=[cut, other],
            command_args=["--data", "/srv/my data"],
        )
        rows = {r.id: r for r in view.replays}
        assert set(rows) == {"d-dead", "dp-cut"}
        assert rows["d-dead"].command == "looprelay deliveries replay d-dead --data '/srv/my data'"
        assert rows["dp-cut"].command == "looprelay dispatches resend dp-cut --data '/srv/my data'"
        assert len(rows["d-dead"].detail) == DETAIL_CHARS and "\n" not in rows["d-dead"].detail


class TestResend:
    def test_it_is_a_new_pending_dispatch_last_in_line_on_the_sessions_runner(self) -> None:
        cut = _dispatch(
            "dp-cut",
            3,
            status="failed",
            result="interrupted",
            lease_holder="r-old",
            attempts=2,
            runner_id="r-old",
        )
        item = _item(_session(runner_id="r-a"))

        updated, retried = resend(cut, item, now=NOW)

        assert updated.next_seq == item.next_seq + 1
        assert retried.dispatch_id != cut.dispatch_id
        assert (retried.seq, retried.status, retried.attempts) == (item.next_seq, "pending", 0)
        assert (retried.runner_id, retried.lease_holder, retried.result) == ("r-a", None, "")
        assert (retried.prompt, retried.kind, retried.created_at) == (cut.prompt, cut.kind, NOW)
        assert resend(cut, item, now=NOW)[1].dispatch_id == retried.dispatch_id

    @pytest.mark.parametrize(
        ("dispatch", "session", "message"),
        [
            (_dispatch("dp-ok", 1, status="succeeded"), _session(), "not interrupted"),
            (_dispatch("dp-f", 1, status="failed", result="x"), _session(), "not interrupted"),
            (
                _dispatch("dp-cut", 1, status="failed", result="interrupted"),
                _session(status="cleaned"),
                "has ended",
            ),
        ],
    )
    def test_only_an_interrupted_one_with_a_session_is_sent_again(
        self, dispatch: DispatchRecord, session: SessionRecord, message: str
    ) -> None:
        with pytest.raises(ValueError, match=message):
            resend(dispatch, _item(session), now=NOW)
