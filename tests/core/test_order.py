"""The key rule: every delivery is keyed by its receipt; new comments received close together
are put in the order GitHub created them, in the places they hold among the other events."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from looprelay.core.control import Keywords
from looprelay.core.envelope import Envelope, project_envelope
from looprelay.core.order import (
    COMMENT_WINDOW,
    MAX_COMMENT_RUN,
    OrderRules,
    Queued,
    arrange,
    may_go_ahead,
    order_group,
    order_key,
    queued,
    ready_at,
    runs,
    turns,
)
from tests.samples import payload

RECEIVED = datetime(2026, 5, 1, 12, 0, 30, 250_000, tzinfo=UTC)
MADE = datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC)


def _project(event: str, data: dict[str, Any], *, delivery_id: str = "d-1") -> Queued:
    envelope = project_envelope(
        event=event,
        delivery_id=delivery_id,
        payload=data,
        max_text_chars=1000,
        received_at=RECEIVED,
    )
    return queued(envelope, received_at=RECEIVED)


class TestOrderKey:
    def test_every_event_is_keyed_by_its_receipt_to_the_microsecond(self) -> None:
        comment = payload("issue_comment.created")
        comment["comment"]["created_at"] = "2026-05-01T11:00:00Z"  # an hour before: no matter
        for event, data in (
            ("issue_comment", comment),
            ("issues", payload("issues.labeled")),
            ("pull_request_review", payload("pull_request_review.submitted")),
            ("check_run", payload("check_run.completed")),
        ):
            assert _project(event, data).order_key == "2026-05-01T12:00:30.250000Z", event

    def test_without_a_receipt_a_delivery_is_unkeyed(self) -> None:
        envelope = project_envelope(
            event="issues", delivery_id="d-1", payload=payload("issues.labeled"), max_text_chars=9
        )
        assert envelope.order_key == ""

    def test_only_a_new_comment_carries_its_own_time_and_id(self) -> None:
        created = payload("issue_comment.created")
        created["comment"]["created_at"] = "2026-05-01T12:00:30Z"
        created["comment"]["id"] = 7
        assert _project("issue_comment", created).made == (MADE, 7)
        edited = payload("issue_comment.edited")
        assert _project("issue_comment", edited).made is None
        for broken in ("yesterday", 17, None, "0001-01-01T00:00:00+01:00"):
            created["comment"]["created_at"] = broken
            assert _project("issue_comment", created).made is None


def _event(name: str, at_ms: int) -> Queued:
    at = RECEIVED + timedelta(milliseconds=at_ms)
    return Queued(name, order_key(at), at)


def _comment(name: str, at_ms: int, *, made_s: int, comment_id: int) -> Queued:
    at = RECEIVED + timedelta(milliseconds=at_ms)
    return Queued(name, order_key(at), at, (MADE + timedelta(seconds=made_s), comment_id))


class TestArrange:
    def test_a_comment_made_after_a_label_change_comes_after_it(self) -> None:
        label = _event("label", 0)
        comment = _comment("comment", 300, made_s=0, comment_id=1)  # same GitHub second
        assert [q.delivery_id for q in arrange([comment, label])] == ["label", "comment"]

    def test_comments_received_close_together_go_in_creation_order_in_their_places(
        self,
    ) -> None:
        waiting = [
            _event("label", 0),
            _comment("c3", 10, made_s=0, comment_id=30),
            _event("review", 20),
            _comment("c1", 30, made_s=0, comment_id=10),
            _event("check", 40),
            _comment("c2", 50, made_s=0, comment_id=20),
        ]
        assert [q.delivery_id for q in arrange(waiting[::-1])] == [
            "label",
            "c1",
            "review",
            "c2",
            "check",
            "c3",
        ]

    def test_comments_further_apart_than_the_window_keep_their_receipt_order(self) -> None:
        apart = int(COMMENT_WINDOW.total_seconds() * 1000) + 1
        late_made_early = _comment("b", apart, made_s=0, comment_id=1)
        first = _comment("a", 0, made_s=1, comment_id=2)
        assert [q.delivery_id for q in arrange([late_made_early, first])] == ["a", "b"]

    def test_a_run_of_comments_is_ready_once_quiet_for_the_window_at_most_the_longest_run(
        self,
    ) -> None:
        step = int(COMMENT_WINDOW.total_seconds() * 1000) - 1
        stream = [_comment(f"c{n}", n * step, made_s=0, comment_id=n) for n in range(20)]
        waiting = [_event("label", 0), *stream[:3]]
        assert ready_at(waiting, 0) == RECEIVED  # not a comment: at once
        quiet = RECEIVED + timedelta(milliseconds=2 * step) + COMMENT_WINDOW
        assert [ready_at(waiting, place) for place in (1, 2, 3)] == [quiet] * 3
        longest = ready_at(arrange(stream), 0)
        assert longest == RECEIVED + MAX_COMMENT_RUN
        # A steady stream is cut into runs no longer than the longest run.
        per_run = int(MAX_COMMENT_RUN.total_seconds() * 1000) // step + 1
        lengths = [len(run) for run in runs(arrange(stream))]
        assert lengths[:-1] == [per_run] * (len(lengths) - 1) and sum(lengths) == len(stream)

    def test_a_run_is_quiet_only_a_window_after_its_latest_receipt_whatever_its_keys(
        self,
    ) -> None:
        # The webhook received c1 first (its key), but the queue brought it to the worker last:
        # the run is not quiet until a window after that.
        late = RECEIVED + timedelta(milliseconds=900)
        c1 = Queued("c1", order_key(RECEIVED), late, (MADE, 1))
        c2 = _comment("c2", 100, made_s=0, comment_id=2)
        c3 = _comment("c3", 200, made_s=0, comment_id=3)
        waiting = arrange([c3, c1, c2])
        assert [ready_at(waiting, place) for place in range(3)] == [late + COMMENT_WINDOW] * 3
        # A comment received within the window of c1's receipt still joins the run.
        c4 = _comment(
            "c4", 900 + int(COMMENT_WINDOW.total_seconds() * 1000), made_s=0, comment_id=0
        )
        assert [q.delivery_id for q in arrange([c3, c1, c2, c4])] == ["c4", "c1", "c2", "c3"]


class TestGoingAhead:
    NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    BOUND = timedelta(seconds=5)

    def test_only_a_delivery_failing_for_the_bound_is_gone_ahead_of(self) -> None:
        assert not may_go_ahead(None, now=self.NOW, bound=self.BOUND)  # waiting is no failure
        assert not may_go_ahead(self.NOW - timedelta(seconds=4.9), now=self.NOW, bound=self.BOUND)
        assert may_go_ahead(self.NOW - timedelta(seconds=5), now=self.NOW, bound=self.BOUND)


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


RULES = OrderRules(review_turns=True, keywords=Keywords.from_config({}))


def _review_part(
    event: str, delivery_id: str, at_ms: int, *, review_id: int = 900, body: str = "fix"
) -> Queued:
    at = RECEIVED + timedelta(milliseconds=at_ms)
    if event == "pull_request_review":
        data = payload("pull_request_review.submitted")
        data["review"]["id"] = review_id
        data["review"]["body"] = body
    else:
        data = payload("pull_request_review_comment.created")
        data["comment"]["id"] = at_ms + 1
        data["comment"]["pull_request_review_id"] = review_id
        data["comment"]["body"] = body
    envelope = project_envelope(
        event=event, delivery_id=delivery_id, payload=data, max_text_chars=1000, received_at=at
    )
    return queued(envelope, received_at=at, rules=RULES)


class TestTurns:
    def test_a_reviews_deliveries_are_one_turn_led_by_the_review(self) -> None:
        parts = [
            _review_part("pull_request_review_comment", "c2", 10),
            _review_part("pull_request_review", "review", 20),
            _review_part("pull_request_review_comment", "c1", 30),
        ]
        label = _event("label", 15)
        [turn, alone] = turns(arrange([*parts, label], RULES), RULES)

        assert turn.lead.delivery_id == "review"
        assert {q.delivery_id for q in turn.joined} == {"c1", "c2"}
        assert turn.ready_at == RECEIVED + timedelta(milliseconds=10) + RULES.turn_window
        assert alone.parts == (label,)  # received after the review's first part

    def test_a_part_naming_a_command_or_of_another_review_is_not_joined(self) -> None:
        parts = [
            _review_part("pull_request_review", "review", 0),
            _review_part("pull_request_review_comment", "stop", 5, body="the-loop stop"),
            _review_part("pull_request_review_comment", "other", 8, review_id=901),
        ]
        found = turns(arrange(parts, RULES), RULES)

        # Three turns, each in its place of creation order (the samples' times differ).
        assert sorted([q.delivery_id for q in turn.parts] for turn in found) == [
            ["other"],
            ["review"],
            ["stop"],
        ]

    def test_without_the_rules_nothing_is_joined(self) -> None:
        review = _review_part("pull_request_review", "review", 0)
        comment = _review_part("pull_request_review_comment", "c1", 5)
        plain = [replace(q, turn="") for q in (review, comment)]
        found = turns(arrange(plain))
        assert [len(turn.parts) for turn in found] == [1, 1]
        assert queued(_envelope_of_comment(), received_at=RECEIVED).turn == ""

    def test_a_burst_of_one_authors_comments_is_one_turn_when_asked(self) -> None:
        bursts = replace(RULES, comment_bursts=True)
        made = [_burst_comment(f"c{n}", n * 100, author="alice", rules=bursts) for n in range(3)]
        other = _burst_comment("bob", 350, author="bob", rules=bursts)
        found = turns(arrange([*made, other], bursts), bursts)

        assert [[q.delivery_id for q in turn.parts] for turn in found] == [
            ["c0", "c1", "c2"],
            ["bob"],
        ]
        assert [q.turn for q in made] == ["burst:alice"] * 3
        assert _burst_comment("x", 0, author="alice", rules=RULES).turn == ""  # off by default


def _envelope_of_comment() -> Envelope:
    return project_envelope(
        event="issue_comment",
        delivery_id="d",
        payload=payload("issue_comment.created"),
        max_text_chars=100,
        received_at=RECEIVED,
    )


def _burst_comment(delivery_id: str, at_ms: int, *, author: str, rules: OrderRules) -> Queued:
    at = RECEIVED + timedelta(milliseconds=at_ms)
    data = payload("issue_comment.created")
    data["comment"]["id"] = at_ms + 1
    data["comment"]["created_at"] = "2026-05-01T12:00:30Z"
    data["sender"]["login"] = author
    envelope = project_envelope(
        event="issue_comment",
        delivery_id=delivery_id,
        payload=data,
        max_text_chars=100,
        received_at=at,
    )
    return queued(envelope, received_at=at, rules=rules)
