"""A flood of slow heads against a real ``looprelay up``, held past the watchdog's window
(issue 24, 2): ``up`` keeps acking signed deliveries and does not exit.

Before, 2,100 connections that each sent a ``POST /webhook`` head with ``Content-Length:
1000`` and then nothing filled the connection table for the 60 s body deadline: every
delivery was refused, and so was the watchdog's probe, which went through the same listener,
so ``up`` exited 1 after about 18 s. Here the table is small (``server.maxConnections: 64``),
the flood keeps three times that many such heads open, each one the server drops replaced at
once, for longer than the watchdog needs to give up on a server (``FAILURES`` missed checks
of ``PERIOD_SECONDS``).
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from looprelay.app.watchdog import Watchdog
from looprelay.cli.sender import post_delivery
from looprelay.datadir import WEBHOOK_SECRET_FILE, read_secret
from tests.fake_harness import wait_until
from tests.samples import payload_bytes
from tests.test_up import UpProcess, cli

CAP = 64
FLOOD = 3 * CAP
FLOOD_SECONDS = Watchdog.PERIOD_SECONDS * Watchdog.FAILURES + 8.0
"""Longer than the watchdog takes to stop a server it finds not serving."""
HEAD = b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
COMMENT = payload_bytes("issue_comment.created")
DEADLINE = 20.0


class Flood:
    """``FLOOD`` connections each holding a slow head open; one the server answers or
    closes is replaced at once, until :meth:`stop`."""

    def __init__(self, address: tuple[str, int]) -> None:
        self._address = address
        self._selector = selectors.DefaultSelector()
        self._stopped = threading.Event()
        self.replaced = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        for _ in range(FLOOD):
            self._open()
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(DEADLINE)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()

    def _open(self) -> None:
        conn = socket.create_connection(self._address, timeout=DEADLINE)
        conn.sendall(HEAD)
        conn.setblocking(False)
        self._selector.register(conn, selectors.EVENT_READ)

    def _run(self) -> None:
        while not self._stopped.is_set():
            for key, _ in self._selector.select(timeout=0.2):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                self._selector.unregister(conn)
                conn.close()  # answered (408) or dropped: the flood sends another
                self.replaced += 1
                if not self._stopped.is_set():
                    self._open()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[UpProcess]:
    config = tmp_path / "looprelay.yaml"
    config.write_text(f"server:\n  maxConnections: {CAP}\n")
    process = UpProcess(tmp_path / "data", "--config", str(config))
    yield process
    process.stop()


def _deliver(url: str, secret: bytes) -> str:
    delivery = str(uuid.uuid4())
    status, text = post_delivery(
        url=url, event="issue_comment", body=COMMENT, secret=secret, delivery_id=delivery
    )
    assert status == 202, text
    return delivery


def test_up_serves_signed_deliveries_through_a_flood_of_slow_heads_past_the_watchdog(
    up: UpProcess,
) -> None:
    host, port = up.webhook_url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    address = (host, int(port))
    secret = read_secret(up.data_dir / WEBHOOK_SECRET_FILE).encode()
    flood = Flood(address)
    flood.start()
    acked = []
    try:
        ends = time.monotonic() + FLOOD_SECONDS
        while time.monotonic() < ends:
            dropped = flood.replaced
            acked.append(_deliver(up.webhook_url, secret))
            assert up.proc.poll() is None, up.stderr_path.read_text()[-2000:]
            # The next one goes in once the server has dropped another head: the flood is
            # still pressing on it, whatever the machine's speed.
            wait_until(_dropped_since(flood, dropped), seconds=DEADLINE, what="a head dropped")
    finally:
        flood.stop()
    assert flood.replaced >= FLOOD, "the server should have dropped the flood's oldest heads"
    assert up.proc.poll() is None, up.stderr_path.read_text()[-2000:]
    assert "did not run its health check" not in up.stderr_path.read_text()
    wait_until(lambda: set(acked) <= _settled(up), seconds=DEADLINE, what="every delivery settled")


def _dropped_since(flood: Flood, seen: int) -> Callable[[], bool]:
    """A check that the server has dropped a head of ``flood`` since it had dropped ``seen``."""
    return lambda: flood.replaced > seen


def _settled(up: UpProcess) -> set[str]:
    """The deliveries ``deliveries --json`` lists with an outcome past ``received``."""
    listed = cli("deliveries", "--data", str(up.data_dir), "--json", "--limit", "100000")
    rows = map(json.loads, listed.stdout.splitlines())
    return {row["delivery_id"] for row in rows if row["outcome"] != "received"}
