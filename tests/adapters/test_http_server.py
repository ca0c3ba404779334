"""The embedded HTTP server, spoken to with raw bytes the way clients (and attackers) do."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from looprelay.adapters.http_server import EmbeddedHttpServer, Routes
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
