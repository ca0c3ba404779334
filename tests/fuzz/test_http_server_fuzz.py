"""Property-based tests of ``looprelay up``'s HTTP stack with raw bytes on a loopback socket.

Whatever a client sends (a malformed request line, a flood of headers, chunked bodies, an
oversize or nonsense Content-Length), the server answers or closes the connection, never
hangs, never answers 500, and goes on serving the next well-formed delivery.
"""

from __future__ import annotations

import http.client
import io
import json
import re
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from looprelay.app.local import LocalStack
from looprelay.config.model import Config, ServerConfig, WebhookConfig
from looprelay.core.signature import sign_body
from looprelay.datadir import WEBHOOK_SECRET_FILE
from tests.fuzz.budget import examples
from tests.samples import payload_bytes

SECRET = b"raw-socket-secret"
CAP = 32_768
TIMEOUT_SECONDS = 10.0
"""A read that waits this long means the server hung; no test waits for it otherwise."""
COMMENT = payload_bytes("issue_comment.created")
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """`looprelay up`'s application and server, in process, on a free port."""
    data_dir: Path = tmp_path_factory.mktemp("raw") / "data"
    data_dir.mkdir(mode=0o700)
    (data_dir / WEBHOOK_SECRET_FILE).write_bytes(SECRET)
    (data_dir / WEBHOOK_SECRET_FILE).chmod(0o600)
    config = Config(server=ServerConfig(port=0), webhook=WebhookConfig(max_body_bytes=CAP))
    stack = LocalStack(config, data_dir=data_dir, environ={})
    stack.start()
    host, port = stack.base_url.removeprefix("http://").rsplit(":", 1)
    yield host, int(port)
    stack.stop()


def _delivery() -> bytes:
    """A well-formed signed delivery, a new id each time."""
    headers = {
        "Host": "127.0.0.1",
        "Content-Type": "application/json",
        "X-GitHub-Event": "issue_comment",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": sign_body(COMMENT, SECRET),
        "Content-Length": str(len(COMMENT)),
    }
    head = "POST /webhook HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"\r\n" + COMMENT


def _exchange(address: tuple[str, int], data: bytes) -> bytes:
    """Send ``data``, half-close, and read until the server closes (a timeout fails)."""
    with socket.create_connection(address, timeout=TIMEOUT_SECONDS) as conn:
        try:
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
        except OSError:  # reset, broken pipe, or not connected any more
            pass  # the server may refuse and close before reading everything: that is closing
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass  # closing, abruptly
        return b"".join(chunks)


class _Received(io.BytesIO):
    def close(self) -> None:
        """http.client closes its file after each response; the next one reads on."""


class _Stream:
    """A socket stand-in for http.client: the bytes one connection received."""

    def __init__(self, data: bytes) -> None:
        self._file = _Received(data)

    def makefile(self, mode: str) -> io.BytesIO:
        return self._file


def _responses(data: bytes, methods: list[str]) -> list[tuple[int, bytes]]:
    """Parse the responses to requests made with ``methods``, as a keep-alive client would."""
    stream, parsed = _Stream(data), []
    for method in methods:
        response = http.client.HTTPResponse(stream, method=method)  # type: ignore[arg-type]
        try:
            response.begin()
        except http.client.RemoteDisconnected:
            break
        parsed.append((response.status, response.read()))
    return parsed


def _serves_a_delivery(address: tuple[str, int]) -> None:
    [(status, body)] = _responses(_exchange(address, _delivery()), ["POST"])
    assert status == 202, body
    assert json.loads(body)["status"] == "queued"


# -- raw request bytes ----------------------------------------------------------------------

