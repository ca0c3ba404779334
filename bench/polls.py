"""Idle long polls on one ``looprelay up``: what a thousand waiting runners cost.

Starts ``looprelay up`` on a fresh data directory, registers one runner, and opens N
connections that each send ``POST /runner/v1/poll`` (``wait_seconds`` 30, so each waits the
server's ``runners.pollWaitSeconds``, 25 s by default). Once they wait it reads the server's
RSS and thread count from ``/proc``, acks a few signed webhooks meanwhile, and collects the
polls' answers (204 each: nothing to lease). Everything stays on 127.0.0.1.

    .venv/bin/python bench/polls.py [--polls 1000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import http.client
import json
import re
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOPRELAY = str(ROOT / ".venv" / "bin" / "looprelay")
FIXTURE = ROOT / "tests" / "fixtures" / "github" / "issue_comment.created.json"
SETTLE_SECONDS = 8.0
"""How long the polls get to be admitted and waiting before the server is measured."""
WEBHOOKS = 5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _usage(pid: int) -> tuple[int, int]:
    """RSS in MiB and threads of process ``pid``."""
    status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    rss = re.search(r"VmRSS:\s+(\d+)", status)
    threads = re.search(r"Threads:\s+(\d+)", status)
    assert rss and threads
    return int(rss[1]) // 1024, int(threads[1])


def _request(port: int, method: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    if response.status >= 300:
        raise SystemExit(f"{method} {path}: {response.status} {answer[:200]!r}")
    return answer


def _wait_healthy(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            _request(port, "GET", "/healthz", b"", {})
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("looprelay up did not answer /healthz within 30 s")


def _register(data: Path, port: int) -> str:
    token = subprocess.run(
        [LOOPRELAY, "runners", "token", "--data", str(data)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    body = json.dumps({"token": token, "name": "bench"}).encode()
    answer = json.loads(
        _request(port, "POST", "/runner/v1/register", body, {"Content-Type": "application/json"})
    )
    return f"Bearer {answer['runner_id']}:{answer['secret']}"


def _ack_seconds(data: Path, port: int) -> float:
    secret = (data / "webhook-secret").read_text(encoding="ascii").strip()
    body = FIXTURE.read_bytes()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "issue_comment",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": "sha256="
        + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
    }
    started = time.monotonic()
    _request(port, "POST", "/webhook", body, headers)
    return time.monotonic() - started


async def _poll(port: int, request: bytes) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        status_line = await reader.readline()
    finally:
        writer.close()
    return status_line.decode("latin-1").split(" ")[1] if status_line else "closed"


async def _measure(pid: int, data: Path, port: int, polls: int) -> dict[str, object]:
    authorization = _register(data, port)
    before = _usage(pid)
    body = json.dumps({"wait_seconds": 30}).encode()
    request = (
        "POST /runner/v1/poll HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Authorization: {authorization}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    waiting = [asyncio.ensure_future(_poll(port, request)) for _ in range(polls)]
    await asyncio.sleep(SETTLE_SECONDS)
    during = _usage(pid)
    answered_early = sum(task.done() for task in waiting)
    acks = [await asyncio.to_thread(_ack_seconds, data, port) for _ in range(WEBHOOKS)]
    statuses = await asyncio.gather(*waiting)
    return {
        "polls": polls,
        "before": {"rss_mib": before[0], "threads": before[1]},
        "waiting": {"rss_mib": during[0], "threads": during[1]},
        "answered_before_measuring": answered_early,
        "webhook_ack_ms": [round(seconds * 1000, 1) for seconds in acks],
        "answers": {status: statuses.count(status) for status in sorted(set(statuses))},
    }


def main() -> None:
    """Measure and print; exits non-zero when ``looprelay up`` fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="looprelay-polls-") as tmp:
        data, port = Path(tmp) / "data", _free_port()
        with (Path(tmp) / "up.log").open("w") as log:
            up = subprocess.Popen(
                [LOOPRELAY, "up", "--data", str(data), "--port", str(port)],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        try:
            _wait_healthy(port)
            report = asyncio.run(_measure(up.pid, data, port, args.polls))
        finally:
            up.send_signal(signal.SIGINT)
            report_exit = up.wait(30)
    report["up_exit"] = report_exit
    if args.json:
        print(json.dumps(report, indent=2))
        return
    before, during = report["before"], report["waiting"]
    print(f"looprelay up before the polls: {before}")
    print(f"with {args.polls} polls waiting: {during}")
    print(f"webhook acks meanwhile, ms: {report['webhook_ack_ms']}")
    print(f"poll answers: {report['answers']}; up exited {report_exit}")


if __name__ == "__main__":
    main()
