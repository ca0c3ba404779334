"""The embedded HTTP server, spoken to with raw bytes the way clients (and attackers) do."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from looprelay.adapters.http_server import Deferred, EmbeddedHttpServer, Reply, Routes
from looprelay.adapters.http_wire import MAX_HEADERS
from looprelay.httpmsg import Request, Response, json_response

MAX_BODY = 1024


def _echo(request: Request) -> Response:
    return json_response(
        200,
        {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "body": request.body.decode(),
            "agent": request.headers.get("user-agent"),
        },
    )


def _explode(request: Request) -> Response:
    raise RuntimeError("handler bug")


@pytest.fixture
def address() -> Iterator[tuple[str, int]]:
    server = EmbeddedHttpServer(host="127.0.0.1", port=0, max_body_bytes=MAX_BODY)
    server.start(Routes({"/boom": _explode}, {"/echo": _echo}))
    yield server.address
    server.stop()


class Connection:
    """A raw client connection that reads whole responses (status line, headers, body)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=5)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split(" ")[1]), headers, body

    def closed_by_server(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buffer += chunk


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    return (head + "".join(f"{line}\r\n" for line in extra) + "\r\n").encode() + body


def test_one_connection_carries_many_requests_with_their_bodies_and_queries(
    address: tuple[str, int],
) -> None:
    client = Connection(address)
    # Two requests in one send (pipelined), then a third.
    client.send(_post("/echo/a?x=1", b"first") + _post("/echo/b", b"second"))
    client.send(b"GET /echo/c HTTP/1.1\r\nHost: x\r\nUser-Agent: probe\r\n\r\n")

    answers = [client.response() for _ in range(3)]

    assert [a[0] for a in answers] == [200, 200, 200]
    assert b'"path": "/echo/a", "query": "x=1", "body": "first"' in answers[0][2]
    assert b'"body": "second"' in answers[1][2]
    assert b'"agent": "probe"' in answers[2][2]
    assert all("connection" not in a[1] for a in answers)


def test_http_1_0_gets_one_answer_and_a_closed_connection(address: tuple[str, int]) -> None:
    client = Connection(address)
    client.send(b"GET /echo HTTP/1.0\r\n\r\n")
    status, headers, _ = client.response()
    assert (status, headers["connection"]) == (200, "close")
    assert client.closed_by_server()


def test_an_unknown_path_is_404_and_its_body_does_not_poison_the_next_request(
    address: tuple[str, int],
) -> None:
    client = Connection(address)
    client.send(_post("/nowhere", b"GET /echo HTTP/1.1\r\n\r\n") + _post("/echo", b"ok"))
    assert client.response()[0] == 404
    status, _, body = client.response()
    assert (status, b'"body": "ok"' in body) == (200, True)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /echo HTTP/2.0\r\n\r\n", 400),
        (b"BREW /echo HTTP/1.1\r\n\r\n", 501),
        (b"GET /echo HTTP/1.1\r\n folded: header\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400),
        (b"GET /echo HTTP/1.1\r\nX-Long: " + b"a" * 10_000 + b"\r\n\r\n", 431),
        (b"GET /echo HTTP/1.1\r\n" + b"X-Many: 1\r\n" * (MAX_HEADERS + 1) + b"\r\n", 431),
    ],
    ids=["chunked", "no-version", "http2", "method", "folded", "negative", "long", "many"],
)
def test_a_request_it_cannot_serve_gets_a_json_error_and_a_closed_connection(
    address: tuple[str, int], raw: bytes, status: int
) -> None:
    client = Connection(address)
    client.send(raw)
    answer, headers, body = client.response()
    assert (answer, headers["connection"]) == (status, "close")
    assert body.startswith(b'{"error": ')
    assert client.closed_by_server()


