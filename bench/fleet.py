"""The runner API at fleet size (issue 22): what one instance spends per change, with 100,
1,000 and 10,000 simulated runners, the old design against the new one in the same run.

Three measurements, on Google's Firestore emulator (started here unless
``FIRESTORE_EMULATOR_HOST`` names one) and on SQLite for ``looprelay up``:

- ``listener``: the CPU one instance's listener spends per change to one runner (a heartbeat
  reporting a new status, written through the registry). **old**: a real-time listener on
  every runner not revoked (the runner directory this replaced: ``ListenedQuery`` on the
  runners, as it was). **new**: the runner changes feed (``FirestoreRunnerChanges``), its
  window seeded with the stamps a fleet of that size leaves in it (one change a runner-hour).
  CPU is the process's (every thread's, ``getrusage``) from the write to the push, less the
  same write with no listener open; reads are the listener's billed reads per change, plus,
  for the new design, the re-read of the runner on its next poll.
- ``cloud``: poll-to-lease latency with N simulated runners each waiting in a long poll
  (``app.longpoll.long_poll``) on one instance (the dispatch feed, the waker), each serving
  a repository of its own; a spawn for one runner's repository is saved by another client.
  **old**: the feed's push wakes every waiting poll (as before issue 22); **new**: it wakes
  the polls of the runners the push's dispatches are addressed to. Also the CPU per change
  (save to lease, and the other woken polls back waiting) and the instance's reads.
- ``up``: the same with SQLite and the waker rung as ``looprelay up``'s router rings it.
  **old**: polls not indexed by runner (every ring judges every runner's check); **new**:
  indexed.

Run: ``.venv/bin/python bench/fleet.py [--sizes 100,1000,10000] [--changes 10] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from storecount import OpCounts, count_client  # noqa: E402
from storeops import _emulator  # noqa: E402

from looprelay.config.model import Config  # noqa: E402
from looprelay.core.model import RunnerRecord  # noqa: E402
from looprelay.ports import RunnerStatus  # noqa: E402

PROJECT = "demo-looprelay"
BATCH = 500
"""Documents one seeding commit writes (Firestore's limit)."""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _runner(n: int, now: datetime) -> RunnerRecord:
    return RunnerRecord(
        runner_id=f"r-{n:016x}",
        name=f"fleet-{n}",
        secret_hash="a" * 64,
        registered_at=now,
        last_seen_at=now,
        repositories=[f"octo/r{n}"],
        capacity=2,
    )


def _seed_runners(client: Any, prefix: str, count: int) -> list[RunnerRecord]:
    """``count`` runner documents (and liveness documents), ``BATCH`` a commit."""
    now = datetime.now(UTC)
    runners = [_runner(n, now) for n in range(count)]
    for start in range(0, count, BATCH):
        batch = client.batch()
        for runner in runners[start : start + BATCH]:
            batch.set(
                client.collection(f"{prefix}runners").document(runner.runner_id),
                runner.model_dump(),
            )
            batch.set(
                client.collection(f"{prefix}runner_liveness").document(runner.runner_id),
                {"last_seen_at": now},
            )
        batch.commit()
    return runners


def _seed_stamps(client: Any, prefix: str, runners: list[RunnerRecord]) -> int:
    """The stamps a fleet of ``runners`` changing once a runner-hour leaves in a listener's
    window (its margin, its life and one bucket), in this bucket's documents; returns how
    many stamps."""
    from looprelay.adapters.firestore.runner_changes import (
        BUCKET_SECONDS,
        MARGIN_SECONDS,
        RENEW_SECONDS,
        stamp,
    )

    window = MARGIN_SECONDS + RENEW_SECONDS + BUCKET_SECONDS
    held = min(len(runners), round(len(runners) / 3600 * window))
    for start in range(0, held, BATCH):
        batch = client.batch()
        for runner in runners[start : start + held][:BATCH]:
            name, doc = stamp(runner.runner_id)
            batch.set(client.collection(f"{prefix}runner_changes").document(name), doc, merge=True)
        batch.commit()
    return held


@dataclass
class Heard:
    """Pushes a listener made, to wait on."""

    cond: threading.Condition
    count: int = 0

    def __call__(self, _changed: object) -> None:
        with self.cond:
            self.count += 1
            self.cond.notify_all()

    def wait_past(self, seen: int, seconds: float = 120.0) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.count > seen, seconds):
                raise RuntimeError("the listener never pushed")


