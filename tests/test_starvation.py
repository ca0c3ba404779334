"""No starved work: a backlog no runner can take never hides a dispatch one can, and that
backlog expires with an outcome the operator sees and can replay. On SQLite and on the
Firestore emulator (the ``stores`` fixture), through the real lease desk.

10,000 pending dispatches for a repository no runner serves, in 1,000 work items (more heads
than SQLite's query returns, more dispatches than Firestore's scan reads), then one for a
served repository.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from looprelay.config.model import RunnersConfig
from looprelay.core.model import DISPATCH_EXPIRED, DispatchRecord, RunnerRecord, WorkItemRecord
from looprelay.service.expiry import EXPIRED_EVENT, REPLAYED_EVENT, DispatchExpiry, replay_dispatch
from looprelay.service.lease_desk import LeaseDesk
from looprelay.service.results import Progress
from tests.rigs import Stores

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SERVED = "octo/Served"  # GitHub's case; the runner lists it in lower case
UNSERVED = "octo/retired"
BACKLOG_ITEMS = 1_000
PER_ITEM = 10
CONFIG = RunnersConfig(unserved_expiry_seconds=3600)


class Clock:
    def __init__(self) -> None:
        self.at = T0 + timedelta(minutes=5)

    def now(self) -> datetime:
        return self.at


def _dispatch(number: int, seq: int, repository: str, *, at: datetime) -> DispatchRecord:
    ref = f"github:{repository}#{number}"
    return DispatchRecord(
        dispatch_id=f"{repository.replace('/', '-')}-{number}-{seq}",
        delivery_id=f"d-{number}-{seq}",
        work_item=ref,
        endpoint=ref,
        seq=seq,
        kind="spawn" if seq == 1 else "deliver",
        repository=repository,
        session_name=f"loop-{number}",
        session_id="5f0c6a52-36a4-4d55-9a83-2d9f0b5a4e11",
        prompt="go",
        created_at=at,
    )


def _save(stores: Stores, number: int, repository: str, dispatches: list[DispatchRecord]) -> None:
    item = WorkItemRecord(
        ref=f"github:{repository}#{number}", repository=repository, number=number, updated_at=T0
    )
    assert stores.work_items.save_work_item(item, expected_version=0, dispatches=dispatches)


def _backlog(stores: Stores) -> None:
    for number in range(1, BACKLOG_ITEMS + 1):
        at = T0 + timedelta(milliseconds=number)
        batch = [_dispatch(number, seq, UNSERVED, at=at) for seq in range(1, PER_ITEM + 1)]
        _save(stores, number, UNSERVED, batch)


def _runner(stores: Stores, clock: Clock) -> RunnerRecord:
    runner = RunnerRecord(
        runner_id="r-served",
        name="served",
        secret_hash="x",
        registered_at=clock.now(),
        last_seen_at=clock.now(),
        repositories=[SERVED.lower()],
        capacity=4,
    )
    stores.registry.add_runner(runner)
    return runner


def _desk(stores: Stores, clock: Clock) -> LeaseDesk:
    progress = Progress(
        work_items=stores.work_items,
        store=stores.events,
        github=None,
        clock=clock,
        bot_logins=(),
        headless_replies=False,
    )
    return LeaseDesk(
        registry=stores.registry,
        work_items=stores.work_items,
        store=stores.events,
        clock=clock,
        config=CONFIG,
        progress=progress,
    )


class TestNoStarvation:
    def test_a_served_dispatch_is_leased_behind_10000_unservable_ones(self, stores: Stores) -> None:
        clock = Clock()
        _backlog(stores)
        served = _dispatch(1, 1, SERVED, at=T0 + timedelta(minutes=1))
        _save(stores, 1, SERVED, [served])
        runner = _runner(stores, clock)

        leased = _desk(stores, clock).try_lease(runner)

        assert leased is not None and leased.status == "leased"
        assert leased.dispatch_id == served.dispatch_id

    def test_the_unservable_backlog_expires_with_an_outcome_and_replays(
        self, stores: Stores
    ) -> None:
        clock = Clock()
        _save(
            stores,
            1,
            UNSERVED,
            [_dispatch(1, 1, UNSERVED, at=T0), _dispatch(1, 2, UNSERVED, at=T0)],
        )
        _save(stores, 2, SERVED, [_dispatch(2, 1, SERVED, at=T0)])
        expiry = DispatchExpiry(
            work_items=stores.work_items,
            registry=stores.registry,
            store=stores.events,
            clock=clock,
            config=CONFIG,
        )
        assert expiry.run() == []  # not an hour old yet
        clock.at = T0 + timedelta(hours=1, seconds=1)
        _runner(stores, clock)  # live now, serving octo/served only

        expired = expiry.run()

        assert sorted(d.dispatch_id for d in expired) == [
            "octo-retired-1-1",
            "octo-retired-1-2",
        ]
        stored = stores.work_items.get_dispatch("octo-retired-1-1")
        assert stored is not None
        assert (stored.status, stored.result) == ("failed", DISPATCH_EXPIRED)
        assert "no live runner serves octo/retired with claude after 3601 s" in stored.detail
        events = stores.events.list_events(name=EXPIRED_EVENT)
        assert {e.data["dispatch_id"] for e in events} == {"octo-retired-1-1", "octo-retired-1-2"}
        served = stores.work_items.get_dispatch("octo-Served-2-1")
        assert served is not None and served.status == "pending"

        replayed = replay_dispatch(
            stores.work_items, stores.events, "octo-retired-1-1", now=clock.at
        )

        assert replayed is not None and replayed.status == "pending"
        assert [e.name for e in stores.events.list_events(name=REPLAYED_EVENT)] == [REPLAYED_EVENT]
        assert (
            replay_dispatch(stores.work_items, stores.events, "octo-Served-2-1", now=clock.at)
            is None
        )

    def test_without_any_live_runner_nothing_is_served(self, stores: Stores) -> None:
        clock = Clock()
        _save(stores, 1, SERVED, [_dispatch(1, 1, SERVED, at=T0)])
        clock.at = T0 + timedelta(hours=2)
        expiry = DispatchExpiry(
            work_items=stores.work_items,
            registry=stores.registry,
            store=stores.events,
            clock=clock,
            config=CONFIG,
        )

        assert [d.dispatch_id for d in expiry.run()] == ["octo-Served-1-1"]


class TestCommandLine:
    def test_dispatches_replay_names_what_it_cannot_replay(self, tmp_path: Path) -> None:
        data = tmp_path / "data"
        data.mkdir(mode=0o700)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "looprelay.cli",
                "dispatches",
                "--data",
                str(data),
                "replay",
                "nope",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

        assert result.returncode == 1
        assert "dispatch nope is not expired" in result.stderr