def test_an_oversized_body_is_not_read_and_the_connection_is_closed_after_the_answer(
    address: tuple[str, int],
) -> None:
    client = Connection(address)
    client.send(f"POST /echo HTTP/1.1\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode())
    status, headers, body = client.response()
    # The handler decides what an oversized request means; it sees no body.
    assert (status, headers["connection"], b'"body": ""' in body) == (200, "close", True)


def test_a_client_expecting_100_continue_is_told_to_go_on(address: tuple[str, int]) -> None:
    client = Connection(address)
    client.send(b"POST /echo HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    assert client.response()[0] == 100
    client.send(b"data")
    status, _, body = client.response()
    assert (status, b'"body": "data"' in body) == (200, True)


def test_a_handler_that_raises_answers_500_and_the_connection_lives_on(
    address: tuple[str, int],
) -> None:
    client = Connection(address)
    client.send(b"GET /boom HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\n\r\n")
    assert client.response()[0] == 500
    assert client.response()[0] == 200


def test_head_gets_the_headers_without_the_body(address: tuple[str, int]) -> None:
    client = Connection(address)
    client.send(b"HEAD /echo HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\n\r\n")
    while client.buffer.count(b"\r\n\r\n") < 2:
        client._fill()
    head, rest = client.buffer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: " in head
    # The next bytes are the GET's answer, not a body for the HEAD.
    assert rest.startswith(b"HTTP/1.1 200 OK")


# -- Deferred handlers, watched sockets, and clients that pipeline or leave -----------------

WAIT_SECONDS = 5.0
"""Longest wait for something that happens in milliseconds; reaching it fails the test."""


def _now(request: Request, reply: Reply) -> None:
    reply(json_response(200, {"path": request.path, "query": request.query}))


def _later(request: Request, reply: Reply) -> None:
    # Answered from another thread after the handler has returned.
    threading.Timer(0.05, reply, [json_response(200, {"answered": "later"})]).start()


def _raise(request: Request, reply: Reply) -> None:
    raise RuntimeError("deferred handler bug")


def _twice(request: Request, reply: Reply) -> None:
    reply(json_response(200, {"answer": "first"}))
    reply(json_response(201, {"answer": "second"}))


class Rig:
    """A server with Deferred routes, a blocking one a test can watch, and replies held for
    the test to give."""

    def __init__(self) -> None:
        self.server = EmbeddedHttpServer(host="127.0.0.1", port=0, max_body_bytes=MAX_BODY)
        self.held: queue.SimpleQueue[Reply] = queue.SimpleQueue()
        self.serving = threading.Event()
        self.served = threading.Event()
        self.server.start(
            Routes(
                {
                    "/now": Deferred(_now),
                    "/later": Deferred(_later),
                    "/raise": Deferred(_raise),
                    "/twice": Deferred(_twice),
                    "/hold": Deferred(lambda request, reply: self.held.put(reply)),
                    "/slow": self._slow,
                },
                {"/echo": _echo},
            )
        )
        self.address = self.server.address

    def _slow(self, request: Request) -> Response:
        self.serving.set()
        time.sleep(0.3)
        self.served.set()
        return json_response(200, {"slow": True})


@pytest.fixture
def rig() -> Iterator[Rig]:
    rig = Rig()
    yield rig
    rig.server.stop()


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def _json(body: bytes) -> Any:
    return json.loads(body)


def test_a_deferred_answer_given_later_from_another_thread_reaches_the_client(rig: Rig) -> None:
    client = Connection(rig.address)
    client.send(_get("/later"))
    status, _, body = client.response()
    assert (status, _json(body)) == (200, {"answered": "later"})
    # The connection carries on, both with a request sent after and one sent ahead.
    client.send(_get("/now?n=1"))
    assert _json(client.response()[2]) == {"path": "/now", "query": "n=1"}
    client.send(_get("/later") + _get("/now?n=2"))
    assert _json(client.response()[2]) == {"answered": "later"}
    assert _json(client.response()[2]) == {"path": "/now", "query": "n=2"}


def test_a_deferred_handler_that_raises_answers_500_and_the_connection_lives_on(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    client = Connection(rig.address)
    client.send(_get("/raise") + _get("/now?after=raise"))
    status, headers, _ = client.response()
    assert (status, "connection" in headers) == (500, False)
    assert _json(client.response()[2]) == {"path": "/now", "query": "after=raise"}
    assert "unhandled error serving /raise" in caplog.text


def test_a_second_reply_to_one_request_is_dropped_and_the_next_request_gets_its_own(
    rig: Rig,
) -> None:
    client = Connection(rig.address)
    client.send(_get("/twice"))
    status, _, body = client.response()
    assert (status, _json(body)) == (200, {"answer": "first"})
    client.send(_get("/now?after=twice"))
    status, _, body = client.response()
    assert (status, _json(body)) == (200, {"path": "/now", "query": "after=twice"})
    assert client.buffer == b""


def test_a_watched_socket_is_read_on_the_loop_and_a_closed_ones_number_can_be_watched_again(
    rig: Rig,
) -> None:
    ours, theirs = socket.socketpair()
    got: queue.SimpleQueue[tuple[bytes, str]] = queue.SimpleQueue()

    def read(sock: socket.socket) -> None:
        data = sock.recv(100)
        if data == b"bye":
            sock.close()  # before telling the test, which then expects the number free
        got.put((data, threading.current_thread().name))

    rig.server.watch(ours, functools.partial(read, ours))
    theirs.sendall(b"ping")
    assert got.get(timeout=WAIT_SECONDS) == (b"ping", "http-server")

    number = ours.fileno()
    with _lowest_free_descriptor(number):
        theirs.sendall(b"bye")
        assert got.get(timeout=WAIT_SECONDS)[0] == b"bye"
        theirs.close()
        again, other = socket.socketpair()
    assert again.fileno() == number  # the closed socket's number, reused
    with again, other:
        rig.server.watch(again, functools.partial(read, again))
        other.sendall(b"again")
        assert got.get(timeout=WAIT_SECONDS) == (b"again", "http-server")
        # The server still serves HTTP.
        client = Connection(rig.address)
        client.send(_get("/now"))
        assert client.response()[0] == 200


def test_thousands_of_requests_sent_in_one_go_are_answered_in_order(rig: Rig) -> None:
    count = 2000
    client = Connection(rig.address)
    client.send(b"".join(_get(f"/now?n={n}") for n in range(count)))
    queries = [_json(client.response()[2])["query"] for _ in range(count)]
    assert queries == [f"n={n}" for n in range(count)]
    # A second connection is still served.
    other = Connection(rig.address)
    other.send(_get("/echo"))
    assert other.response()[0] == 200


@pytest.mark.parametrize("leaving", ["close", "reset"])
def test_a_client_that_leaves_while_its_request_is_served_does_not_disturb_the_next(
    rig: Rig, leaving: str
) -> None:
    client = Connection(rig.address)
    if leaving == "reset":  # close with RST instead of FIN
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.send(_get("/slow"))
    assert rig.serving.wait(WAIT_SECONDS)
    client.sock.close()
    assert rig.served.wait(WAIT_SECONDS)

    for path in ("/slow", "/now", "/echo"):
        after = Connection(rig.address)
        after.send(_get(path) + _get("/now?n=2"))
        assert [after.response()[0] for _ in range(2)] == [200, 200]


def test_a_reply_given_later_on_the_loop_serves_the_requests_sent_ahead(rig: Rig) -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)

    held: list[Reply] = []

    def answer_held() -> None:
        ours.recv(100)
        held[0](json_response(200, {"answered": "on the loop"}))

    with ours, theirs:
        rig.server.watch(ours, answer_held)
        client = Connection(rig.address)
        client.sock.settimeout(2)  # the answers are due in milliseconds
        client.send(_get("/hold") + _get("/now?n=2"))
        held.append(rig.held.get(timeout=10))  # /hold is being served, /now waits behind it
        theirs.sendall(b"go")  # the loop itself now answers /hold
        assert _json(client.response()[2]) == {"answered": "on the loop"}
        assert _json(client.response()[2]) == {"path": "/now", "query": "n=2"}


def test_a_watched_socket_closed_elsewhere_does_not_stop_the_server(rig: Rig) -> None:
    ours, theirs = socket.socketpair()
    got = threading.Event()

    def read() -> None:
        ours.recv(100)
        got.set()

    rig.server.watch(ours, read)
    theirs.sendall(b"ping")
    assert got.wait(WAIT_SECONDS)
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.settimeout(WAIT_SECONDS)
    with _lowest_free_descriptor(ours.fileno()), client, theirs:
        ours.close()  # the accepted connection gets this number
        try:
            client.connect(rig.address)
            client.sendall(_get("/now"))
            answer = client.recv(65536)
        except OSError:  # reset or timed out: no answer
            answer = b""
        assert answer.startswith(b"HTTP/1.1 200 OK"), answer


@contextlib.contextmanager
def _lowest_free_descriptor(number: int) -> Iterator[None]:
    """Hold every free descriptor below ``number``, so the next socket opened in this
    process after ``number`` is closed gets ``number``."""
    held: list[int] = []
    try:
        while (descriptor := os.open(os.devnull, os.O_RDONLY)) < number:
            held.append(descriptor)
        os.close(descriptor)
        yield
    finally:
        for descriptor in held:
            os.close(descriptor)