def _changes_cpu(
    registry: Any, runners: list[RunnerRecord], changes: int, heard: Heard | None
) -> tuple[float, float]:
    """Mean process CPU and wall seconds per change of ``changes`` runners' status, each
    until ``heard`` pushed it (None: the write alone)."""
    cpu = wall = 0.0
    for n in range(changes):
        runner = runners[(n * 7919) % len(runners)]
        status = RunnerStatus(capacity=2, repositories=tuple(runner.repositories), sessions=1 + n)
        seen = heard.count if heard else 0
        c0, w0 = _cpu(), time.perf_counter()
        registry.record_heartbeat(runner.runner_id, at=datetime.now(UTC), status=status)
        if heard is not None:
            heard.wait_past(seen)
        cpu += _cpu() - c0
        wall += time.perf_counter() - w0
    return cpu / changes, wall / changes


def _listened(
    listener: Any,
    start: Callable[[], None],
    heard: Heard,
    measure: Callable[[], tuple[float, float]],
    changes: int,
) -> tuple[tuple[float, float], tuple[float, float], float]:
    """Start ``listener``: the CPU and wall seconds of its first push, what ``measure`` says
    of the changes, and the listener's billed reads per change; then close it."""
    c0, w0 = _cpu(), time.perf_counter()
    start()
    heard.wait_past(0)
    first = (_cpu() - c0, time.perf_counter() - w0)
    reads0 = listener.reads
    measured = measure()
    reads = (listener.reads - reads0) / changes
    listener.close()
    return first, measured, reads


def listener_row(count: int, changes: int) -> dict[str, Any]:
    """The ``listener`` measurement at ``count`` runners."""
    from google.cloud import firestore
    from google.cloud.firestore_v1.base_query import FieldFilter

    from looprelay.adapters.firestore.listener import ListenedQuery
    from looprelay.adapters.firestore.runner_changes import FirestoreRunnerChanges
    from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry, runner_from_document

    prefix = f"fleet{uuid.uuid4().hex[:8]}_"
    client, listening = firestore.Client(project=PROJECT), firestore.Client(project=PROJECT)
    t0 = time.perf_counter()
    runners = _seed_runners(client, prefix, count)
    window = _seed_stamps(client, prefix, runners)
    seeded = time.perf_counter() - t0
    registry = FirestoreRunnerRegistry(client, collection_prefix=prefix)
    base_cpu, base_wall = _changes_cpu(registry, runners, changes, None)

    heard = Heard(threading.Condition())
    old = ListenedQuery(
        listening.collection(f"{prefix}runners").where(
            filter=FieldFilter("revoked_at", "==", None)
        ),
        parse=runner_from_document,
        name="runner",
        fallback="(bench)",
        on_change=heard,
        check_seconds=0.1,
    )
    old_first, (old_cpu, old_wall), old_reads = _listened(
        old, old.start, heard, lambda: _changes_cpu(registry, runners, changes, heard), changes
    )
    heard = Heard(threading.Condition())
    new = FirestoreRunnerChanges(listening, collection_prefix=prefix, check_seconds=0.1)
    new_first, (new_cpu, new_wall), new_reads = _listened(
        new,
        lambda: new.start(heard),
        heard,
        lambda: _changes_cpu(registry, runners, changes, heard),
        changes,
    )

    # The new design's other read: the next poll of a changed runner reads it again.
    counts = OpCounts()
    count_client(client, counts)
    registry.get_runner(runners[0].runner_id)
    reread = counts.snapshot().get("doc.reads", 0)
    client.close()
    listening.close()
    return {
        "runners": count,
        "stamps in window": window,
        "seeded s": round(seeded, 2),
        "write alone ms": round(base_cpu * 1000, 2),
        "old first push cpu ms": round(old_first[0] * 1000, 1),
        "new first push cpu ms": round(new_first[0] * 1000, 1),
        "old cpu/change ms": round(max(old_cpu - base_cpu, 0.0) * 1000, 2),
        "new cpu/change ms": round(max(new_cpu - base_cpu, 0.0) * 1000, 2),
        "old push ms": round((old_wall - base_wall) * 1000, 1),
        "new push ms": round((new_wall - base_wall) * 1000, 1),
        "old reads/change": old_reads,
        "new reads/change": new_reads,
        "new re-read on next poll": reread,
    }


# -- poll to lease --------------------------------------------------------------------------


