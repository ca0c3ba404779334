"""The benchmark's reference receivers do what ``bench/ingress.py`` says they do.

``bare_receiver.py --journal`` (the durable floor) and ``bare_asgi.py`` (the same on uvicorn,
to a journal or to SQLite) ack only what they have written and refuse a bad signature without
writing it; ``bench/unsynced`` turns off the fsync of the
embedded queue's enqueue writer and of nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SECRET = "bench-secret"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


DURABLE_RECEIVERS = {
    "stdlib-journal": ("bare_receiver.py", "--journal"),
    "asgi-journal": ("bare_asgi.py", "--journal"),
    "asgi-sqlite": ("bare_asgi.py", "--sqlite"),
}


@pytest.fixture(params=sorted(DURABLE_RECEIVERS))
def durable_receiver(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[int, Path]]:
    script, flag = DURABLE_RECEIVERS[request.param]
    secret_file, journal, port = tmp_path / "secret", tmp_path / "journal", _free_port()
    secret_file.write_text(SECRET + "\n", encoding="ascii")
    cmd = [sys.executable, str(BENCH / script), "--port", str(port)]
    cmd += ["--secret-file", str(secret_file), flag, str(journal)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield port, journal
    finally:
        proc.terminate()
        proc.wait(10)


def _post(port: int, body: bytes, delivery: str, *, secret: str = SECRET) -> int:
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {"X-GitHub-Delivery": delivery, "X-Hub-Signature-256": signature}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", "/webhook", body, headers)
        return connection.getresponse().status
    finally:
        connection.close()


def test_the_durable_floor_acks_only_what_its_journal_holds(
    durable_receiver: tuple[int, Path],
) -> None:
    port, journal = durable_receiver
    bodies = {f"delivery-{n}": json.dumps({"n": n, "pad": "x" * n}).encode() for n in range(40)}
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda item: _post(port, item[1], item[0]), bodies.items()))
    refused = _post(port, b'{"forged": true}', "forged", secret="wrong")

    assert statuses == [202] * len(bodies)
    assert refused == 401
    written = _written(journal)
    for delivery, body in bodies.items():
        assert b"%d %s\n" % (len(body), delivery.encode()) + body in written
    assert b"forged" not in written


def _written(journal: Path) -> bytes:
    """What a durable receiver wrote, as ``<length> <delivery>\\n<body>`` records."""
    if journal.read_bytes()[:16] != b"SQLite format 3\x00":
        return journal.read_bytes()
    with sqlite3.connect(journal) as db:
        rows = db.execute("SELECT name, body FROM tasks").fetchall()
    return b"".join(b"%d %s\n" % (len(body), name) + body for name, body in rows)


def _synchronous(what: str, tmp_path: Path, *, unsynced: bool) -> int:
    code = (
        "import sys\n"
        "from looprelay.adapters.sqlite.database import SqliteDatabase\n"
        f"db = SqliteDatabase(sys.argv[1], schema='', what={what!r})\n"
        "print(db.execute('PRAGMA synchronous').rows[0][0])\n"
    )
    env = dict(os.environ)
    if unsynced:
        env["PYTHONPATH"] = str(BENCH / "unsynced")
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / f"{what}.db")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def test_the_unsynced_variant_turns_off_the_enqueues_fsync_only(tmp_path: Path) -> None:
    full, off = 2, 0
    assert _synchronous("embedded queue", tmp_path, unsynced=False) == full
    assert _synchronous("embedded queue", tmp_path, unsynced=True) == off
    assert _synchronous("store", tmp_path, unsynced=True) == full
