"""The Store contract: every adapter (SQLite, Firestore) must pass the same cases."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from looprelay.core.model import DeliveryRecord, EventRecord, InboxRecord
from looprelay.ports import Store
from looprelay.service.follow import follow

T0 = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)


def _record(delivery_id: str, *, at: datetime = T0, event: str = "issue_comment") -> DeliveryRecord:
    return DeliveryRecord(
        delivery_id=delivery_id,
        event=event,
        action="created",
        received_at=at,
        envelope=f'{{"delivery_id": "{delivery_id}"}}',
    )


class TestDeliveryLedger:
    def test_first_begin_creates_a_received_record(self, store: Store) -> None:
        stored, created = store.begin_delivery(_record("d-1"))
        assert created
        assert stored.outcome == "received" and not stored.settled
        assert stored.attempts == 1
        assert stored.received_at == T0
        assert stored.envelope == '{"delivery_id": "d-1"}'

    def test_second_begin_returns_the_existing_record_and_counts_the_attempt(
        self, store: Store
    ) -> None:
        store.begin_delivery(_record("d-1"))
        stored, created = store.begin_delivery(_record("d-1", at=T0 + timedelta(minutes=5)))
        assert not created
        assert stored.attempts == 2
        assert stored.received_at == T0

    def test_settle_moves_received_to_the_outcome_exactly_once(self, store: Store) -> None:
        store.begin_delivery(_record("d-1"))
        assert store.settle_delivery("d-1", outcome="ignored", detail="no router", at=T0)
        assert not store.settle_delivery("d-1", outcome="dispatched", detail="", at=T0)
        stored = store.get_delivery("d-1")
        assert stored is not None
        assert (stored.outcome, stored.detail, stored.settled_at) == ("ignored", "no router", T0)

    def test_the_settle_event_is_written_exactly_when_the_settle_wins(self, store: Store) -> None:
        store.begin_delivery(_record("d-1"))
        first = EventRecord(name="delivery.settled", at=T0, delivery_id="d-1", data={"n": 1})
        second = EventRecord(name="delivery.settled", at=T0, delivery_id="d-1", data={"n": 2})
        assert store.settle_delivery("d-1", outcome="ignored", detail="", at=T0, event=first)
        assert not store.settle_delivery("d-1", outcome="failed", detail="", at=T0, event=second)
        assert [e.data for e in store.list_events(delivery_id="d-1")] == [{"n": 1}]

    def test_the_received_event_is_written_only_by_the_begin_that_creates_the_record(
        self, store: Store
    ) -> None:
        def received(n: int) -> EventRecord:
            return EventRecord(name="delivery.received", at=T0, delivery_id="d-1", data={"n": n})

        assert store.begin_delivery(_record("d-1"), event=received(1))[1]
        assert not store.begin_delivery(_record("d-1"), event=received(2))[1]
        assert [e.data for e in store.list_events(delivery_id="d-1")] == [{"n": 1}]

    def test_begin_after_settle_changes_nothing(self, store: Store) -> None:
        store.begin_delivery(_record("d-1"))
        store.settle_delivery("d-1", outcome="dispatched", detail="", at=T0)
        stored, created = store.begin_delivery(_record("d-1"))
        assert not created
        assert stored.outcome == "dispatched"
        assert stored.attempts == 1

    def test_settle_of_an_unknown_delivery_is_refused(self, store: Store) -> None:
        assert not store.settle_delivery("nope", outcome="ignored", detail="", at=T0)
        assert store.get_delivery("nope") is None

    @pytest.mark.parametrize("outcome", ["received", "refused:", "exploded", ""])
    def test_settle_rejects_outcomes_the_ledger_does_not_know(
        self, store: Store, outcome: str
    ) -> None:
        store.begin_delivery(_record("d-1"))
        with pytest.raises(ValueError, match="outcome"):
            store.settle_delivery("d-1", outcome=outcome, detail="", at=T0)
        stored = store.get_delivery("d-1")
        assert stored is not None and stored.outcome == "received"

    def test_refused_outcomes_carry_their_reason(self, store: Store) -> None:
        store.begin_delivery(_record("d-1"))
        store.settle_delivery("d-1", outcome="refused:unauthorized", detail="mallory", at=T0)
        stored = store.get_delivery("d-1")
        assert stored is not None and stored.outcome == "refused:unauthorized"

    def test_concurrent_settles_have_exactly_one_winner(self, store: Store) -> None:
        store.begin_delivery(_record("d-race"))
        wins: list[bool] = []
        barrier = threading.Barrier(4)

        def settle(outcome: str) -> None:
            barrier.wait()
            wins.append(store.settle_delivery("d-race", outcome=outcome, detail="", at=T0))

        threads = [
            threading.Thread(target=settle, args=(o,))
            for o in ("dispatched", "ignored", "failed", "refused:x")
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(wins) == [False, False, False, True]

    def test_concurrent_begins_create_once(self, store: Store) -> None:
        created: list[bool] = []
        barrier = threading.Barrier(4)

        def begin() -> None:
            barrier.wait()
            created.append(store.begin_delivery(_record("d-race"))[1])

        threads = [threading.Thread(target=begin) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(created) == [False, False, False, True]

    def test_reopen_puts_only_failed_deliveries_back(self, store: Store) -> None:
        store.begin_delivery(_record("ok"))
        store.settle_delivery("ok", outcome="dispatched", detail="", at=T0)
        store.begin_delivery(_record("bad"))
        store.settle_delivery("bad", outcome="failed", detail="boom", at=T0)
        later = T0 + timedelta(hours=1)
        assert not store.reopen_delivery("ok")
        assert store.reopen_delivery("bad")
        assert not store.reopen_delivery("missing")
        reopened = store.get_delivery("bad")
        assert reopened is not None
        # When GitHub delivered it stays on record: a replay is not a new delivery.
        assert (reopened.outcome, reopened.settled_at) == ("received", None)
        assert reopened.received_at == _record("bad").received_at
        assert store.settle_delivery("bad", outcome="dispatched", detail="", at=later)

    def test_list_is_newest_first_and_filters_by_outcome(self, store: Store) -> None:
        outcomes = ["dispatched", "failed", "refused:a", "refused:b", "ignored", "ignored:event"]
        for index, outcome in enumerate(outcomes):
            delivery_id = f"d-{index}"
            store.begin_delivery(_record(delivery_id, at=T0 + timedelta(seconds=index)))
            store.settle_delivery(delivery_id, outcome=outcome, detail="", at=T0)
        store.begin_delivery(_record("d-open", at=T0 + timedelta(seconds=10)))
        everything = [r.delivery_id for r in store.list_deliveries()]
        assert everything == ["d-open", "d-5", "d-4", "d-3", "d-2", "d-1", "d-0"]
        assert [r.delivery_id for r in store.list_deliveries(outcome="failed")] == ["d-1"]
        assert [r.delivery_id for r in store.list_deliveries(outcome="refused")] == ["d-3", "d-2"]
        assert [r.delivery_id for r in store.list_deliveries(outcome="ignored")] == ["d-5", "d-4"]
        ignored_event = store.list_deliveries(outcome="ignored:event")
        assert [r.delivery_id for r in ignored_event] == ["d-5"]
        assert [r.delivery_id for r in store.list_deliveries(outcome="received")] == ["d-open"]
        assert len(store.list_deliveries(limit=2)) == 2


class TestInbox:
    GROUP = "octo/repo#7"
    LEASE = timedelta(seconds=30)

    def _begin(self, store: Store, delivery_id: str, key: str, *, at: datetime = T0) -> None:
        record = _record(delivery_id, at=at).model_copy(
            update={"order_group": self.GROUP, "order_key": key}
        )
        store.begin_delivery(record)

    def _take(self, store: Store, holder: str, *, now: datetime = T0) -> InboxRecord | None:
        return store.take_inbox(self.GROUP, holder=holder, now=now, until=now + self.LEASE)

    def test_the_inbox_lists_the_groups_unsettled_ones_from_a_key_smallest_first(
        self, store: Store
    ) -> None:
        self._begin(store, "d-3", "k3")
        self._begin(store, "d-1", "k1")
        self._begin(store, "d-2", "k2")
        self._begin(store, "d-old", "k0")
        store.begin_delivery(
            _record("d-other").model_copy(update={"order_group": "octo/repo#8", "order_key": "k1"})
        )
        store.settle_delivery("d-2", outcome="dispatched", detail="", at=T0)
        listed = store.list_inbox(self.GROUP, from_key="k1")
        assert [(r.delivery_id, r.order_key) for r in listed] == [("d-1", "k1"), ("d-3", "k3")]
        assert listed[0].order_group == self.GROUP
        assert [r.delivery_id for r in store.list_inbox(self.GROUP, from_key="k", limit=2)] == [
            "d-old",
            "d-1",
        ]

    def test_one_holder_at_a_time_and_a_refused_take_is_counted_as_a_knock(
        self, store: Store
    ) -> None:
        taken = self._take(store, "a")
        assert taken is not None and (taken.holder, taken.knocks) == ("a", 0)
        assert self._take(store, "b") is None
        assert self._take(store, "b") is None
        again = self._take(store, "a")
        assert again is not None and again.knocks == 2

    def test_a_release_fails_while_knocks_came_since_the_holder_looked(self, store: Store) -> None:
        taken = self._take(store, "a")
        assert taken is not None
        assert self._take(store, "b") is None
        assert not store.release_inbox(taken)
        fresh = self._take(store, "a")
        assert fresh is not None and fresh.knocks == 1
        done = fresh.model_copy(update={"drained_key": "k9", "stuck": "d-4", "stuck_since": T0})
        assert store.release_inbox(done)
        after = self._take(store, "b")
        assert after is not None
        assert (after.holder, after.drained_key, after.stuck, after.stuck_since) == (
            "b",
            "k9",
            "d-4",
            T0,
        )

    def test_a_lapsed_lease_passes_on_and_the_old_holder_can_keep_nothing(
        self, store: Store
    ) -> None:
        old = self._take(store, "a")
        assert old is not None
        assert self._take(store, "b", now=T0 + self.LEASE / 2) is None
        later = T0 + self.LEASE + timedelta(seconds=1)
        new = self._take(store, "b", now=later)
        assert new is not None and new.holder == "b"
        assert store.keep_inbox(old, until=later + self.LEASE) is None
        assert not store.release_inbox(old)
        kept = store.keep_inbox(
            new.model_copy(update={"drained_key": "k5"}), until=later + self.LEASE
        )
        assert kept is not None and (kept.holder, kept.drained_key) == ("b", "k5")
        assert kept.until == later + self.LEASE

    def test_freeing_every_inbox_lets_anyone_take_it_its_state_kept(self, store: Store) -> None:
        held = self._take(store, "dead")
        assert held is not None
        assert store.keep_inbox(
            held.model_copy(update={"drained_key": "k3"}), until=T0 + self.LEASE
        )
        assert store.free_inboxes() == 1
        assert store.free_inboxes() == 0
        taken = self._take(store, "alive")
        assert taken is not None and (taken.holder, taken.drained_key) == ("alive", "k3")

    def test_of_racing_takers_exactly_one_holds_the_inbox(self, store: Store) -> None:
        holders = [f"h{index}" for index in range(8)]
        barrier = threading.Barrier(len(holders))
        won: list[str] = []

        def take(holder: str) -> None:
            barrier.wait()
            if self._take(store, holder) is not None:
                won.append(holder)

        threads = [threading.Thread(target=take, args=(h,)) for h in holders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 1
        [winner] = won
        fresh = self._take(store, winner)
        assert fresh is not None and fresh.knocks == len(holders) - 1


class TestEventLog:
    def test_events_come_back_in_the_order_written_with_their_data(self, store: Store) -> None:
        store.append_event(EventRecord(name="b", at=T0 + timedelta(seconds=1), delivery_id="d1"))
        store.append_event(
            EventRecord(
                name="a",
                at=T0,
                delivery_id="d1",
                work_item="github:o/r#1",
                data={"reason": "unauthorized", "n": 3, "nested": {"ok": True}},
            )
        )
        events = store.list_events()
        assert [e.name for e in events] == ["b", "a"]  # written in that order, times aside
        assert events[1].data == {"reason": "unauthorized", "n": 3, "nested": {"ok": True}}
        assert events[1].work_item == "github:o/r#1"
        assert events[1].at == T0

    def test_filters_combine(self, store: Store) -> None:
        store.append_event(EventRecord(name="routing.dropped", at=T0, delivery_id="d1"))
        store.append_event(
            EventRecord(name="dispatch.queued", at=T0, delivery_id="d1", work_item="github:o/r#1")
        )
        store.append_event(
            EventRecord(name="dispatch.queued", at=T0, delivery_id="d2", work_item="github:o/r#2")
        )
        assert [e.delivery_id for e in store.list_events(name="dispatch.queued")] == ["d1", "d2"]
        assert [e.name for e in store.list_events(delivery_id="d1")] == [
            "routing.dropped",
            "dispatch.queued",
        ]
        assert [e.delivery_id for e in store.list_events(work_item="github:o/r#2")] == ["d2"]
        assert store.list_events(delivery_id="d2", name="routing.dropped") == []

    def test_after_lists_what_came_later_and_a_follower_sees_each_event_once(
        self, store: Store
    ) -> None:
        for second in range(3):
            store.append_event(EventRecord(name=f"e{second}", at=T0 + timedelta(seconds=second)))
        first = store.list_events(limit=1)
        assert [e.name for e in first] == ["e0"]
        later = store.list_events(after=first[0].cursor)
        # A store whose writers race may list again what came shortly before the cursor.
        assert [e.name for e in later if e.cursor != first[0].cursor] == ["e1", "e2"]
        assert _followed(store, limit=1000) == ["e0", "e1", "e2"]

    def test_a_follower_paging_through_a_burst_at_one_instant_misses_nothing(
        self, store: Store
    ) -> None:
        # The router writes several events with the same time; paging by time lost the ones
        # at a page's edge (a control.command went missing from `events --follow`).
        for n in range(7):
            store.append_event(EventRecord(name=f"burst-{n}", at=T0))
        seen = _followed(store, limit=3)
        assert sorted(seen) == sorted(f"burst-{n}" for n in range(7))
        assert len(seen) == 7

    def test_newest_takes_the_last_ones_oldest_first(self, store: Store) -> None:
        for second in range(5):
            store.append_event(EventRecord(name=f"e{second}", at=T0 + timedelta(seconds=second)))
        assert [e.name for e in store.list_events(newest=True, limit=2)] == ["e3", "e4"]
        assert store.list_events(newest=True, limit=1, name="e0")[0].name == "e0"

    def test_since_keeps_what_was_logged_from_then_on(self, store: Store) -> None:
        # As the product logs them: each event at the time it is written.
        store.append_event(EventRecord(name="before", at=datetime.now(UTC)))
        since = datetime.now(UTC) + timedelta(milliseconds=1)
        while datetime.now(UTC) < since:  # the next event is logged after ``since``
            time.sleep(0.001)
        store.append_event(EventRecord(name="after", at=datetime.now(UTC)))
        assert [e.name for e in store.list_events(since=since)] == ["after"]


def _followed(store: Store, *, limit: int) -> list[str]:
    """The names ``events --follow`` prints from the start of the log, until it is caught up
    (its first wait for more ends the follow)."""
    listing = partial(store.list_events, limit=limit)
    names: list[str] = []
    for batch in follow(listing, cursor=None, sleep=lambda _seconds: True):
        names += [event.name for event in batch]
    return names
