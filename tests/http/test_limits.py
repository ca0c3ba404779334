"""The server's limits, one at a time, on a small application over loopback: each refusal
is an answer the client can read, and the server goes on serving."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from looprelay.app.asgi import Endpoint, build_asgi
from looprelay.app.budget import BodyBudget
from looprelay.app.messages import Request, Response, json_response
from looprelay.app.server import Limits, LocalServer
from tests.fake_harness import wait_until

DEADLINE = 20.0
CAP = 1000


async def _echo(request: Request) -> Response:
    return json_response(200, {"length": len(request.body)})


@pytest.fixture
def server() -> Iterator[LocalServer]:
    app = build_asgi([Endpoint("/echo", _echo, CAP, body_seconds=0.5)])
    limits = Limits(max_connections=20, keep_alive_seconds=5, head_seconds=5.0, max_headers=20)
    server = LocalServer(app, host="127.0.0.1", port=0, limits=limits)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def slow_body_server() -> Iterator[LocalServer]:
    """The server with a minimum body rate that a stalled body fails within a second."""
    app = build_asgi([Endpoint("/echo", _echo, CAP)])
    limits = Limits(
        max_connections=20,
        keep_alive_seconds=5,
        head_seconds=5.0,
        min_body_rate=1000.0,
        body_grace_seconds=0.3,
    )
    server = LocalServer(app, host="127.0.0.1", port=0, limits=limits)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def address(server: LocalServer) -> tuple[str, int]:
    return server.address


def _exchange(address: tuple[str, int], data: bytes) -> bytes:
    with socket.create_connection(address, timeout=DEADLINE) as conn:
        conn.sendall(data)
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


def _serves(address: tuple[str, int]) -> None:
    connection = http.client.HTTPConnection(*address, timeout=DEADLINE)
    connection.request("POST", "/echo", body=b"abc")
    response = connection.getresponse()
    assert (response.status, response.read()) == (200, b'{"length": 3}')
    connection.close()


def test_a_head_past_the_size_cap_gets_431(address: tuple[str, int]) -> None:
    head = b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    assert _exchange(address, head).startswith(b"HTTP/1.1 431 ")
    _serves(address)


def test_too_many_header_lines_get_431(address: tuple[str, int]) -> None:
    lines = b"".join(f"X-{n}: {n}\r\n".encode() for n in range(30))
    answer = _exchange(address, b"GET /echo HTTP/1.1\r\n" + lines + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b"more than 20 header lines" in answer
    _serves(address)


def test_a_body_that_does_not_arrive_in_time_gets_408(address: tuple[str, int]) -> None:
    started = time.monotonic()
    answer = _exchange(address, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < DEADLINE
    _serves(address)


def test_a_chunked_body_past_the_cap_gets_413_and_the_connection_closes(
    address: tuple[str, int],
) -> None:
    chunk = b"x" * 600
    body = b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2 + b"0\r\n\r\n"
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = _exchange(address, head + body)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in answer.lower()
    _serves(address)


def _post_whole_body_then_read(
    address: tuple[str, int], headers: dict[str, str], body: bytes | Iterator[bytes]
) -> tuple[int, bytes]:
    """POST as ``http.client`` (and ``requests``) do: the whole body is sent before the
    answer is read."""
    connection = http.client.HTTPConnection(*address, timeout=DEADLINE)
    try:
        connection.request("POST", "/echo", body=body, headers=headers, encode_chunked=True)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _chunks() -> Iterator[bytes]:
    for _ in range(64):
        yield b"x" * 65536


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"Connection": "close"}, b"x" * 4_000_000),
        ({"Transfer-Encoding": "chunked"}, None),
        ({"Transfer-Encoding": "chunked", "Connection": "close"}, None),
    ],
    ids=["content-length-connection-close", "chunked", "chunked-connection-close"],
)
def test_an_early_413_reaches_a_client_that_sends_its_whole_body_first(
    address: tuple[str, int], headers: dict[str, str], body: bytes | None
) -> None:
    # Issue 24: the server closed with the body unread, the kernel reset the connection,
    # and the client, still sending, never read its 413.
    status, answer = _post_whole_body_then_read(address, headers, body or _chunks())
    assert status == 413
    assert b"body larger than 1000 bytes" in answer
    _serves(address)


def test_when_every_connection_is_receiving_the_oldest_request_is_dropped_for_a_new_one(
    server: LocalServer, address: tuple[str, int]
) -> None:
    # 20 connections each mid-head fill the cap: none is idle, so the one whose request has
    # been arriving the longest makes room (issue 24: a flood of slow heads refused all).
    busy = [socket.create_connection(address, timeout=DEADLINE) for _ in range(20)]
    try:
        for conn in busy:
            conn.sendall(b"GET /echo HTTP/1.1\r\n")
        wait_until(lambda: server.busy_connections() >= 18, what="the server to see the heads")
        _serves(address)
        assert _read_until_closed(busy[0]).startswith(b"HTTP/1.1 408 ")
    finally:
        for conn in busy:
            conn.close()


def test_a_body_slower_than_the_minimum_rate_gets_408_before_the_body_deadline(
    slow_body_server: LocalServer,
) -> None:
    address = slow_body_server.address
    started = time.monotonic()
    answer = _exchange(address, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\nab")
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"bytes a second" in answer
    assert time.monotonic() - started < DEADLINE
    _serves(address)


def test_slow_heads_and_bodies_at_three_times_the_cap_let_ordinary_requests_through(
    slow_body_server: LocalServer,
) -> None:
    # Issue 24: heads with a Content-Length and then nothing held every slot until the
    # body deadline. Now they drop their own oldest, and a request that arrives at once is
    # never the oldest.
    address = slow_body_server.address
    with ExitStack() as held:
        for n in range(60):
            conn = held.enter_context(socket.create_connection(address, timeout=DEADLINE))
            conn.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            if n % 10 == 9:
                _serves(address)
        for _ in range(5):
            _serves(address)


def _read_until_closed(conn: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    return b"".join(chunks)


KIB = 1024


@pytest.fixture
def budget_server() -> Iterator[LocalServer]:
    """The server with a small body budget: 64 KiB of each body ordinary, 256 KiB of big
    bodies' further bytes in flight at once."""
    budget = BodyBudget(ordinary_body=64 * KIB, ordinary_bytes=1024 * KIB, big_bytes=256 * KIB)
    app = build_asgi([Endpoint("/echo", _echo, 4096 * KIB)], budget=budget)
    limits = Limits(max_connections=20, keep_alive_seconds=30, head_seconds=5.0, min_body_rate=0)
    server = LocalServer(app, host="127.0.0.1", port=0, limits=limits)
    server.start()
    yield server
    server.stop()


