"""The server's limits, one at a time, on a small application over loopback: each refusal
is an answer the client can read, and the server goes on serving."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator

import pytest

from looprelay.app.asgi import Endpoint, build_asgi
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


def test_when_every_connection_is_busy_a_new_one_is_refused_not_queued(
    server: LocalServer, address: tuple[str, int]
) -> None:
    # 20 connections each mid-head (not idle, so none may be evicted) fill the cap.
    busy = [socket.create_connection(address, timeout=DEADLINE) for _ in range(20)]
    try:
        for conn in busy:
            conn.sendall(b"GET /echo HTTP/1.1\r\n")
        wait_until(lambda: server.busy_connections() == 20, what="the server to see 20 heads")
        with socket.create_connection(address, timeout=DEADLINE) as refused:
            assert refused.recv(100) == b""  # closed at once
    finally:
        for conn in busy:
            conn.close()
    deadline = time.monotonic() + DEADLINE
    while True:  # their slots free up as the server sees them close
        try:
            _serves(address)
            break
        except (ConnectionError, http.client.RemoteDisconnected):
            assert time.monotonic() < deadline
            time.sleep(0.1)
