"""Webhook ack latency and throughput: ``looprelay up`` against a bare stdlib receiver (the floor).

Both run in one invocation, one after the other, driven by wrk and ``bench/webhook.lua`` (one
signed ``issue_comment`` payload, a unique delivery id per request) at 1 and 8 connections; any
response but 202 fails the run. After each looprelay shape the queue is drained and counted."""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
FIXTURE = ROOT / "tests" / "fixtures" / "github" / "issue_comment.created.json"
EVENT = "issue_comment"
LOOPRELAY = ROOT / ".venv" / "bin" / "looprelay"
SHAPES = ((1, 1), (2, 8))  # (wrk threads, connections)
WARMUP_SECONDS = 1
READY_SECONDS = 30.0
DRAIN_SECONDS = 60.0
STOP_SECONDS = 15.0
QUEUE_NOTE = (
    "looprelay up also runs its embedded queue in the same process: each acked delivery is "
    "POSTed to its own /worker and settled in the SQLite ledger, competing for the same CPU."
)
_RESULT = re.compile(r"^RESULT (.+)$", re.MULTILINE)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_ROW = "{:<10} {:>5} {:>8} {:>8} {:>8} {:>8}"
_SETTLED_SQL = "SELECT COUNT(*) FROM deliveries WHERE settled_at IS NOT NULL"


class BenchError(Exception):
    """The benchmark could not produce trustworthy figures."""


@dataclass(frozen=True)
class Run:
    """One wrk run against one receiver."""

    receiver: str
    phase: str  # "warm" (discarded) or "run"
    connections: int
    requests: int
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float


@dataclass(frozen=True)
class Ledger:
    """Deliveries looprelay's ledger settled, against the requests wrk saw acked."""

    acked: int
    settled: int
    drain_seconds: dict[str, float]


@dataclass(frozen=True)
class Target:
    """A running receiver: where to post and the payload's signature for its secret."""

    name: str
    url: str
    signature: str


def _seconds(text: str) -> int:
    if not re.fullmatch(r"[1-9]\d*s?", text):
        raise argparse.ArgumentTypeError(f"{text!r}: give whole seconds, e.g. 10s")
    return int(text.rstrip("s"))


