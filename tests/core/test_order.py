"""The order key ingress stamps, the group it orders within, and when a delivery waits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from looprelay.core.envelope import project_envelope
from looprelay.core.order import Earlier, OrderVerdict, judge_order, order_group, order_key
from tests.samples import payload

RECEIVED = datetime(2026, 5, 1, 12, 0, 30, 250_000, tzinfo=UTC)


def _project(event: str, data: dict[str, object]) -> str:
    envelope = project_envelope(
        event=event, delivery_id="d-1", payload=data, max_text_chars=1000, received_at=RECEIVED
    )
    return envelope.order_key


class TestOrderKey:
    def test_a_new_comment_is_keyed_by_its_creation_time_then_its_id(self) -> None:
        data = payload("issue_comment.created")
        data["comment"]["created_at"] = "2026-05-01T12:00:00Z"
        data["comment"]["id"] = 7
        assert _project("issue_comment", data) == "2026-05-01T12:00:00.000000Z/" + "7".zfill(20)

    def test_comments_of_one_second_are_ordered_by_id_and_before_a_later_second(self) -> None:
        same_second = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
        keys = [
            order_key(same_second, 999),
            order_key(same_second, 1000),
            order_key(same_second + timedelta(seconds=1), 5),
        ]
        assert keys == sorted(keys)

    def test_an_edit_is_keyed_by_when_the_webhook_received_it(self) -> None:
        data = payload("issue_comment.edited")
        assert _project("issue_comment", data) == order_key(RECEIVED)

    def test_other_events_are_keyed_by_receipt_and_unkeyed_without_it(self) -> None:
        data = payload("issues.labeled")
        assert _project("issues", data) == order_key(RECEIVED)
        envelope = project_envelope(
            event="issues", delivery_id="d-1", payload=data, max_text_chars=1000
        )
        assert envelope.order_key == ""

    def test_a_creation_time_that_is_not_a_time_falls_back_to_receipt(self) -> None:
        data = payload("issue_comment.created")
        for broken in ("yesterday", 17, None, "0001-01-01T00:00:00+01:00"):
            data["comment"]["created_at"] = broken
            assert _project("issue_comment", data) == order_key(RECEIVED)


class TestOrderGroup:
    def test_the_group_is_the_issue_or_pull_request_in_lower_case(self) -> None:
        comment = project_envelope(
            event="issue_comment",
            delivery_id="d-1",
            payload=payload("issue_comment.created"),
            max_text_chars=1000,
        )
        assert order_group(comment) == "codertocat/hello-world#1"
        installation = project_envelope(
            event="installation",
            delivery_id="d-2",
            payload=payload("installation.created"),
            max_text_chars=1000,
        )
        assert order_group(installation) == ""


class TestJudgeOrder:
    NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    BOUND = timedelta(seconds=5)

    def test_nothing_earlier_goes_ahead_at_once(self) -> None:
        assert judge_order([], now=self.NOW, bound=self.BOUND) == OrderVerdict()

    def test_an_earlier_delivery_begun_within_the_bound_is_waited_for(self) -> None:
        earlier = [Earlier("d-1", self.NOW - timedelta(seconds=4.9))]
        assert judge_order(earlier, now=self.NOW, bound=self.BOUND) == OrderVerdict(
            wait_for=("d-1",)
        )

    def test_past_the_bound_it_is_gone_ahead_of_and_named(self) -> None:
        earlier = [
            Earlier("d-1", self.NOW - timedelta(seconds=9)),
            Earlier("d-2", self.NOW - timedelta(seconds=5)),
        ]
        assert judge_order(earlier, now=self.NOW, bound=self.BOUND) == OrderVerdict(
            skipped=("d-1", "d-2")
        )

    def test_one_recent_delivery_keeps_the_wait_even_beside_a_poison_one(self) -> None:
        earlier = [
            Earlier("d-1", self.NOW - timedelta(seconds=60)),
            Earlier("d-2", self.NOW - timedelta(seconds=1)),
        ]
        verdict = judge_order(earlier, now=self.NOW, bound=self.BOUND)
        assert verdict.wait_for == ("d-2",)