def _big_body_started(address: tuple[str, int], sent: int) -> socket.socket:
    """A connection that declared a 1 MiB body and sent ``sent`` bytes of it, then waits."""
    conn = socket.create_connection(address, timeout=DEADLINE)
    conn.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (1024 * KIB))
    conn.sendall(b"x" * sent)
    return conn


def test_big_bodies_past_the_budget_get_503_while_an_ordinary_one_gets_in(
    budget_server: LocalServer,
) -> None:
    # Issue 24: 40 unsigned 24 MB bodies held about 1 GB. Big bodies now share a budget of
    # their own; one that would pass it is refused, and an ordinary body still gets in.
    address = budget_server.address
    holding = _big_body_started(address, 300 * KIB)  # 64 KiB ordinary + 236 KiB big
    try:
        _serves(address)
        wait_until(lambda: _refused_now(address), what="a second big body to be refused")
        _serves(address)
    finally:
        holding.close()
    # Released with the request: a big body fits again.
    wait_until(lambda: not _refused_now(address), what="the budget to be given back")


def _refused_now(address: tuple[str, int]) -> bool:
    """Whether a big body that needs 36 KiB of the big share is refused with 503."""
    with _big_body_started(address, 100 * KIB) as conn:
        conn.settimeout(0.5)
        try:
            answer = conn.recv(65536)
        except TimeoutError:
            return False  # still being read: the budget held it
    if answer.startswith(b"HTTP/1.1 503 "):
        assert b"retry-after: " in answer.lower()
        return True
    raise AssertionError(answer[:200])