@contextmanager
def _old_waker() -> Iterator[None]:
    """The waker as before issue 22: no poll is indexed by its runner, so every ring judges
    every waiting runner's check."""
    from looprelay.service.waker import DispatchWaker

    original = DispatchWaker.wait_async

    async def unindexed(self: DispatchWaker, seconds: float, **kwargs: Any) -> Any:
        kwargs.pop("runner", None)
        return await original(self, seconds, **kwargs)

    DispatchWaker.wait_async = unindexed  # type: ignore[method-assign]
    try:
        yield
    finally:
        DispatchWaker.wait_async = original  # type: ignore[method-assign]


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def _poll_to_lease(
    desk: Any,
    runners: list[RunnerRecord],
    deliveries: int,
    save: Callable[[int, RunnerRecord], None],
    *,
    settle_pause: float,
) -> dict[str, float]:
    """Hold one long poll per runner; ``deliveries`` times save a spawn for one runner and
    time it to its lease. Returns latency percentiles and CPU per delivery."""
    from looprelay.app.asgi import Blocking
    from looprelay.app.longpoll import long_poll
    from looprelay.wire.runner_api import PollBody

    blocking = Blocking()
    body = PollBody(wait_seconds=600)
    polls = {
        r.runner_id: asyncio.ensure_future(long_poll(desk, r, body, blocking)) for r in runners
    }
    waker = desk.waker
    deadline = time.monotonic() + 600
    while waker.waiting() < len(runners):
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {waker.waiting()} of {len(runners)} polls wait")
        await asyncio.sleep(0.05)
    latencies, cpus = [], []
    for n in range(deliveries):
        target = runners[(n * 7919 + 1) % len(runners)]
        c0, w0 = _cpu(), time.perf_counter()
        await asyncio.to_thread(save, n + 1, target)
        answer = await asyncio.wait_for(polls[target.runner_id], 120)
        latencies.append(time.perf_counter() - w0)
        if answer.status != 200:
            raise RuntimeError(f"the poll got {answer.status}")
        await asyncio.sleep(settle_pause)  # the push of the lease, which rings too
        while waker.waiting() < len(runners) - 1 - n:  # the other woken polls back waiting
            await asyncio.sleep(0.001)
        cpus.append(_cpu() - c0)
        polls.pop(target.runner_id)
    for poll in polls.values():
        poll.cancel()
    await asyncio.gather(*polls.values(), return_exceptions=True)
    return {
        "p50 ms": round(statistics.median(latencies) * 1000, 1),
        "p99 ms": round(_percentile(latencies, 0.99) * 1000, 1),
        "cpu/delivery ms": round(statistics.mean(cpus) * 1000, 1),
    }


def cloud_row(count: int, deliveries: int, old: bool) -> dict[str, Any]:
    """The ``cloud`` measurement at ``count`` runners, old or new ring."""
    from google.cloud import firestore

    from looprelay.adapters.clock import SystemClock
    from looprelay.adapters.firestore.dispatch_feed import FirestoreDispatchFeed
    from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry
    from looprelay.adapters.firestore.store import FirestoreStore
    from looprelay.adapters.firestore.work_items import FirestoreWorkItemStore
    from looprelay.app.services import build_runner_api
    from looprelay.service.waker import DispatchWaker

    prefix = f"fleet{uuid.uuid4().hex[:8]}_"
    config = Config.model_validate(
        {
            "store": {
                "backend": "firestore",
                "firestore": {"project": PROJECT, "collectionPrefix": prefix},
            },
            "runners": {"pollWaitSeconds": 600},
        }
    )
    counted, other, listening = (firestore.Client(project=PROJECT) for _ in range(3))
    counts = OpCounts()
    count_client(counted, counts)
    # The lease reads no runner document: the polls' runners need not be stored.
    runners = [_runner(n, datetime.now(UTC)) for n in range(count)]
    waker = DispatchWaker()
    ring = (lambda _heads, _freed: waker.notify()) if old else waker.notify
    feed = FirestoreDispatchFeed(
        listening, on_change=ring, collection_prefix=prefix, check_seconds=0.1
    )
    feed.start()
    while feed.open_dispatches() is None:
        time.sleep(0.05)
    api = build_runner_api(
        config,
        store=FirestoreStore(counted, collection_prefix=prefix),
        clock=SystemClock(),
        data_dir=None,
        github=None,
        waker=waker,
        work_items=FirestoreWorkItemStore(counted, collection_prefix=prefix),
        runners=FirestoreRunnerRegistry(counted, collection_prefix=prefix),
        feed=feed,
    )
    saver = FirestoreWorkItemStore(other, collection_prefix=prefix)

    def save(number: int, runner: RunnerRecord) -> None:
        _save_spawn(saver, number, runner)

    before = counts.snapshot().get("doc.reads", 0)
    figures = _timed(api.desk, runners, deliveries, save, old=old, settle_pause=0.5)
    reads = (counts.snapshot().get("doc.reads", 0) - before) / deliveries
    feed.close()
    for client in (counted, other, listening):
        client.close()
    return {
        "runners": count,
        "design": "old" if old else "new",
        **figures,
        "reads/delivery": round(reads, 1),
    }


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _timed(
    desk: Any,
    runners: list[RunnerRecord],
    deliveries: int,
    save: Callable[[int, RunnerRecord], None],
    *,
    old: bool,
    settle_pause: float,
) -> dict[str, float]:
    """``_poll_to_lease`` with the old waker or the new one."""
    with _old_waker() if old else _nothing():
        poll = _poll_to_lease(desk, runners, deliveries, save, settle_pause=settle_pause)
        return asyncio.run(poll)


