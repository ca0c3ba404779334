"""Webhook ack latency and throughput: ``looprelay up``, the predecessor and a bare floor.

In one invocation, one after the other, wrk and ``bench/webhook.lua`` (one signed
``issue_comment`` payload, a unique delivery id per request) drive at 1 and 8 connections:

- ``floor``: ``bench/bare_receiver.py``, a stdlib receiver that checks the HMAC and answers;
- ``durable``: the same with ``--journal``: each body synced to a preallocated file before
  its ack (group commit), the floor for a durable ack on this disk;
- ``asgi-fsync``, ``asgi-sqlite``: ``bench/bare_asgi.py``, a bare ASGI app on uvicorn
  (httptools, uvloop) as ``looprelay up`` serves it, syncing each body before its ack, to the
  durable floor's journal or as a row of a fully synced SQLite WAL database: the best case of
  this server stack, and of this stack with looprelay's kind of commit;
- ``the-loop``: the predecessor's receiver, ``the-loopy-one`` from ``bench/.peer`` (``peer.py``);
- ``looprelay``: ``looprelay up``, whose queue is drained and counted after each shape;
- ``unsynced``: the same, but its enqueues commit without fsync
  (``bench/unsynced/sitecustomize.py``): not a mode looprelay offers, it shows what the
  durable ack costs;
- ``granian``: the same application served by granian instead of uvicorn
  (``bench/granian/sitecustomize.py``): the candidate server measured against the chosen one.

Each receiver has one expected ack status; any other status, a socket error or a timeout fails
the run. The table ends with looprelay's ratios to the others and the issue's targets."""

from __future__ import annotations

import argparse
import hashlib
import hmac
import importlib.util
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
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path

