"""The WorkItemStore contract: work items and dispatches, SQLite and Firestore alike."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from looprelay.core.model import (
    DISPATCH_OPEN,
    CommandLog,
    DispatchRecord,
    GraphRecord,
    SessionRecord,
    WorkItemRecord,
)
from looprelay.ports import SessionSlot, WorkItemStore

T0 = datetime(2026, 11, 30, 12, 0, 0, 500000, tzinfo=UTC)
REF = "github:octo/demo#7"
PR = "github:octo/demo#9"


def _item(**changes: object) -> WorkItemRecord:
    base = WorkItemRecord(ref=REF, repository="octo/demo", number=7, updated_at=T0)
    return base.model_copy(update=changes)


def _dispatch(
    dispatch_id: str, seq: int, *, work_item: str = REF, **changes: object
) -> DispatchRecord:
    base = DispatchRecord(
        dispatch_id=dispatch_id,
        delivery_id=f"d-{dispatch_id}",
        work_item=work_item,
        endpoint=work_item,
        seq=seq,
        kind="deliver" if seq > 1 else "spawn",
        repository="octo/demo",
        session_name="loop-github_octo_demo_7",
        session_id="5f0c6a52-36a4-4d55-9a83-2d9f0b5a4e11",
        prompt=f"prompt {seq} ✓",
        labels={"os": "linux"},
        created_at=T0 + timedelta(seconds=seq),
        comment_id=1000 + seq,
        comment_kind="issue",
    )
    return base.model_copy(update=changes)


class TestWorkItems:
    def test_a_new_work_item_is_saved_with_version_one(
        self, work_item_store: WorkItemStore
    ) -> None:
        assert work_item_store.get_work_item(REF) is None
        assert work_item_store.save_work_item(_item(), expected_version=0)
        stored = work_item_store.get_work_item(REF)
        assert stored == _item(version=1)

    def test_many_work_items_are_read_at_once(self, work_item_store: WorkItemStore) -> None:
        """The lease desk reads every work item with an open dispatch on each poll; more than
        one batch of them (Firestore's adapter asks for 100 at a time) comes back whole, and
        a ref with no work item is left out rather than failing the rest."""
        saved = {}
        for number in range(1, 121):
            record = _item(ref=f"github:octo/demo#{number}", number=number)
            assert work_item_store.save_work_item(record, expected_version=0)
            saved[record.ref] = record.model_copy(update={"version": 1})
        wanted = [*saved, "github:octo/demo#999", "github:octo/demo#1"]

        assert work_item_store.get_work_items(wanted) == saved
        assert work_item_store.get_work_items([]) == {}
        assert work_item_store.get_work_items(["github:octo/demo#999"]) == {}
        # Read again after a save: the new version, never a copy kept from the last read.
        changed = saved["github:octo/demo#7"].model_copy(update={"checklist_comment_id": 4242})
        assert work_item_store.save_work_item(changed, expected_version=1)
        again = work_item_store.get_work_items(wanted)
        assert again["github:octo/demo#7"] == changed.model_copy(update={"version": 2})
        assert again["github:octo/demo#8"] == saved["github:octo/demo#8"]

    def test_the_listing_is_newest_decision_first_and_bounded(
        self, work_item_store: WorkItemStore
    ) -> None:
        """The status page lists the work items last decided on; one never decided on (no
        ``updated_at``) comes last."""
        for number, at in ((1, T0), (2, T0 + timedelta(minutes=5)), (3, None)):
            record = _item(ref=f"github:octo/demo#{number}", number=number, updated_at=at)
            assert work_item_store.save_work_item(record, expected_version=0)

        listed = [item.ref for item in work_item_store.list_work_items()]
        assert listed == ["github:octo/demo#2", "github:octo/demo#1", "github:octo/demo#3"]
        assert [item.number for item in work_item_store.list_work_items(limit=1)] == [2]

    def test_a_rich_record_round_trips(self, work_item_store: WorkItemStore) -> None:
        record = _item(
            control="started",
            pull_requests=[PR],
            checklist_comment_id=555,
            graph=GraphRecord(
                phases_selected=["plan"],
                phases_skipped=["review"],
                surface="work-item",
                session_per_pr="always",
                actor="octocat",
                at=T0,
                source="reply",
                notes=["n"],
            ),
            sessions={
                REF: SessionRecord(
                    endpoint=REF,
                    session_name="loop-x",
                    session_id="5f0c6a52-36a4-4d55-9a83-2d9f0b5a4e11",
                    harness="claude",
                    runner_kind="tmux",
                    interaction="work-item",
                    status="live",
                    runner_id="r-0000000000000001",
                    spawned_at=T0,
                )
            },
            next_seq=3,
            commands=[
                CommandLog(
                    command="start",
                    actor="octocat",
                    at=T0,
                    delivery_id="d1",
                    comment_id=12,
                    effect="spawn",
                )
            ],
        )
        assert work_item_store.save_work_item(record, expected_version=0)
        assert work_item_store.get_work_item(REF) == record.model_copy(update={"version": 1})

    def test_a_stale_version_is_refused_and_changes_nothing(
        self, work_item_store: WorkItemStore
    ) -> None:
        work_item_store.save_work_item(_item(), expected_version=0)
        assert work_item_store.save_work_item(_item(control="armed"), expected_version=1)
        assert not work_item_store.save_work_item(_item(control="stopped"), expected_version=1)
        assert not work_item_store.save_work_item(_item(control="stopped"), expected_version=0)
        stored = work_item_store.get_work_item(REF)
        assert stored is not None and (stored.control, stored.version) == ("armed", 2)

    def test_concurrent_savers_of_one_version_have_one_winner(
        self, work_item_store: WorkItemStore
    ) -> None:
        work_item_store.save_work_item(_item(), expected_version=0)
        wins: list[bool] = []
        barrier = threading.Barrier(3)

        def save(index: int) -> None:
            barrier.wait()
            wins.append(
                work_item_store.save_work_item(
                    _item(next_seq=index + 2),
                    expected_version=1,
                    dispatches=[_dispatch(f"race-{index}", 1)],
                )
            )

        threads = [threading.Thread(target=save, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(wins) == [False, False, True]
        assert len(work_item_store.list_dispatches()) == 1

    def test_a_pull_request_finds_the_work_item_it_is_linked_to(
        self, work_item_store: WorkItemStore
    ) -> None:
        work_item_store.save_work_item(_item(pull_requests=[PR]), expected_version=0)
        found = work_item_store.find_work_item_for_pull_request(PR)
        assert found is not None and found.ref == REF
        assert work_item_store.find_work_item_for_pull_request("github:octo/demo#10") is None


class TestDispatches:
    def test_dispatches_are_created_with_the_work_item_and_listed_in_order(
        self, work_item_store: WorkItemStore
    ) -> None:
        assert work_item_store.save_work_item(
            _item(next_seq=3), expected_version=0, dispatches=[_dispatch("b", 2), _dispatch("a", 1)]
        )
        listed = work_item_store.list_dispatches()
        assert [d.dispatch_id for d in listed] == ["a", "b"]
        assert listed[0] == _dispatch("a", 1)
        assert work_item_store.get_dispatch("b") == _dispatch("b", 2)
        assert work_item_store.get_dispatch("zzz") is None

    def test_a_refused_save_creates_no_dispatch(self, work_item_store: WorkItemStore) -> None:
        work_item_store.save_work_item(_item(), expected_version=0)
        assert not work_item_store.save_work_item(
            _item(), expected_version=7, dispatches=[_dispatch("lost", 1)]
        )
        assert work_item_store.get_dispatch("lost") is None

    def test_an_existing_dispatch_id_is_left_as_it_was(
        self, work_item_store: WorkItemStore
    ) -> None:
        work_item_store.save_work_item(_item(), expected_version=0, dispatches=[_dispatch("a", 1)])
        assert work_item_store.save_work_item(
            _item(), expected_version=1, dispatches=[_dispatch("a", 1, prompt="other")]
        )
        stored = work_item_store.get_dispatch("a")
        assert stored is not None and stored.prompt == "prompt 1 ✓"

    def test_a_held_dispatch_is_replaced_by_the_save_that_resumes_it(
        self, work_item_store: WorkItemStore
    ) -> None:
        held = [_dispatch(f"h{n}", n, status="held") for n in (1, 2)]
        work_item_store.save_work_item(_item(), expected_version=0, dispatches=held)
        # Held: neither open nor a head, so no runner is offered it.
        assert work_item_store.list_dispatch_heads(statuses=DISPATCH_OPEN) == []
        assert [d.dispatch_id for d in work_item_store.list_dispatches(statuses=["held"])] == [
            "h1",
            "h2",
        ]
        released = [d.model_copy(update={"status": "pending"}) for d in held]
        assert work_item_store.save_work_item(_item(), expected_version=1, dispatches=released)
        [head] = work_item_store.list_dispatch_heads(statuses=DISPATCH_OPEN)
        assert head.dispatch_id == "h1"
        leased = work_item_store.lease_dispatch(
            "h1", runner_id="r1", now=T0, until=T0 + timedelta(minutes=1)
        )
        assert leased is not None and leased.status == "leased"
        # No longer held: a later save leaves it as it is.
        again = [d.model_copy(update={"status": "failed"}) for d in held]
        assert work_item_store.save_work_item(_item(), expected_version=2, dispatches=again)
        statuses = {d.dispatch_id: d.status for d in work_item_store.list_dispatches()}
        assert statuses == {"h1": "leased", "h2": "pending"}

    def test_filters(self, work_item_store: WorkItemStore) -> None:
        other = "github:octo/demo#8"
        work_item_store.save_work_item(_item(), expected_version=0, dispatches=[_dispatch("a", 1)])
        work_item_store.save_work_item(
            _item(ref=other, number=8),
            expected_version=0,
            dispatches=[_dispatch("b", 1, work_item=other)],
        )
        work_item_store.lease_dispatch("a", runner_id="r1", now=T0, until=T0 + timedelta(minutes=1))
        assert [d.dispatch_id for d in work_item_store.list_dispatches(statuses=["pending"])] == [
            "b"
        ]
        assert [
            d.dispatch_id for d in work_item_store.list_dispatches(statuses=["pending", "leased"])
        ] == ["a", "b"]
        assert [d.dispatch_id for d in work_item_store.list_dispatches(work_item=other)] == ["b"]
        assert work_item_store.list_dispatches(statuses=["succeeded"]) == []

    def test_heads_are_each_work_items_lowest_seq_among_the_statuses_asked_for(
        self, work_item_store: WorkItemStore
    ) -> None:
        other, third = "github:octo/demo#8", "github:octo/demo#6"
        work_item_store.save_work_item(
            _item(), expected_version=0, dispatches=[_dispatch(f"a{n}", n) for n in (3, 1, 2)]
        )
        work_item_store.save_work_item(
            _item(ref=other, number=8),
            expected_version=0,
            dispatches=[_dispatch(f"b{n}", n, work_item=other) for n in (1, 2)],
        )
        work_item_store.save_work_item(
            _item(ref=third, number=6),
            expected_version=0,
            dispatches=[_dispatch("c1", 1, work_item=third, created_at=T0)],
        )
        until = T0 + timedelta(minutes=1)
        work_item_store.lease_dispatch("a1", runner_id="r1", now=T0, until=until)
        work_item_store.finish_dispatch("b1", runner_id="r1", status="succeeded", result="", now=T0)
        # b1 was never leased, so it stays pending: lease and finish it properly.
        work_item_store.lease_dispatch("b1", runner_id="r1", now=T0, until=until)
        work_item_store.finish_dispatch("b1", runner_id="r1", status="succeeded", result="", now=T0)

        heads = work_item_store.list_dispatch_heads(statuses=["pending", "leased"])
        assert [d.dispatch_id for d in heads] == ["c1", "a1", "b2"]
        assert heads[1] == work_item_store.get_dispatch("a1")
        pending = work_item_store.list_dispatch_heads(statuses=["pending"])
        assert [d.dispatch_id for d in pending] == ["c1", "a2", "b2"]
        assert [
            d.dispatch_id
            for d in work_item_store.list_dispatch_heads(statuses=["pending"], limit=1)
        ] == ["c1"]
        assert work_item_store.list_dispatch_heads(statuses=["failed"]) == []

    def test_each_session_endpoint_of_a_work_item_has_a_head_of_its_own(
        self, work_item_store: WorkItemStore
    ) -> None:
        pr = "github:octo/demo#9"
        work_item_store.save_work_item(
            _item(),
            expected_version=0,
            dispatches=[
                _dispatch("own1", 1),
                _dispatch("pr2", 2, endpoint=pr),
                _dispatch("own3", 3),
                _dispatch("pr4", 4, endpoint=pr),
            ],
        )
        heads = work_item_store.list_dispatch_heads(statuses=["pending"])
        assert [d.dispatch_id for d in heads] == ["own1", "pr2"]


class TestLeases:
    def _seed(self, store: WorkItemStore) -> None:
        store.save_work_item(_item(), expected_version=0, dispatches=[_dispatch("a", 1)])

    def test_a_lease_goes_to_one_runner_until_it_lapses(
        self, work_item_store: WorkItemStore
    ) -> None:
        self._seed(work_item_store)
        until = T0 + timedelta(seconds=60)
        leased = work_item_store.lease_dispatch("a", runner_id="r1", now=T0, until=until)
        assert leased is not None
        assert (leased.status, leased.lease_holder, leased.lease_expires_at, leased.attempts) == (
            "leased",
            "r1",
            until,
            1,
        )
        assert work_item_store.lease_dispatch("a", runner_id="r2", now=T0, until=until) is None
        later = T0 + timedelta(seconds=61)
        taken = work_item_store.lease_dispatch(
            "a", runner_id="r2", now=later, until=later + timedelta(seconds=60)
        )
        assert taken is not None and (taken.lease_holder, taken.attempts) == ("r2", 2)

    def test_racing_runners_have_exactly_one_winner(self, work_item_store: WorkItemStore) -> None:
        self._seed(work_item_store)
        winners: list[str] = []
        barrier = threading.Barrier(4)

        def race(runner: str) -> None:
            barrier.wait()
            if work_item_store.lease_dispatch(
                "a", runner_id=runner, now=T0, until=T0 + timedelta(seconds=60)
            ):
                winners.append(runner)

        threads = [threading.Thread(target=race, args=(f"r{i}",)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(winners) == 1
        stored = work_item_store.get_dispatch("a")
        assert stored is not None and stored.lease_holder == winners[0]

    def test_only_the_holder_renews_and_finishes(self, work_item_store: WorkItemStore) -> None:
        self._seed(work_item_store)
        until = T0 + timedelta(seconds=60)
        work_item_store.lease_dispatch("a", runner_id="r1", now=T0, until=until)
        longer = T0 + timedelta(seconds=120)
        assert work_item_store.renew_lease("a", runner_id="r1", now=T0, until=longer)
        assert not work_item_store.renew_lease("a", runner_id="r2", now=T0, until=longer)
        assert not work_item_store.finish_dispatch(
            "a", runner_id="r2", status="succeeded", result="", now=T0
        )
        assert work_item_store.finish_dispatch(
            "a", runner_id="r1", status="succeeded", result="spawned", now=T0
        )
        stored = work_item_store.get_dispatch("a")
        assert stored is not None
        assert (stored.status, stored.result, stored.lease_expires_at) == (
            "succeeded",
            "spawned",
            None,
        )
        assert not work_item_store.renew_lease("a", runner_id="r1", now=T0, until=longer)
        assert work_item_store.lease_dispatch("a", runner_id="r1", now=longer, until=longer) is None

    def test_a_result_from_a_runner_whose_lease_passed_on_is_refused(
        self, work_item_store: WorkItemStore
    ) -> None:
        self._seed(work_item_store)
        work_item_store.lease_dispatch("a", runner_id="r1", now=T0, until=T0 + timedelta(seconds=1))
        later = T0 + timedelta(seconds=5)
        work_item_store.lease_dispatch(
            "a", runner_id="r2", now=later, until=later + timedelta(seconds=60)
        )
        assert not work_item_store.finish_dispatch(
            "a", runner_id="r1", status="succeeded", result="", now=later
        )
        assert work_item_store.finish_dispatch(
            "a", runner_id="r2", status="failed", result="harness-missing", now=later
        )

    def test_pending_again_offers_it_to_the_next_runner(
        self, work_item_store: WorkItemStore
    ) -> None:
        self._seed(work_item_store)
        work_item_store.lease_dispatch("a", runner_id="r1", now=T0, until=T0 + timedelta(hours=1))
        assert work_item_store.finish_dispatch(
            "a", runner_id="r1", status="pending", result="draining", now=T0
        )
        again = work_item_store.lease_dispatch(
            "a", runner_id="r2", now=T0, until=T0 + timedelta(seconds=60)
        )
        assert again is not None and again.attempts == 2 and again.result == "draining"

    def test_unknown_dispatches_cannot_be_leased(self, work_item_store: WorkItemStore) -> None:
        assert work_item_store.lease_dispatch("nope", runner_id="r1", now=T0, until=T0) is None
        assert not work_item_store.renew_lease("nope", runner_id="r1", now=T0, until=T0)
        assert not work_item_store.finish_dispatch(
            "nope", runner_id="r1", status="failed", result="", now=T0
        )


class TestSessionSlots:
    """A spawn's lease takes a slot of its runner in the same write, within its capacity."""

    def _seed_spawns(self, store: WorkItemStore, count: int) -> list[str]:
        refs = [f"github:octo/demo#{n}" for n in range(1, count + 1)]
        for n, ref in enumerate(refs, start=1):
            item = _item(ref=ref, number=n)
            store.save_work_item(
                item, expected_version=0, dispatches=[_dispatch(f"s{n}", 1, work_item=ref)]
            )
        return refs

    def _lease(
        self, store: WorkItemStore, n: int, ref: str, *, runner: str = "r1", capacity: int = 2
    ) -> bool:
        slot = SessionSlot(endpoint=ref, work_item=ref, capacity=capacity)
        until = T0 + timedelta(seconds=60)
        return (
            store.lease_dispatch(f"s{n}", runner_id=runner, now=T0, until=until, slot=slot)
            is not None
        )

    def test_spawns_past_the_capacity_are_refused_until_a_slot_is_freed(
        self, work_item_store: WorkItemStore
    ) -> None:
        refs = self._seed_spawns(work_item_store, 3)
        assert self._lease(work_item_store, 1, refs[0])
        assert self._lease(work_item_store, 2, refs[1])
        assert not self._lease(work_item_store, 3, refs[2])
        assert work_item_store.get_dispatch("s3").status == "pending"  # type: ignore[union-attr]
        assert work_item_store.held_sessions("r1") == {refs[0]: refs[0], refs[1]: refs[1]}
        assert work_item_store.release_session("r1", endpoint=refs[0])
        assert not work_item_store.release_session("r1", endpoint=refs[0])
        assert self._lease(work_item_store, 3, refs[2])
        assert set(work_item_store.held_sessions("r1")) == {refs[1], refs[2]}
        assert work_item_store.held_sessions("r2") == {}

    def test_racing_spawns_never_fill_a_runner_past_its_capacity(
        self, work_item_store: WorkItemStore
    ) -> None:
        refs = self._seed_spawns(work_item_store, 6)
        barrier = threading.Barrier(len(refs))
        won: list[int] = []

        def race(n: int) -> None:
            barrier.wait()
            if self._lease(work_item_store, n, refs[n - 1]):
                won.append(n)

        threads = [threading.Thread(target=race, args=(n,)) for n in range(1, len(refs) + 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 2
        assert len(work_item_store.held_sessions("r1")) == 2
