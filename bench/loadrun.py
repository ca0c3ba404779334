"""The load driver shared by ``bench/load.py``, ``bench/e2e.py`` and ``tests/load/``.

On the rig of ``loadrig.py`` (``looprelay up`` and one runner agent), ``run_load`` sends a
bounded burst of signed ``issue_comment`` deliveries through a pool of keep-alive senders,
waits for the drain and checks that nothing was lost or applied twice.
"""

from __future__ import annotations

import http.client
import itertools
import json
import math
import re
import sqlite3
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loadrig import (  # noqa: E402
    AUTO_EXECUTE_LABEL,
    POLL_SECONDS,
    LoadError,
    Rig,
    peak_rss_kib,
    rig,
)

from looprelay.adapters.sqlite.store import SqliteStore  # noqa: E402
from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore  # noqa: E402
from looprelay.core.model import DispatchRecord  # noqa: E402
from looprelay.core.signature import sign_body  # noqa: E402
from looprelay.core.tasknames import task_name_prefix  # noqa: E402
from looprelay.datadir import QUEUE_FILE  # noqa: E402
from tests.fake_harness import FakeHarness  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "github" / "issue_comment.created.json"
EVENT = "issue_comment"
PASTE_START = "\x1b[200~"
_TOKEN = re.compile(r"lrtok[0-9a-f]{8}n\d{6}z")
_DONE = ("succeeded", "failed")


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def summary_ms(seconds: list[float]) -> dict[str, float]:
    """p50/p95/p99/max (and count) of durations given in seconds, as milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "count": len(ms),
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "p99": percentile(ms, 99),
        "max": max(ms, default=0.0),
    }


@dataclass(frozen=True)
class Delivery:
    """One signed delivery: a start or a plain comment on one work item."""

    delivery_id: str
    token: str
    number: int
    kind: str  # "start" or "comment"
    body: bytes
    event: str = EVENT


def build_deliveries(
    *, total: int, work_items: int, run_id: str | None = None
) -> tuple[list[Delivery], list[Delivery]]:
    """Return (starts, comments): one ``the-loop start`` per work item, then the rest of
    ``total`` as comments spread round-robin over the work items. Every body carries a unique
    token (``lrtok<run>n<index>z``) so its paste can be found exactly once."""
    if not 1 <= work_items <= total:
        raise ValueError("need 1 <= work_items <= deliveries")
    run_id = run_id or uuid.uuid4().hex[:8]
    template = json.loads(FIXTURE.read_text(encoding="utf-8"))
    template["issue"]["labels"].append({"name": AUTO_EXECUTE_LABEL})
    starts: list[Delivery] = []
    comments: list[Delivery] = []
    for index in range(total):
        number = index % work_items + 1
        kind = "start" if index < work_items else "comment"
        token = f"lrtok{run_id}n{index:06d}z"
        text = f"the-loop start {token}" if kind == "start" else f"load comment {token}"
        payload = dict(template)
        payload["issue"] = dict(template["issue"], number=number)
        payload["comment"] = dict(template["comment"], id=10_000_000 + index, body=text)
        body = json.dumps(payload).encode()
        delivery = Delivery(f"load-{run_id}-{index:06d}", token, number, kind, body)
        (starts if kind == "start" else comments).append(delivery)
    return starts, comments


@dataclass(frozen=True)
class Ack:
    """The answer to one delivery, as the sender saw it."""

    status: int
    seconds: float
    sent_wall: float
    acked_wall: float
    sent_mono: float
    error: str = ""


def send_all(url: str, items: list[Delivery], *, senders: int, secret: bytes) -> list[Ack]:
    """POST every item at full speed from ``senders`` threads, each on one keep-alive
    ``http.client`` connection; returns one ``Ack`` per item, in item order."""
    host_port = url.split("/")[2]
    path = "/" + url.split("/", 3)[3]
    acks: list[Ack | None] = [None] * len(items)
    next_index = itertools.count()

    def sender() -> None:
        conn = http.client.HTTPConnection(host_port, timeout=30)
        try:
            while (index := next(next_index)) < len(items):
                acks[index] = _post(conn, path, items[index], secret)
                if acks[index].error:  # type: ignore[union-attr]
                    conn.close()
                    conn = http.client.HTTPConnection(host_port, timeout=30)
        finally:
            conn.close()

    threads = [
        threading.Thread(target=sender, name=f"sender-{i}", daemon=True) for i in range(senders)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # a timed join keeps Ctrl-C (and the rig's cleanup) responsive
    done = [ack for ack in acks if ack is not None]
    if len(done) != len(items):
        raise LoadError(f"a sender thread died: {len(items) - len(done)} deliveries unsent")
    return done


def _post(conn: http.client.HTTPConnection, path: str, item: Delivery, secret: bytes) -> Ack:
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": item.event,
        "X-GitHub-Delivery": item.delivery_id,
        "X-Hub-Signature-256": sign_body(item.body, secret),
    }
    sent_wall, sent = time.time(), time.perf_counter()
    try:
        conn.request("POST", path, body=item.body, headers=headers)
        response = conn.getresponse()
        response.read()
    except (OSError, http.client.HTTPException) as exc:
        elapsed = time.perf_counter() - sent
        return Ack(0, elapsed, sent_wall, time.time(), sent, f"{type(exc).__name__}: {exc}")
    elapsed = time.perf_counter() - sent
    return Ack(response.status, elapsed, sent_wall, time.time(), sent)


# -- the burst ------------------------------------------------------------------------------


@dataclass
class LoadReport:
    """What one burst measured, and every way it failed (empty: nothing lost or doubled)."""

    deliveries: int
    work_items: int
    senders: int
    ack_ms: dict[str, float] = field(default_factory=dict)
    acks_per_second: float = 0.0
    e2e_ms: dict[str, float] = field(default_factory=dict)
    e2e_source: str = ""
    drain_seconds: float = 0.0
    total_seconds: float = 0.0
    store_ops: dict[str, float] = field(default_factory=dict)
    peak_rss_mib: dict[str, float] = field(default_factory=dict)
    checks: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def run_load(
    root: Path,
    *,
    deliveries: int,
    work_items: int,
    senders: int,
    max_seconds: float = math.inf,
    progress: Callable[[str], None] = lambda _: None,
) -> LoadReport:
    """Run one burst under ``root`` and return its report (``failures`` says what was lost
    or applied twice; a drain that stalls or outlasts ``max_seconds`` is reported there).
    Raises ``LoadError`` when the rig fails or the starts never settle."""
    report = LoadReport(deliveries, work_items, senders)
    deadline = time.monotonic() + max_seconds
    with rig(root, capacity=work_items) as running:
        starts, comments = build_deliveries(total=deliveries, work_items=work_items)
        began = time.monotonic()
        # The starts go first and must be routed before the comments: a comment routed
        # before its work item started is (rightly) ignored, and would read as lost.
        progress(f"sending {len(starts)} starts")
        acks = send_all(running.url, starts, senders=senders, secret=running.secret)
        _wait_settled(running, len(starts), deadline)
        progress(f"sending {len(comments)} comments with {senders} senders")
        wave = time.monotonic()
        acks += send_all(running.url, comments, senders=senders, secret=running.secret)
        report.acks_per_second = len(comments) / max(time.monotonic() - wave, 1e-9)
        items = starts + comments
        report.ack_ms = summary_ms([a.seconds for a in acks if not a.error])
        bad = [
            (item.delivery_id, a) for item, a in zip(items, acks, strict=True) if a.status != 202
        ]
        for delivery_id, ack in bad[:5]:
            report.failures.append(f"{delivery_id} answered {ack.status} {ack.error}".strip())
        if bad:
            report.failures.append(f"{len(bad)} of {len(items)} deliveries not acked 202")
        progress("waiting for the runner to apply everything")
        _wait_drained(running, len(items), report, deadline)
        report.total_seconds = time.monotonic() - began
        report.peak_rss_mib = {
            "up": peak_rss_kib(running.up.pid) / 1024,
            "runner": peak_rss_kib(running.runner.pid) / 1024,
        }
        _verify(running, items, acks, report)
    _store_ops(running, len(items), report)
    return report


STALL_SECONDS = 90.0
"""A drain that finishes nothing for this long is given up on (and reported as loss)."""


def _progress_wait(
    check: Callable[[], tuple[int, bool]], *, what: str, deadline: float = math.inf
) -> None:
    """Wait while ``check`` (progress count, done) is not done and still moving; raises
    ``LoadError`` after ``STALL_SECONDS`` without progress or at ``deadline`` (monotonic)."""
    best, moved = -1, time.monotonic()
    while True:
        count, done = check()
        if done:
            return
        if count > best:
            best, moved = count, time.monotonic()
        elif time.monotonic() - moved > STALL_SECONDS:
            raise LoadError(f"{what} stalled at {count} for {STALL_SECONDS:.0f} s")
        if time.monotonic() > deadline:
            raise LoadError(f"{what} not finished at the time limit (progress count {count})")
        time.sleep(POLL_SECONDS)


def _wait_settled(running: Rig, count: int, deadline: float) -> None:
    def settled() -> tuple[int, bool]:
        running.check_alive()
        done = running.count("SELECT COUNT(*) FROM deliveries WHERE settled_at IS NOT NULL")
        return done, done >= count

    _progress_wait(settled, what=f"settling {count} deliveries", deadline=deadline)


def _wait_drained(running: Rig, count: int, report: LoadReport, deadline: float) -> None:
    """Every delivery settled and every dispatch finished, or no progress for STALL_SECONDS."""

    def drained() -> tuple[int, bool]:
        running.check_alive()
        settled = running.count("SELECT COUNT(*) FROM deliveries WHERE settled_at IS NOT NULL")
        dispatches = running.count("SELECT COUNT(*) FROM dispatches")
        finished = running.count(
            "SELECT COUNT(*) FROM dispatches WHERE status IN ('succeeded', 'failed')"
        )
        return settled + finished, settled >= count and finished >= dispatches >= count

    try:
        _progress_wait(drained, what="the drain", deadline=deadline)
    except LoadError as exc:
        report.failures.append(str(exc))  # _verify names what is missing


def _verify(running: Rig, items: list[Delivery], acks: list[Ack], report: LoadReport) -> None:
    store = SqliteStore(running.store_path)
    work = SqliteWorkItemStore(running.store_path)
    try:
        ledger = {d.delivery_id: d for d in store.list_deliveries(limit=len(items) * 2 + 100)}
        dispatches = work.list_dispatches(limit=len(items) * 2 + 100)
        applied = store.list_events(name="dispatch.succeeded", limit=len(items) * 2 + 100)
    finally:
        store.close()
        work.close()
    by_delivery: dict[str, list[DispatchRecord]] = defaultdict(list)
    for dispatch in dispatches:
        by_delivery[dispatch.delivery_id].append(dispatch)
    acked = [item for item, ack in zip(items, acks, strict=True) if ack.status == 202]
    _check_ledger(acked, ledger, by_delivery, report)
    applied_at = {e.delivery_id: e.at.timestamp() for e in applied if e.delivery_id}
    last_ack = max(a.acked_wall for a in acks)
    report.drain_seconds = max(applied_at.values(), default=last_ack) - last_ack
    _end_to_end(running, acked=acked, acks=acks, items=items, applied_at=applied_at, report=report)
    _check_harness(running.harness, acked, by_delivery, report)


def _check_ledger(
    acked: list[Delivery],
    ledger: dict[str, Any],
    by_delivery: dict[str, list[DispatchRecord]],
    report: LoadReport,
) -> None:
    outcomes = {i.delivery_id: getattr(ledger.get(i.delivery_id), "outcome", None) for i in acked}
    unsettled = [d for d, outcome in outcomes.items() if outcome in (None, "received")]
    not_dispatched = [
        f"{d}:{outcome}"
        for d, outcome in outcomes.items()
        if outcome not in (None, "received", "dispatched")
    ]
    wrong_count = [i.delivery_id for i in acked if len(by_delivery.get(i.delivery_id, [])) != 1]
    unfinished = [
        d.dispatch_id for ds in by_delivery.values() for d in ds if d.status != "succeeded"
    ]
    kinds = Counter(d.kind for ds in by_delivery.values() for d in ds)
    report.checks |= {
        "acked": len(acked),
        "settled": len(acked) - len(unsettled),
        "dispatches": sum(kinds.values()),
        "spawn_dispatches": kinds["spawn"],
        "deliver_dispatches": kinds["deliver"],
        "dispatches_succeeded": sum(kinds.values()) - len(unfinished),
    }
    for what, found in (
        ("acked deliveries never settled", unsettled),
        ("deliveries settled other than dispatched", not_dispatched),
        ("deliveries without exactly one dispatch", wrong_count),
        ("dispatches not succeeded", unfinished),
    ):
        if found:
            report.failures.append(f"{len(found)} {what}, e.g. {found[:3]}")


def _end_to_end(
    running: Rig,
    *,
    acked: list[Delivery],
    acks: list[Ack],
    items: list[Delivery],
    applied_at: dict[str, float],
    report: LoadReport,
) -> None:
    """Webhook received (the queue task's ``created_at``, stamped by ingress at enqueue) to
    runner applied (the ``dispatch.succeeded`` event, stamped when the runner's result for the
    applied dispatch is accepted); both are wall-clock times on this machine."""
    # Keyed by task_name_prefix: every task of a delivery starts with it.
    width = len(task_name_prefix(""))
    queued = _enqueued_at(running.data_dir / QUEUE_FILE)
    received = {name[:width]: at for name, at in sorted(queued.items(), key=lambda kv: -kv[1])}
    report.e2e_source = "queue task created_at -> dispatch.succeeded event at"
    if not received:
        sent = {item.delivery_id: ack.sent_wall for item, ack in zip(items, acks, strict=True)}
        received = {task_name_prefix(d): t for d, t in sent.items()}
        report.e2e_source = "client send time -> dispatch.succeeded event at (queue unreadable)"
    spans = [
        applied_at[i.delivery_id] - received[task_name_prefix(i.delivery_id)]
        for i in acked
        if i.delivery_id in applied_at and task_name_prefix(i.delivery_id) in received
    ]
    report.e2e_ms = summary_ms(spans)


def _enqueued_at(queue_path: Path) -> dict[str, float]:
    try:
        with sqlite3.connect(f"file:{queue_path}?mode=ro", uri=True, timeout=10) as db:
            return {
                name: float(at) for name, at in db.execute("SELECT name, created_at FROM tasks")
            }
    except sqlite3.Error:
        return {}


def _check_harness(
    harness: FakeHarness,
    acked: list[Delivery],
    by_delivery: dict[str, list[DispatchRecord]],
    report: LoadReport,
) -> None:
    """Each spawn once per work item, each comment pasted once, into its own work item's
    session, in ``seq`` order and in the order the comments were created."""
    calls = harness.calls()
    starts = [c for c in calls if c["event"] == "start"]
    pasted: dict[int, list[str]] = defaultdict(list)
    for call in calls:
        if call["event"] == "input":
            pasted[call["pid"]].append(call["data"])
    seen: dict[str, list[int]] = defaultdict(list)  # token -> pids, once per occurrence
    for start in starts:
        for token in _TOKEN.findall(" ".join(start["argv"])):
            seen[token].append(start["pid"])
    order: dict[int, list[str]] = {}
    for pid, chunks in pasted.items():
        order[pid] = _TOKEN.findall("".join(chunks))
        for token in order[pid]:
            seen[token].append(pid)
    session_of = {i.number: seen.get(i.token, [None])[0] for i in acked if i.kind == "start"}
    expected = {i.token: _multiplicity(i, by_delivery) for i in acked}
    missing = [t for t, n in expected.items() if len(seen.get(t, [])) < n]
    doubled = [t for t, n in expected.items() if len(seen.get(t, [])) > n]
    elsewhere = [
        i.token
        for i in acked
        if i.kind == "comment" and set(seen.get(i.token, [])) - {session_of[i.number]}
    ]
    seq = {
        i.token: by_delivery[i.delivery_id][0].seq for i in acked if by_delivery.get(i.delivery_id)
    }
    out_of_order = sum(
        1
        for tokens in order.values()
        for a, b in itertools.pairwise(dict.fromkeys(tokens))
        if a in seq and b in seq and seq[a] > seq[b]
    )
    # Creation order: each comment's id grows with its token's index (build_deliveries), and
    # all share one created_at second, so GitHub's order is the index order.
    out_of_creation_order = sum(
        1
        for tokens in order.values()
        for a, b in itertools.pairwise(dict.fromkeys(tokens))
        if _created_index(a) > _created_index(b)
    )
    spawns = Counter(seen.get(i.token, [None])[0] for i in acked if i.kind == "start")
    report.checks |= {
        "harness_spawns": len(starts),
        "pastes": sum("".join(c).count(PASTE_START) for c in pasted.values()),
        "tokens_missing": len(missing),
        "tokens_doubled": len(doubled),
        "pasted_elsewhere": len(elsewhere),
        "pasted_out_of_order": out_of_order,
        "pasted_out_of_creation_order": out_of_creation_order,
    }
    work_items = len({i.number for i in acked})
    for what, found in (
        ("comments never applied", missing),
        ("comments applied twice", doubled),
        ("comments pasted into another work item's session", elsewhere),
    ):
        if found:
            report.failures.append(f"{len(found)} {what}, e.g. {found[:3]}")
    if len(starts) != work_items or any(n != 1 for n in spawns.values()):
        report.failures.append(f"{len(starts)} harness spawns for {work_items} work items")
    if out_of_order:
        report.failures.append(f"{out_of_order} pastes out of seq order")
    if out_of_creation_order:
        report.failures.append(f"{out_of_creation_order} pastes out of the comments' order")


def _created_index(token: str) -> int:
    """The index ``build_deliveries`` gave the comment carrying ``token``: its creation order."""
    return int(token[token.rindex("n") + 1 : -1])


def _multiplicity(item: Delivery, by_delivery: dict[str, list[DispatchRecord]]) -> int:
    """How often the token appears in what the runner gets for ``item`` (its prompt)."""
    dispatches = by_delivery.get(item.delivery_id)
    if not dispatches:
        return 1
    return max(1, int(dispatches[0].prompt.count(item.token)))


def _store_ops(running: Rig, deliveries: int, report: LoadReport) -> None:
    """Store operations ``up`` counted at its adapters (written when it exited), per delivery."""
    try:
        counts: dict[str, int] = json.loads(running.counts_path.read_text())
    except (OSError, ValueError):
        report.failures.append(
            f"no store counts in {running.counts_path} (up did not exit cleanly)"
        )
        return
    keys = ("port.read", "port.write", "sql.SELECT", "sql.commits")
    report.store_ops = {key: counts.get(key, 0) / deliveries for key in keys}
    calls = {k: v for k, v in counts.items() if k.startswith("call.")}
    report.store_ops |= {
        k: v / deliveries for k, v in sorted(calls.items(), key=lambda kv: -kv[1])[:8]
    }


def format_report(report: LoadReport) -> str:
    """The report as a short text table."""
    a, e = report.ack_ms, report.e2e_ms
    row = "{:<24} {:>9} {:>9} {:>9} {:>9} {:>7}"
    lines = [
        f"burst: {report.deliveries} deliveries across {report.work_items} work items, "
        f"{report.senders} senders, one runner",
        row.format("latency ms", "p50", "p95", "p99", "max", "n"),
        row.format("ack", *(f"{a[k]:.2f}" for k in ("p50", "p95", "p99", "max")), a["count"]),
        row.format(
            "end-to-end", *(f"{e[k]:.0f}" for k in ("p50", "p95", "p99", "max")), e["count"]
        ),
        f"end-to-end is {report.e2e_source}",
        f"comment acks/s: {report.acks_per_second:.0f}; drain (last ack -> last apply): "
        f"{report.drain_seconds:.1f} s; whole run {report.total_seconds:.1f} s",
        "store ops per delivery (at the adapters of up, runner API included): "
        + ", ".join(f"{k} {v:.2f}" for k, v in report.store_ops.items()),
        "peak RSS MiB: " + ", ".join(f"{k} {v:.0f}" for k, v in report.peak_rss_mib.items()),
        "checks: " + ", ".join(f"{k}={v}" for k, v in report.checks.items()),
    ]
    if report.failures:
        lines += ["FAILED:", *(f"  {failure}" for failure in report.failures)]
    else:
        lines.append("ok: nothing lost, nothing applied twice")
    return "\n".join(lines)