import peer

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
FIXTURE = ROOT / "tests" / "fixtures" / "github" / "issue_comment.created.json"
EVENT = "issue_comment"
LOOPRELAY = ROOT / ".venv" / "bin" / "looprelay"
FLOOR, DURABLE, PEER = "floor", "durable", "the-loop"
STACK_FSYNC, STACK_SQLITE = "asgi-fsync", "asgi-sqlite"
OURS, UNSYNCED, GRANIAN = "looprelay", "unsynced", "granian"
NODISPATCH, EAGER = "nodispatch", "eager"
RECEIVERS = (
    *(FLOOR, DURABLE, STACK_FSYNC, STACK_SQLITE, PEER),
    *(OURS, UNSYNCED, NODISPATCH, EAGER, GRANIAN),
)
STACK_FLOORS = {STACK_FSYNC: "--journal", STACK_SQLITE: "--sqlite"}
"""``bench/bare_asgi.py``'s two durable floors on uvicorn, and the flag that picks each."""
LOOPRELAYS = (OURS, UNSYNCED, NODISPATCH, EAGER, GRANIAN)
"""``looprelay up`` as shipped, without the enqueue's fsync, without a worker, with the worker
not deferred to bursts, and on granian; all get ratios."""
VARIANTS = {name: BENCH / name for name in (UNSYNCED, NODISPATCH, EAGER, GRANIAN)}
"""The folder each variant of ``looprelay up`` puts first on ``PYTHONPATH``."""
SHAPES = ((1, 1), (2, 8))  # (wrk threads, connections)
ACK_STATUS = 202  # looprelay's and bare_receiver.py's
WARMUP_SECONDS = 1
READY_SECONDS = 30.0
DRAIN_SECONDS = 600.0
DRAIN_STALL_SECONDS = 20.0
STOP_SECONDS = 15.0
# Issue 24, "Acks at the floor": looprelay against (receiver, figure, bound, connections), the
# floor being this stack's own (uvicorn and one synced SQLite commit, ``asgi-sqlite``).
TARGETS = (
    (STACK_SQLITE, "rps", 0.8, 8),
    (PEER, "rps", 2.0, 8),
    (STACK_SQLITE, "p99", 2.0, 8),
    (STACK_SQLITE, "p50", 2.0, 1),
)
QUEUE_NOTE = (
    "looprelay up also runs its embedded queue: a thread group-commits each acked task, and "
    "each acked delivery is POSTed to its own /worker and settled in the SQLite ledger, "
    "competing for the same two cores."
)
UNSYNCED_NOTE = (
    "unsynced is looprelay up with its enqueue commits not fsync'd (a benchmark-only "
    "patch; its ack is not durable): the gap to looprelay is what the durable ack costs. "
    "The targets are judged on looprelay."
)
NODISPATCH_NOTE = (
    "nodispatch is looprelay up whose queue never dispatches (a benchmark-only patch): the "
    "same durable acks with no worker beside them; the gap to looprelay is what the worker, "
    "in the same process on the same cores, costs the webhook."
)
EAGER_NOTE = (
    "eager is looprelay up whose queue dispatches as soon as no webhook is in flight, not "
    "once the webhook has been idle for IDLE_GRACE_SECONDS (a benchmark-only patch: the "
    "behaviour before): the gap to looprelay is what deferring the worker during a burst buys."
)
GRANIAN_NOTE = (
    "granian is looprelay up's application served by granian (Rust HTTP, the same uvloop and "
    "the same app) instead of uvicorn: the candidate server (docs/decisions/0007)."
)
STACK_NOTE = (
    "asgi-fsync and asgi-sqlite are a bare ASGI app on uvicorn (httptools, uvloop), the "
    "server looprelay up runs, syncing each body before its 202 to durable's journal or to a "
    "fully synced SQLite WAL table (one committing thread, group commit): the least this "
    "stack can do for a durable ack, without an application, a queue or a worker."
)
DURABLE_NOTE = (
    "durable is the floor syncing each body to a preallocated journal before its 202 (group "
    "commit, nothing else): its p99 at c=8 next to the p99 bound shows how much of the bound "
    "this disk's syncs leave."
)
PEER_NOTE = (
    "the-loop answers HTTP/1.0 (a new connection per request) and, with routing off, only "
    "appends its event log (no fsync) before the 202: its ack is not durable."
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
    """A running receiver: where to post, the payload's signature and the status it acks with."""

    name: str
    url: str
    signature: str
    status: int


@dataclass(frozen=True)
class Ratio:
    """A looprelay receiver's figures divided by another receiver's, at one connection count."""

    receiver: str
    versus: str
    connections: int
    rps: float
    p50: float
    p99: float


@dataclass(frozen=True)
class Verdict:
    """One of the issue's targets: looprelay's ratio ``figure`` to ``versus`` against ``bound``."""

    receiver: str
    versus: str
    figure: str  # "rps" must reach the bound, "p50"/"p99" must stay at or under it
    bound: float
    connections: int
    ratio: float
    met: bool


def _seconds(text: str) -> int:
    if not re.fullmatch(r"[1-9]\d*s?", text):
        raise argparse.ArgumentTypeError(f"{text!r}: give whole seconds, e.g. 10s")
    return int(text.rstrip("s"))


def _receivers(text: str) -> tuple[str, ...]:
    names = {name.strip() for name in text.split(",") if name.strip()}
    if not names or names - set(RECEIVERS):
        raise argparse.ArgumentTypeError(f"{text!r}: name some of {','.join(RECEIVERS)}")
    return tuple(name for name in RECEIVERS if name in names)


def _sign(secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), FIXTURE.read_bytes(), hashlib.sha256).hexdigest()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _serving(
    cmd: list[str],
    log: Path,
    port: int,
    *,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    kill_only: bool = False,
) -> Iterator[None]:
    """Run ``cmd`` in its own process group until ``/healthz`` answers 200.

    Raises BenchError if it exits or is not healthy within READY_SECONDS. On exit, even on
    errors: with ``kill_only`` the whole group gets SIGKILL at once (for a receiver that ignores
    SIGTERM); otherwise SIGINT, then SIGKILL if it is still alive STOP_SECONDS later."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True
        )
    try:
        _wait_healthy(proc, log, f"http://127.0.0.1:{port}/healthz")
        yield
    finally:
        _stop(proc, kill_only=kill_only)


def _stop(proc: subprocess.Popen[bytes], *, kill_only: bool) -> None:
    if kill_only:
        # The leader is not reaped yet, so its pid still names the group: children go too.
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    elif proc.poll() is None:
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
    """Run wrk once, allowing ``seconds`` + 60 s; each request may take 10 s.

    Raises BenchError unless every response had ``target.status`` and there was no socket error
    or timeout; subprocess.TimeoutExpired if wrk overruns."""
    run_id = f"{target.name}-c{connections}-{phase}-{uuid.uuid4().hex[:12]}"
    env = os.environ | {"WEBHOOK_BODY_FILE": str(FIXTURE), "WEBHOOK_EVENT": EVENT}
    env |= {"WEBHOOK_SIGNATURE": target.signature, "WEBHOOK_RUN_ID": run_id}
    env |= {"WEBHOOK_EXPECT_STATUS": str(target.status)}
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s"]
    cmd += ["-s", str(BENCH / "webhook.lua"), target.url]
    limit = seconds + 60
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit, check=False)
    result = _RESULT.search(done.stdout)
    if done.returncode != 0 or result is None:
        raise BenchError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    fields = {key: float(value) for key, value in re.findall(r"(\w+)=([\d.]+)", result[1])}
    bad = {key: fields[key] for key in ("unexpected", "connect", "read", "write", "timeout")}
    if any(bad.values()) or _NON_2XX.search(done.stdout) or not fields["requests"]:
        raise BenchError(
            f"{target.name} c={connections} {phase}: not every response was a {target.status} "
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
    """Wait until the ledger has settled ``acked`` deliveries; return the seconds waited.

    Gives up when the settled count has not moved for DRAIN_STALL_SECONDS, or after
    DRAIN_SECONDS in all: a faster ack path leaves a longer backlog, which is not a loss."""
    start = moved = time.monotonic()
    settled = _settled(store)
    while settled < acked and time.monotonic() - moved < DRAIN_STALL_SECONDS:
        if time.monotonic() - start > DRAIN_SECONDS:
            break
        time.sleep(0.1)
        settled, before = _settled(store), settled
        moved = time.monotonic() if settled > before else moved
    return round(time.monotonic() - start, 2)


def _bench_floor(tmp: Path, seconds: int, name: str) -> list[Run]:
    """Measure ``bare_receiver.py``: as the floor, or (``DURABLE``) syncing a journal."""
    secret, secret_file, port = uuid.uuid4().hex, tmp / f"{name}-secret", _free_port()
    secret_file.write_text(secret + "\n", encoding="ascii")
    cmd = [sys.executable, str(BENCH / "bare_receiver.py"), "--port", str(port)]
    cmd += ["--secret-file", str(secret_file)]
    if name == DURABLE:
        cmd += ["--journal", str(tmp / "durable.journal")]
    if name in STACK_FLOORS:
        cmd[1] = str(BENCH / "bare_asgi.py")
        cmd += [STACK_FLOORS[name], str(tmp / f"{name}.journal")]
    with _serving(cmd, tmp / f"{name}.log", port):
        url = f"http://127.0.0.1:{port}/webhook"
        target = Target(name, url, _sign(secret), ACK_STATUS)
        return [run for shape in SHAPES for run in _measure(target, *shape, seconds)]


def _bench_peer(tmp: Path, seconds: int) -> list[Run]:
    """Measure the predecessor; it ignores SIGTERM, so it is stopped with SIGKILL."""
    secret, port = uuid.uuid4().hex, _free_port()
    launch = peer.prepare(tmp / "peer", port=port, secret=secret)
    log = tmp / "peer.log"
    with _serving(launch.cmd, log, port, cwd=launch.cwd, env=launch.env, kill_only=True):
        url = f"http://127.0.0.1:{port}{peer.WEBHOOK_PATH}"
        target = Target(PEER, url, _sign(secret), peer.ACK_STATUS)
        return [run for shape in SHAPES for run in _measure(target, *shape, seconds)]


def _bench_looprelay(tmp: Path, seconds: int, name: str) -> tuple[list[Run], Ledger]:
    """Measure ``looprelay up`` (``name``: as shipped, or a variant of ``VARIANTS``); after each
    shape wait for its queue to settle the backlog."""
    data, port, runs, drains = tmp / name, _free_port(), list[Run](), dict[str, float]()
    cmd = [str(LOOPRELAY), "up", "--data", str(data), "--port", str(port)]
    env = None
    if name == GRANIAN and importlib.util.find_spec("granian") is None:
        raise BenchError("the granian receiver needs the bench extra: pip install -e '.[bench]'")
    if name in VARIANTS:
        inherited = os.environ.get("PYTHONPATH")
        path = os.pathsep.join([str(VARIANTS[name]), *([inherited] if inherited else [])])
        env = os.environ | {"PYTHONPATH": path}
    log = tmp / f"{name}.log"
    with _serving([*cmd, "--log-level", "WARNING"], log, port, env=env):
        secret = (data / "webhook-secret").read_text(encoding="ascii").strip()
        url = f"http://127.0.0.1:{port}/webhook"
        target = Target(name, url, _sign(secret), ACK_STATUS)
        for shape in SHAPES:
            runs += _measure(target, *shape, seconds)
            acked = sum(run.requests for run in runs)
            if name != NODISPATCH:  # its tasks stay queued
                drains[f"c{shape[1]}"] = _drain(data / "looprelay.db", acked)
        return runs, Ledger(acked, _settled(data / "looprelay.db"), drains)


def _bench(tmp: Path, receivers: tuple[str, ...], seconds: int) -> tuple[list[Run], Ledger | None]:
    """Measure each receiver in turn; the ledger (looprelay's, as shipped) is None when
    looprelay is not among them."""
    runs, ledger = list[Run](), None
    for name in receivers:
        if name in LOOPRELAYS:
            ours, settled = _bench_looprelay(tmp, seconds, name)
            runs += ours
            ledger = settled if name == OURS else ledger
        else:
            runs += _bench_peer(tmp, seconds) if name == PEER else _bench_floor(tmp, seconds, name)
    return runs, ledger


def _ratios(runs: list[Run]) -> list[Ratio]:
    by_key = {(run.receiver, run.connections): run for run in runs}
    ratios = []
    # The variants are there to be set against the floors, and against looprelay itself.
    compared = {
        OURS: (PEER, FLOOR, DURABLE, STACK_FSYNC, STACK_SQLITE),
        UNSYNCED: (PEER, DURABLE, OURS),
        GRANIAN: (PEER, DURABLE, OURS),
        NODISPATCH: (DURABLE, STACK_SQLITE, OURS),
        EAGER: (PEER, DURABLE, OURS),
    }
    for receiver in LOOPRELAYS:
        for versus in compared[receiver]:
            for _, conns in SHAPES:
                ours, theirs = by_key.get((receiver, conns)), by_key.get((versus, conns))
                if ours and theirs:
                    rps = ours.rps / theirs.rps
                    p50, p99 = ours.p50_ms / theirs.p50_ms, ours.p99_ms / theirs.p99_ms
                    ratios.append(Ratio(receiver, versus, conns, rps, p50, p99))
    return ratios


def _verdicts(ratios: list[Ratio], receiver: str = OURS) -> list[Verdict]:
    found = {(r.versus, r.connections): r for r in ratios if r.receiver == receiver}
    verdicts = []
    for versus, figure, bound, conns in TARGETS:
        if (versus, conns) in found:
            ratio = getattr(found[versus, conns], figure)
            met = ratio >= bound if figure == "rps" else ratio <= bound
            verdicts.append(Verdict(receiver, versus, figure, bound, conns, ratio, met))
    return verdicts


def _table(
    runs: list[Run], ratios: list[Ratio], verdicts: list[Verdict], ledger: Ledger | None
) -> str:
    lines = [_ROW.format("receiver", "conns", "req/s", "p50 ms", "p95 ms", "p99 ms")]
    for r in runs:
        figures = (f"{r.rps:.0f}", *(f"{ms:.2f}" for ms in (r.p50_ms, r.p95_ms, r.p99_ms)))
        lines.append(_ROW.format(r.receiver, r.connections, *figures))
    for ratio in ratios:
        change = f"req/s x{ratio.rps:.2f}, p50 x{ratio.p50:.2f}, p99 x{ratio.p99:.2f}"
        lines.append(f"{ratio.receiver}/{ratio.versus} at c={ratio.connections}: {change}")
    by_key = {(run.receiver, run.connections): run for run in runs}
    for v in verdicts:
        wanted = f"{'req/s >=' if v.figure == 'rps' else v.figure + ' <='} {v.bound}x {v.versus}"
        verdict = "pass" if v.met else "MISS"
        line = f"{v.receiver} target at c={v.connections}: {wanted:<24} x{v.ratio:.2f}  {verdict}"
        versus = by_key.get((v.versus, v.connections))
        if v.figure != "rps" and versus:
            bound = v.bound * getattr(versus, f"{v.figure}_ms")
            line += f" (bound {bound:.2f} ms)"
        lines.append(line)
    if ledger is not None:
        settled = f"ledger: {ledger.settled} of {ledger.acked} acked deliveries settled"
        drains = f"queue drain after each shape, s: {ledger.drain_seconds}"
        lines.append(f"{settled}, warm-ups incl.; {drains}")
    return "\n".join([*lines, *(f"note: {note}" for note in _notes(runs))])


def _notes(runs: list[Run]) -> list[str]:
    names = {run.receiver for run in runs}
    notes = (
        (OURS, QUEUE_NOTE),
        (UNSYNCED, UNSYNCED_NOTE),
        (GRANIAN, GRANIAN_NOTE),
        (NODISPATCH, NODISPATCH_NOTE),
        (EAGER, EAGER_NOTE),
        (DURABLE, DURABLE_NOTE),
        (STACK_FSYNC, STACK_NOTE),
        (STACK_SQLITE, STACK_NOTE),
        (PEER, PEER_NOTE),
    )
    return list(dict.fromkeys(note for name, note in notes if name in names))


def _report(
    seconds: int, runs: list[Run], ledger: Ledger | None, peer_version: str | None
) -> dict[str, object]:
    ratios = _ratios(runs)
    report: dict[str, object] = {"seconds": seconds, "cpus": os.cpu_count(), "notes": _notes(runs)}
    report |= {"peer": {"package": peer.PACKAGE, "version": peer_version} if peer_version else None}
    report |= {"runs": [asdict(run) for run in runs], "ratios": [asdict(r) for r in ratios]}
    report |= {"targets": [asdict(v) for v in [*_verdicts(ratios), *_verdicts(ratios, GRANIAN)]]}
    return report | {"ledger": asdict(ledger) if ledger else None}


def main() -> int:
    """Run the receivers and print the figures; exit 1 on a failed run, 2 on lost deliveries."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=_seconds, default=10, help="per run [default: 10s]")
    parser.add_argument("--quick", action="store_true", help="3 s runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--receivers",
        type=_receivers,
        default=RECEIVERS,
        help=f"comma-separated subset [default: {','.join(RECEIVERS)}]",
    )
    args = parser.parse_args()
    seconds = 3 if args.quick else args.duration
    try:
        peer_version = peer.ensure_installed() if PEER in args.receivers else None
        with tempfile.TemporaryDirectory(prefix="looprelay-bench-") as tmp:
            runs, ledger = _bench(Path(tmp), args.receivers, seconds)
    except (BenchError, peer.PeerError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    measured = [run for run in runs if run.phase == "run"]
    if args.json:
        print(json.dumps(_report(seconds, measured, ledger, peer_version), indent=2))
    else:
        ratios = _ratios(measured)
        print(_table(measured, ratios, [*_verdicts(ratios), *_verdicts(ratios, GRANIAN)], ledger))
    return 0 if ledger is None or ledger.settled >= ledger.acked else 2


if __name__ == "__main__":
    sys.exit(main())