_TOKEN = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
REQUEST_LINES = st.one_of(
    st.builds(
        "{} {} {}".format,
        st.sampled_from(["POST", "GET", "PUT", "PATCH", "DELETE", "OPTIONS", "BREW", "post"]),
        st.sampled_from(["/webhook", "/webhook?x=1", "/healthz", "/", "*", "/nope", "webhook"]),
        st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/0.9", "HTTP/1.1x", "FTP/1"]),
    ).map(str.encode),
    st.sampled_from(
        [
            b"",
            b"GARBAGE",
            b"POST",
            b"POST /webhook",
            b"POST  /webhook  HTTP/1.1",
            b"POST /webhook HTTP/1.1 extra",
            b"POST /" + b"a" * 70_000 + b" HTTP/1.1",
            b"\x00\x01\x02\xff",
            b"POST /webh\xc3\xb6ok HTTP/1.1",
        ]
    ),
    st.binary(max_size=60),
)
FRAMING = st.sampled_from(
    [
        [],
        [b"Content-Length: 0"],
        [b"Content-Length: 5"],
        [b"Content-Length: -1"],
        [b"Content-Length: +5"],
        [b"Content-Length: abc"],
        [b"Content-Length: 5, 5"],
        [b"Content-Length:  7 "],
        [b"Content-Length: 5", b"Content-Length: 50"],
        [b"Content-Length: 99999999999999999999999"],
        [b"Content-Length: " + b"9" * 5000],
        [f"Content-Length: {CAP + 1}".encode()],
        [f"Content-Length: {30 * 1024 * 1024}".encode()],
        [b"Transfer-Encoding: chunked"],
        [b"Transfer-Encoding: chunked", b"Content-Length: 5"],
        [b"Transfer-Encoding: gzip, chunked"],
    ]
)
HEADER_LINES = st.lists(
    st.one_of(
        st.builds(
            "{}: {}".format,
            st.sampled_from(
                [
                    "Content-Type",
                    "X-GitHub-Event",
                    "X-GitHub-Delivery",
                    "X-Hub-Signature-256",
                    "Connection",
                    "Expect",
                    "Host",
                ]
            ),
            st.one_of(
                st.sampled_from(
                    ["application/json", "close", "keep-alive", "100-continue", "ping", ""]
                ),
                _TOKEN,
            ),
        ).map(str.encode),
        st.sampled_from(
            [
                b"no colon here",
                b" folded continuation",
                b": empty name",
                b"X-Long: " + b"v" * 70_000,
                b"X-Bin: \xff\xfe\x00",
            ]
        ),
        st.binary(max_size=30).filter(lambda line: b"\n" not in line),
    ),
    max_size=6,
)
BODIES = st.one_of(
    st.binary(max_size=200),
    st.just(COMMENT[:CAP]),
    st.sampled_from([b"5\r\nhello\r\n0\r\n\r\n", b"zz\r\n", b"{}", b"x" * (CAP + 10)]),
)


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    """Bytes that may or may not be an HTTP request; a header flood now and then."""
    lines = [draw(REQUEST_LINES), *draw(FRAMING), *draw(HEADER_LINES)]
    if draw(st.integers(0, 9)) == 0:
        lines += [f"X-Flood-{n}: {n}".encode() for n in range(150)]
    draw(st.randoms()).shuffle(lines[1:])  # framing headers anywhere among the others
    ending = draw(st.sampled_from([b"\r\n", b"\n"]))
    return ending.join(lines) + ending + ending + draw(BODIES)


class TestRawBytes:
    @examples(1.2)
    @given(data=raw_requests())
    def test_the_server_answers_or_closes_and_then_serves_the_next_delivery(
        self, address: tuple[str, int], data: bytes
    ) -> None:
        answer = _exchange(address, data)
        statuses = [int(code) for code in _STATUS_LINE.findall(answer)]
        assert 500 not in statuses, answer[:300]
        _serves_a_delivery(address)


WELL_FRAMED = st.builds(
    lambda method, path, headers, body: (
        method,
        f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode()
        + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
    ),
    st.sampled_from(["POST", "GET", "PUT", "DELETE", "OPTIONS"]),
    st.sampled_from(["/webhook", "/healthz", "/nope", "/webhook?q=1"]),
    st.dictionaries(
        st.sampled_from(["Content-Type", "X-GitHub-Event", "X-GitHub-Delivery", "X-Other"]),
        _TOKEN,
        max_size=4,
    ),
    st.binary(max_size=CAP),
)


class TestKeepAlive:
    @examples(0.8)
    @given(first=WELL_FRAMED)
    def test_a_well_framed_request_of_any_kind_leaves_the_connection_usable(
        self, address: tuple[str, int], first: tuple[str, bytes]
    ) -> None:
        method, data = first
        answers = _responses(_exchange(address, data + _delivery()), [method, "POST"])
        assert len(answers) == 2, answers
        assert answers[0][0] < 500
        assert answers[1][0] == 202, answers[1]


class TestFraming:
    """Where a request ends is never in doubt: what cannot be framed is refused and closed."""

    @pytest.mark.parametrize("declared", [b"-5", b"+5", b"abc", b"5\r\nContent-Length: 5"])
    def test_an_invalid_or_repeated_content_length_is_refused_and_the_connection_closed(
        self, address: tuple[str, int], declared: bytes
    ) -> None:
        smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        data = b"POST /webhook HTTP/1.1\r\nContent-Length: " + declared + b"\r\n\r\n" + smuggled
        answers = _responses(_exchange(address, data), ["POST", "GET"])
        assert [status for status, _ in answers] == [400]

    def test_a_head_request_leaves_the_connection_usable(self, address: tuple[str, int]) -> None:
        head = b"HEAD /webhook HTTP/1.1\r\nHost: x\r\n\r\n"
        answers = _responses(_exchange(address, head + _delivery()), ["HEAD", "POST"])
        assert [status for status, _ in answers] == [405, 202]

    def test_a_content_length_of_a_non_ascii_digit_gets_400(self, address: tuple[str, int]) -> None:
        answer = _exchange(address, b"POST /webhook HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 ")
