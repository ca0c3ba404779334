"""Where one webhook ack's time goes at one connection, stage by stage, in one process.

``bench/ingress.py`` times the ack through HTTP (wrk to ``looprelay up``). This benchmark takes
the same application apart, in-process, one request at a time (each stage's p50 and p99 over
``--count`` requests, after a warm-up), on the same payload and signature:

- ``fdatasync``: ``bare_receiver.Journal.write`` of the body (preallocated file, group commit):
  the durable floor's one sync, called straight from this thread;
- ``commit``: ``SqliteQueue.enqueue_soon(task).result()``: looprelay's durable enqueue, the
  committer thread's SQLite transaction (WAL, ``synchronous=FULL``) and its hand-offs;
- ``admit``: ``Ingress.admit``: signature, JSON parse, envelope, task (no I/O);
- ``app``: the whole ASGI application of ``looprelay up`` called on a uvloop event loop with an
  ASGI scope, as uvicorn calls it, up to the 202's last byte; no socket, no HTTP parsing. The
  queue's dispatchers are not started, so no worker competes (``bench/ingress.py`` has them);
- ``app, unsynced``: the same with the enqueue's fsync off (``bench/unsynced``'s patch):
  what is left of ``app`` without the disk.

``app`` against ``bench/ingress.py``'s looprelay p50 at c=1 is what the HTTP server, the
loopback socket and the competing worker add; ``app`` minus ``commit`` is the application's own
Python. Nothing is asserted.

    .venv/bin/python bench/ackprofile.py [--count 400] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from bare_receiver import Journal  # noqa: E402

from looprelay.app.compose import WEBHOOK_PATH, LocalApp, build_app  # noqa: E402
from looprelay.app.messages import Request  # noqa: E402
from looprelay.config.model import Config  # noqa: E402

FIXTURE = BENCH.parent / "tests" / "fixtures" / "github" / "issue_comment.created.json"
WARMUP = 40


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "p50": round(statistics.median(ms), 3),
        "p99": round(ms[max(0, int(len(ms) * 0.99) - 1)], 3),
    }


def _headers(secret: bytes, body: bytes) -> dict[str, str]:
    digest = hmac.new(secret, body, hashlib.sha256).hexdigest()
    return {
        "content-type": "application/json",
        "x-github-event": "issue_comment",
        "x-github-delivery": str(uuid.uuid4()),
        "x-hub-signature-256": f"sha256={digest}",
        "content-length": str(len(body)),
    }


def _timed(count: int, step: Callable[[], object]) -> list[float]:
    for _ in range(WARMUP):
        step()
    spans = []
    for _ in range(count):
        started = time.perf_counter()
        step()
        spans.append(time.perf_counter() - started)
    return spans


async def _post(app: Any, secret: bytes, body: bytes) -> int:
    """One request through the ASGI app; returns the status once the body was sent."""
    headers = [(k.encode(), v.encode()) for k, v in _headers(secret, body).items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": WEBHOOK_PATH,
        "raw_path": WEBHOOK_PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # a disconnect never comes
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def _app_spans(local: LocalApp, secret: bytes, body: bytes, count: int) -> list[float]:
    for _ in range(WARMUP):
        await _post(local.app, secret, body)
    spans = []
    for _ in range(count):
        started = time.perf_counter()
        status = await _post(local.app, secret, body)
        spans.append(time.perf_counter() - started)
        if status != 202:
            raise SystemExit(f"the webhook answered {status}, not 202")
    return spans


def _local(tmp: Path, name: str) -> tuple[LocalApp, bytes]:
    local = build_app(Config(), os.environ, data_dir=tmp / name)
    secret = (tmp / name / "webhook-secret").read_text(encoding="ascii").strip().encode()
    return local, secret


def _unsynced() -> None:
    """Apply ``bench/unsynced``'s patch to this process (enqueue commits without fsync)."""
    path = BENCH / "unsynced" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("bench_unsynced", path)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def measure(count: int, *, unsynced: bool) -> dict[str, dict[str, float]]:
    """Every stage's p50 and p99 in ms (``unsynced``: only the app without fsync)."""
    body = FIXTURE.read_bytes()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="looprelay-ackprofile-") as tmp_name:
        tmp = Path(tmp_name)
        if unsynced:
            _unsynced()
        local, secret = _local(tmp, "unsynced" if unsynced else "synced")
        try:
            if not unsynced:
                journal = Journal(tmp / "journal")
                results["fdatasync"] = _percentiles(_timed(count, lambda: journal.write(body)))
                results["admit"] = _percentiles(
                    _timed(
                        count,
                        lambda: local.ingress.admit(
                            Request("POST", WEBHOOK_PATH, _headers(secret, body), body)
                        ),
                    )
                )

                def commit() -> None:
                    admitted = local.ingress.admit(
                        Request("POST", WEBHOOK_PATH, _headers(secret, body), body)
                    )
                    assert not hasattr(admitted, "status")
                    local.queue.enqueue_soon(admitted.task).result()  # type: ignore[union-attr]

                results["admit + commit"] = _percentiles(_timed(count, commit))
            spans = uvloop.run(_app_spans(local, secret, body, count))
            results["app, unsynced" if unsynced else "app"] = _percentiles(spans)
        finally:
            local.close()
    return results


def main() -> int:
    """Measure each stage; the unsynced app runs in a child process (the patch is global)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=400, help="measured requests per stage")
    parser.add_argument("--unsynced-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.unsynced_only:
        print(json.dumps(measure(args.count, unsynced=True)))
        return 0
    load = [round(os.getloadavg()[0], 2)]
    results = measure(args.count, unsynced=False)
    child = subprocess.run(
        [sys.executable, __file__, "--unsynced-only", "--count", str(args.count)],
        capture_output=True,
        text=True,
        check=True,
    )
    results |= json.loads(child.stdout.splitlines()[-1])
    load.append(round(os.getloadavg()[0], 2))
    if args.json:
        print(json.dumps({"count": args.count, "load": load, "stages": results}, indent=2))
        return 0
    print(f"{'stage (one request at a time)':<32}{'p50 ms':>8}{'p99 ms':>8}")
    for stage, figures in results.items():
        print(f"{stage:<32}{figures['p50']:>8.3f}{figures['p99']:>8.3f}")
    print(f"n={args.count} each; load average (1 min) {load[0]} -> {load[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