def _sign(secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), FIXTURE.read_bytes(), hashlib.sha256).hexdigest()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _serving(cmd: list[str], log: Path, port: int) -> Iterator[None]:
    """Run ``cmd`` until ``/healthz`` answers 200 (BenchError if not within READY_SECONDS).

    On exit, SIGINT it and SIGKILL it if it is still alive STOP_SECONDS later."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        _wait_healthy(proc, log, f"http://127.0.0.1:{port}/healthz")
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_healthy(proc: subprocess.Popen[bytes], log: Path, url: str) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"receiver exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise BenchError(f"{url} not healthy after {READY_SECONDS:.0f}s; see {log}")


def _wrk(target: Target, *, threads: int, connections: int, seconds: int, phase: str) -> Run:
    """Run wrk once; raises BenchError unless every response was a 202 without socket errors."""
    run_id = f"{target.name}-c{connections}-{phase}-{uuid.uuid4().hex[:12]}"
    env = os.environ | {"WEBHOOK_BODY_FILE": str(FIXTURE), "WEBHOOK_EVENT": EVENT}
    env |= {"WEBHOOK_SIGNATURE": target.signature, "WEBHOOK_RUN_ID": run_id}
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s"]
    cmd += ["-s", str(BENCH / "webhook.lua"), target.url]
    limit = seconds + 60
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit, check=False)
    result = _RESULT.search(done.stdout)
    if done.returncode != 0 or result is None:
        raise BenchError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    fields = {key: float(value) for key, value in re.findall(r"(\w+)=([\d.]+)", result[1])}
    bad = {key: fields[key] for key in ("non202", "connect", "read", "write", "timeout")}
    if any(bad.values()) or _NON_2XX.search(done.stdout) or not fields["requests"]:
        raise BenchError(
            f"{target.name} c={connections} {phase}: not every response was a 202 "
            f"(first bad status {fields['first_bad']:.0f}, {bad}):\n{done.stdout}"
        )
    rps = fields["requests"] / (fields["duration_us"] / 1e6)
    percentiles = (fields[f"p{p}_us"] / 1000 for p in (50, 95, 99))
    return Run(target.name, phase, connections, int(fields["requests"]), rps, *percentiles)


def _measure(target: Target, threads: int, connections: int, seconds: int) -> list[Run]:
    """A warm-up run, then the measured run; both are returned, warm-up first."""
    print(f"  {target.name} c={connections}: warm-up, then {seconds}s", file=sys.stderr)
    shape = {"threads": threads, "connections": connections}
    warm = _wrk(target, **shape, seconds=WARMUP_SECONDS, phase="warm")
    return [warm, _wrk(target, **shape, seconds=seconds, phase="run")]


def _settled(store: Path) -> int:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5) as db:
        return int(db.execute(_SETTLED_SQL).fetchone()[0])


def _drain(store: Path, acked: int) -> float:
    """Wait (at most DRAIN_SECONDS) until the ledger has settled ``acked`` deliveries."""
    start = time.monotonic()
    while _settled(store) < acked and time.monotonic() - start < DRAIN_SECONDS:
        time.sleep(0.1)
    return round(time.monotonic() - start, 2)


def _bench_floor(tmp: Path, seconds: int) -> list[Run]:
    secret, secret_file, port = uuid.uuid4().hex, tmp / "floor-secret", _free_port()
    secret_file.write_text(secret + "\n", encoding="ascii")
    cmd = [sys.executable, str(BENCH / "bare_receiver.py"), "--port", str(port)]
    with _serving([*cmd, "--secret-file", str(secret_file)], tmp / "floor.log", port):
        target = Target("floor", f"http://127.0.0.1:{port}/webhook", _sign(secret))
        return [run for shape in SHAPES for run in _measure(target, *shape, seconds)]


def _bench_looprelay(tmp: Path, seconds: int) -> tuple[list[Run], Ledger]:
    """Measure ``looprelay up``; after each shape wait for its queue to settle the backlog."""
    data, port, runs, drains = tmp / "data", _free_port(), list[Run](), dict[str, float]()
    cmd = [str(LOOPRELAY), "up", "--data", str(data), "--port", str(port)]
    with _serving([*cmd, "--log-level", "WARNING"], tmp / "looprelay.log", port):
        secret = (data / "webhook-secret").read_text(encoding="ascii").strip()
        target = Target("looprelay", f"http://127.0.0.1:{port}/webhook", _sign(secret))
        for shape in SHAPES:
            runs += _measure(target, *shape, seconds)
            acked = sum(run.requests for run in runs)
            drains[f"c{shape[1]}"] = _drain(data / "looprelay.db", acked)
        return runs, Ledger(acked, _settled(data / "looprelay.db"), drains)


def _ratios(runs: list[Run]) -> list[dict[str, float]]:
    by_key = {(run.receiver, run.connections): run for run in runs}
    pairs = [(c, by_key["looprelay", c], by_key["floor", c]) for _, c in SHAPES]
    return [{"conns": c, "rps": a.rps / b.rps, "p99": a.p99_ms / b.p99_ms} for c, a, b in pairs]


def _table(runs: list[Run], ratios: list[dict[str, float]], ledger: Ledger) -> str:
    lines = [_ROW.format("receiver", "conns", "req/s", "p50 ms", "p95 ms", "p99 ms")]
    for r in runs:
        figures = (f"{r.rps:.0f}", *(f"{ms:.2f}" for ms in (r.p50_ms, r.p95_ms, r.p99_ms)))
        lines.append(_ROW.format(r.receiver, r.connections, *figures))
    for ratio in ratios:
        change = f"req/s x{ratio['rps']:.2f}, p99 x{ratio['p99']:.2f}"
        lines.append(f"looprelay/floor at c={ratio['conns']:.0f}: {change}")
    settled = f"ledger: {ledger.settled} of {ledger.acked} acked deliveries settled, warm-ups incl."
    lines.append(f"{settled}; queue drain after each shape, s: {ledger.drain_seconds}")
    return "\n".join([*lines, f"note: {QUEUE_NOTE}"])


def main() -> int:
    """Run both receivers and print the figures; exit 1 on a failed run, 2 on lost deliveries."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=_seconds, default=10, help="per run [default: 10s]")
    parser.add_argument("--quick", action="store_true", help="3 s runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    seconds = 3 if args.quick else args.duration
    try:
        with tempfile.TemporaryDirectory(prefix="looprelay-bench-") as tmp:
            floor_runs = _bench_floor(Path(tmp), seconds)
            looprelay_runs, ledger = _bench_looprelay(Path(tmp), seconds)
    except (BenchError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    measured = [run for run in floor_runs + looprelay_runs if run.phase == "run"]
    ratios = _ratios(measured)
    if args.json:
        report = {"seconds": seconds, "cpus": os.cpu_count(), "note": QUEUE_NOTE}
        report |= {"runs": [asdict(run) for run in measured], "ratios": ratios}
        print(json.dumps(report | {"ledger": asdict(ledger)}, indent=2))
    else:
        print(_table(measured, ratios, ledger))
    return 0 if ledger.settled >= ledger.acked else 2


if __name__ == "__main__":
    sys.exit(main())