def _save_spawn(items: Any, number: int, runner: RunnerRecord) -> Any:
    """Save a spawn for work item ``number`` of ``runner``'s repository; return it."""
    from tests.dispatches import make_dispatch, save_with_own_session

    now = datetime.now(UTC)
    repo = runner.repositories[0]
    dispatch = make_dispatch(repository=repo, number=number, created_at=now)
    save_with_own_session(items, repository=repo, number=number, dispatches=[dispatch], now=now)
    return dispatch


def up_row(count: int, deliveries: int, old: bool) -> dict[str, Any]:
    """The ``up`` measurement at ``count`` runners: SQLite, the waker rung as the router
    rings it (with the saved dispatch)."""
    from looprelay.adapters.clock import SystemClock
    from looprelay.adapters.sqlite.runners import SqliteRunnerRegistry
    from looprelay.adapters.sqlite.store import SqliteStore
    from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore
    from looprelay.app.services import build_runner_api
    from looprelay.service.waker import DispatchWaker

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "looprelay.db"
        registry, items, store = (
            SqliteRunnerRegistry(path),
            SqliteWorkItemStore(path),
            SqliteStore(path),
        )
        # The lease reads no runner record: the polls' runners need not be stored.
        runners = [_runner(n, datetime.now(UTC)) for n in range(count)]
        waker = DispatchWaker()
        config = Config.model_validate({"runners": {"pollWaitSeconds": 600}})
        api = build_runner_api(
            config,
            store=store,
            clock=SystemClock(),
            data_dir=None,
            github=None,
            waker=waker,
            work_items=items,
            runners=registry,
        )

        def save(number: int, runner: RunnerRecord) -> None:
            # As the router rings it (``on_dispatch``).
            waker.notify([_save_spawn(items, number, runner)])

        figures = _timed(api.desk, runners, deliveries, save, old=old, settle_pause=0)
        for adapter in (registry, items, store):
            adapter.close()
    return {"runners": count, "design": "old" if old else "new", **figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--changes", type=int, default=10, help="changes timed per listener")
    parser.add_argument("--deliveries", type=int, default=20, help="deliveries timed per shape")
    parser.add_argument("--only", default="listener,cloud,up")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    only = set(args.only.split(","))
    rows: dict[str, list[dict[str, Any]]] = {"listener": [], "cloud": [], "up": []}
    with _emulator() as host:
        if host is None and only & {"listener", "cloud"}:
            print("the Firestore emulator is needed", file=sys.stderr)
            return 1
        for count in sizes:
            if "listener" in only:
                rows["listener"].append(listener_row(count, args.changes))
                _show("listener", rows["listener"][-1], args.json)
            for old in (True, False):
                # The old ring at 10,000 wakes 10,000 polls per delivery: fewer of them.
                n = max(3, args.deliveries // (10 if old and count >= 10_000 else 1))
                if "cloud" in only:
                    rows["cloud"].append(cloud_row(count, n, old))
                    _show("cloud", rows["cloud"][-1], args.json)
                if "up" in only:
                    rows["up"].append(up_row(count, n, old))
                    _show("up", rows["up"][-1], args.json)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


def _show(kind: str, row: dict[str, Any], quiet: bool) -> None:
    if not quiet:
        print(kind, " ".join(f"{k}={v}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
