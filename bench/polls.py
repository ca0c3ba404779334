"""Idle long polls on one ``looprelay up``: what a thousand waiting runners cost, and whether a
delivery still reaches the runner that holds its session meanwhile.

One run starts both sides (``bench/loadrig.Rig``: ``looprelay up`` and one runner agent with the
fake harness), starts one work item, and measures signed comments one at a time: the time from
the client's send until the store granted the lease to the runner (``bench/e2e.py``'s trigger
and ``Watcher``), and the ack. Then it registers a second runner, which holds no session, and
keeps N polls of it waiting (``POST /runner/v1/poll``, ``wait_seconds`` 30, so each waits the
server's ``runners.pollWaitSeconds``, 25 s by default, and is sent again when answered). Once
they wait it reads ``up``'s RSS and thread count from ``/proc`` and measures the same number of
comments again. Both phases run in the same ``up``, on the same work item, one after the other;
the figures compare them. Everything stays on 127.0.0.1; nothing is asserted.

    .venv/bin/python bench/polls.py [--polls 1000] [--count 50] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e import Watcher
from loadrig import LoadError, Rig, cli, rig
from loadrun import Delivery, build_deliveries, send_all, summary_ms

SETTLE_SECONDS = 8.0
"""How long the polls get to be admitted and waiting before the server is measured."""
POLL_BODY = json.dumps({"wait_seconds": 30}).encode()


def _usage(pid: int) -> dict[str, int]:
    """RSS in MiB and threads of process ``pid``."""
    status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    rss = re.search(r"VmRSS:\s+(\d+)", status)
    threads = re.search(r"Threads:\s+(\d+)", status)
    assert rss and threads
    return {"rss_mib": int(rss[1]) // 1024, "threads": int(threads[1])}


def _load() -> float:
    """The 1-minute load average, to print next to each figure (the machine is shared)."""
    return os.getloadavg()[0]


@dataclass
class IdlePolls:
    """``count`` polls of one runner kept waiting on ``up`` from a thread of their own: each is
    sent again as soon as it is answered, until :meth:`stop`."""

    port: int
    authorization: str
    count: int
    answers: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    async def _run(self) -> None:
        await asyncio.gather(*(self._keep_polling() for _ in range(self.count)))

    async def _keep_polling(self) -> None:
        request = (
            "POST /runner/v1/poll HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Authorization: {self.authorization}\r\nContent-Length: {len(POLL_BODY)}\r\n\r\n"
        ).encode() + POLL_BODY
        while not self._stop.is_set():
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                writer.write(request)
                await writer.drain()
                self.sent += 1
                line = await self._answer(reader)
            finally:
                writer.close()
            status = line.decode("latin-1").split(" ")[1] if line else "closed"
            self.answers[status] = self.answers.get(status, 0) + 1

    async def _answer(self, reader: asyncio.StreamReader) -> bytes:
        """The status line, or b"" once :meth:`stop` was called (the poll is abandoned)."""
        while not self._stop.is_set():
            try:
                return await asyncio.wait_for(reader.readline(), 0.5)
            except TimeoutError:
                continue
        return b""


def _idle_runner(running: Rig) -> str:
    """Register a second runner (no session is ever placed on it); its Authorization header."""
    state = ["--config", str(running.root / "looprelay.yaml"), "--data", str(running.data_dir)]
    token = cli("runners", "token", *state).strip()
    body = json.dumps({"token": token, "name": "idle"}).encode()
    base = running.url.rsplit("/", 1)[0]
    request = urllib.request.Request(  # noqa: S310 - loopback
        base + "/runner/v1/register", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - loopback
        registered = json.loads(answer.read())
    return f"Bearer {registered['runner_id']}:{registered['secret']}"


def _phase(
    running: Rig, watcher: Watcher, comments: list[Delivery], *, warmup: int
) -> dict[str, object]:
    """Send ``comments`` one at a time, each once the previous one was applied; the figures of
    all but the first ``warmup``: send -> lease granted, and send -> 202."""
    leases, acks = [], []
    load_before = _load()
    for index, item in enumerate(comments):
        [ack] = send_all(running.url, [item], senders=1, secret=running.secret)
        if ack.status != 202:
            raise LoadError(f"{item.delivery_id} answered {ack.status} {ack.error}")
        _created, leased = watcher.wait(item.delivery_id, applied=True)
        if index >= warmup:
            leases.append(leased - ack.sent_wall)
            acks.append(ack.seconds)
    return {
        "lease": summary_ms(leases),
        "ack": summary_ms(acks),
        "load": [round(load_before, 2), round(_load(), 2)],
    }


def measure(root: Path, *, polls: int, count: int, warmup: int) -> dict[str, object]:
    """Both phases in one rig under ``root``; raises ``LoadError`` when the rig fails."""
    per_phase = warmup + count
    starts, comments = build_deliveries(total=1 + 2 * per_phase, work_items=1)
    with rig(root, capacity=2) as running:
        watcher = Watcher(running)
        send_all(running.url, starts, senders=1, secret=running.secret)
        watcher.wait(starts[0].delivery_id, applied=True)
        before = _usage(running.up.pid)
        quiet = _phase(running, watcher, comments[:per_phase], warmup=warmup)
        port = int(running.url.split(":")[2].split("/")[0])
        idle = IdlePolls(port, _idle_runner(running), polls)
        idle.start()
        try:
            deadline = time.monotonic() + 60
            while idle.sent < polls and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(SETTLE_SECONDS)  # the admits run on the pool; let them finish
            waiting = _usage(running.up.pid) | {"polls_sent": idle.sent}
            answered_early = sum(idle.answers.values())
            busy = _phase(running, watcher, comments[per_phase:], warmup=warmup)
            waiting_after = _usage(running.up.pid)
        finally:
            idle.stop()
        running.check_alive()
    return {
        "polls": polls,
        "before": before,
        "waiting": waiting,
        "waiting_after_phase": waiting_after,
        "polls_answered_before_measuring": answered_early,
        "poll_answers": idle.answers,
        "without_polls": quiet,
        "with_polls": busy,
    }


def _row(name: str, phase: dict[str, object]) -> str:
    lease, ack = phase["lease"], phase["ack"]
    assert isinstance(lease, dict) and isinstance(ack, dict)
    load = phase["load"]
    assert isinstance(load, list)
    return (
        f"{name:<24}{lease['count']:>4.0f}{lease['p50']:>8.1f}{lease['p99']:>8.1f}"
        f"{lease['max']:>8.1f}{ack['p50']:>9.1f}{ack['p99']:>9.1f}   {load[0]:.2f} -> {load[1]:.2f}"
    )


def main() -> int:
    """Measure and print; exit 1 when the rig fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=1000, help="idle polls kept waiting")
    parser.add_argument("--count", type=int, default=50, help="measured comments per phase")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured comments per phase")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        with tempfile.TemporaryDirectory(prefix="looprelay-polls-") as tmp:
            report = measure(Path(tmp), polls=args.polls, count=args.count, warmup=args.warmup)
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"looprelay up before the polls: {report['before']}")
    print(f"with {args.polls} polls waiting: {report['waiting']}")
    print(f"  after the second phase: {report['waiting_after_phase']}")
    print(f"poll answers: {report['poll_answers']}")
    print()
    print(
        f"{'signed comment ->':<24}{'n':>4}{'lease':>8}{'p99':>8}{'max':>8}{'ack p50':>9}"
        f"{'p99':>9}   load (1 min)"
    )
    print(_row("  without idle polls", report["without_polls"]))  # type: ignore[arg-type]
    print(_row(f"  with {args.polls} idle polls", report["with_polls"]))  # type: ignore[arg-type]
    print("lease = send -> lease granted to the runner holding the session (p50, p99, max ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
