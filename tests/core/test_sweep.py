"""Which App deliveries the sweeper asks GitHub for again (judged per guid, oldest first), and
where the next sweep lists back to."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from looprelay.core.sweep import (
    LISTING_OVERLAP,
    REDELIVERY_WINDOW,
    deliveries_to_redeliver,
    failed_deliveries,
    listing_start,
    next_resume_point,
)
from looprelay.ports import AppDelivery

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _attempt(
    id: int,
    guid: str,
    *,
    status: int = 503,
    ago: timedelta = timedelta(minutes=5),
    redelivery: bool = False,
) -> AppDelivery:
    return AppDelivery(
        id=id,
        guid=guid,
        delivered_at=NOW - ago,
        status_code=status,
        redelivery=redelivery,
        event="issue_comment",
    )


def _pick(deliveries: list[AppDelivery], *, settled: frozenset[str] = frozenset()) -> list[int]:
    failed = failed_deliveries(deliveries, now=NOW, window=REDELIVERY_WINDOW)
    return [delivery.id for delivery in deliveries_to_redeliver(failed, settled_guids=settled)]


class TestFailedDeliveries:
    @pytest.mark.parametrize(
        ("status", "failed"),
        [
            (200, False),
            (201, False),
            (202, False),
            (204, False),
            (0, True),  # no answer within GitHub's 10 s
            (301, True),
            (400, True),
            (401, True),
            (413, True),
            (500, True),
            (502, True),
            (503, True),
        ],
    )
    def test_only_a_2xx_status_counts_as_delivered(self, status: int, failed: bool) -> None:
        assert _pick([_attempt(1, "g1", status=status)]) == ([1] if failed else [])

    def test_a_guid_whose_redelivery_succeeded_is_delivered(self) -> None:
        attempts = [
            _attempt(1, "g1", status=502, ago=timedelta(hours=2)),
            _attempt(2, "g1", status=202, ago=timedelta(hours=1), redelivery=True),
        ]

        assert _pick(attempts) == []

    def test_a_guid_delivered_once_stays_delivered_when_a_later_redelivery_fails(self) -> None:
        attempts = [
            _attempt(1, "g1", status=202, ago=timedelta(hours=2)),
            _attempt(2, "g1", status=503, ago=timedelta(hours=1), redelivery=True),
        ]

        assert _pick(attempts) == []

    def test_the_newest_attempt_of_a_failed_guid_is_the_one_picked(self) -> None:
        attempts = [
            _attempt(7, "g1", status=503, ago=timedelta(hours=1), redelivery=True),
            _attempt(3, "g1", status=0, ago=timedelta(hours=3)),
            _attempt(5, "g1", status=502, ago=timedelta(hours=2), redelivery=True),
        ]

        assert _pick(attempts) == [7]

    def test_attempts_of_the_same_second_are_ordered_by_id(self) -> None:
        attempts = [_attempt(9, "g1"), _attempt(8, "g1")]

        assert _pick(attempts) == [9]

    def test_the_newest_attempt_decides_the_window(self) -> None:
        attempts = [
            _attempt(1, "g1", ago=timedelta(days=4)),
            _attempt(2, "g1", ago=timedelta(days=2), redelivery=True),
        ]

        assert _pick(attempts) == [2]

    @pytest.mark.parametrize(
        ("ago", "picked"),
        [
            (timedelta(days=3, seconds=1), False),
            (timedelta(days=3), True),
            (timedelta(days=2, hours=23), True),
            (timedelta(seconds=-30), True),  # GitHub's clock a little ahead of ours
        ],
        ids=["past-the-window", "at-the-edge", "inside", "clock-skew"],
    )
    def test_only_attempts_within_three_days_count(self, ago: timedelta, picked: bool) -> None:
        assert _pick([_attempt(1, "g1", ago=ago)]) == ([1] if picked else [])

    def test_failed_ones_come_newest_first(self) -> None:
        attempts = [
            _attempt(1, "old", ago=timedelta(hours=5)),
            _attempt(3, "new", ago=timedelta(minutes=1)),
            _attempt(2, "mid", ago=timedelta(hours=1)),
            _attempt(4, "ok", status=200, ago=timedelta(seconds=10)),
        ]

        failed = failed_deliveries(attempts, now=NOW, window=REDELIVERY_WINDOW)

        assert [d.guid for d in failed] == ["new", "mid", "old"]

    def test_nothing_listed_means_nothing_failed(self) -> None:
        assert failed_deliveries([], now=NOW, window=REDELIVERY_WINDOW) == []

    def test_naive_times_are_refused(self) -> None:
        with pytest.raises(TypeError):
            failed_deliveries(
                [_attempt(1, "g1")], now=NOW.replace(tzinfo=None), window=REDELIVERY_WINDOW
            )


class TestDeliveriesToRedeliver:
    def test_a_guid_the_ledger_holds_is_left_alone(self) -> None:
        attempts = [_attempt(1, "held"), _attempt(2, "lost")]

        assert _pick(attempts, settled=frozenset({"held"})) == [2]

    def test_they_come_oldest_first(self) -> None:
        attempts = [_attempt(n, f"g{n}", ago=timedelta(minutes=60 - n)) for n in range(1, 5)]

        assert _pick(attempts, settled=frozenset({"g3"})) == [1, 2, 4]


SINCE = NOW - timedelta(minutes=15)


class TestResumePoint:
    def test_the_first_sweep_lists_githubs_whole_window(self) -> None:
        assert listing_start(None, now=NOW, window=REDELIVERY_WINDOW) == NOW - REDELIVERY_WINDOW

    def test_a_later_one_lists_back_to_the_resume_point(self) -> None:
        assert listing_start(SINCE, now=NOW, window=REDELIVERY_WINDOW) == SINCE

    def test_never_past_the_window(self) -> None:
        old = NOW - timedelta(days=5)

        assert listing_start(old, now=NOW, window=REDELIVERY_WINDOW) == NOW - REDELIVERY_WINDOW

    def test_all_done_moves_it_to_the_newest_attempt_seen_less_the_overlap(self) -> None:
        listed = [_attempt(2, "b", ago=timedelta(minutes=1)), _attempt(1, "a", status=202)]

        point = next_resume_point(start=SINCE, listed=listed, complete=True, unhandled=[])

        assert point == NOW - timedelta(minutes=1) - LISTING_OVERLAP

    def test_a_failure_not_asked_for_keeps_it_at_that_failure(self) -> None:
        left = [
            _attempt(3, "c", ago=timedelta(minutes=9)),
            _attempt(4, "d", ago=timedelta(minutes=4)),
        ]
        listed = [_attempt(5, "e", ago=timedelta(minutes=1)), *left]

        point = next_resume_point(start=SINCE, listed=listed, complete=True, unhandled=left)

        assert point == NOW - timedelta(minutes=9)

    def test_a_listing_cut_short_keeps_it_where_it_was(self) -> None:
        listed = [_attempt(5, "e", ago=timedelta(minutes=1))]

        point = next_resume_point(start=SINCE, listed=listed, complete=False, unhandled=[])

        assert point == SINCE

    def test_it_never_moves_back(self) -> None:
        listed = [_attempt(5, "e", ago=timedelta(minutes=16))]  # inside the overlap

        point = next_resume_point(start=SINCE, listed=listed, complete=True, unhandled=listed)

        assert point == SINCE

    def test_nothing_listed_keeps_it(self) -> None:
        assert next_resume_point(start=SINCE, listed=[], complete=True, unhandled=[]) == SINCE
