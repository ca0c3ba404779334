"""HTTP/1.1 on the wire for the embedded server: request heads parsed out of a buffer, and
responses encoded in one piece.

The parser is deliberately small: looprelay's clients (GitHub, ``looprelay send``, runner
agents) send a request line, a few headers and a ``Content-Length`` body. It works on the
bytes received so far, so the server never blocks on a slow client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus

from looprelay.httpmsg import Response

MAX_LINE_BYTES = 8192
"""Longest request line or header line accepted, line ending included (431 beyond)."""
MAX_HEADERS = 100
"""Most header lines accepted in one request (431 beyond)."""
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class BadRequest(Exception):
    """The bytes on the connection are not a request we serve; answer ``status`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Head:
    """A parsed request line and headers (names lower case)."""

    method: str
    target: str
    headers: dict[str, str]
    keep_alive: bool
    content_length: int

    @property
    def expects_continue(self) -> bool:
        """Whether the client waits for ``100 Continue`` before sending its body."""
        return self.headers.get("expect", "").lower() == "100-continue"


def take_head(buffer: bytearray) -> Head | None:
    """Parse and remove one request head from the front of ``buffer``.

    Blank lines before the request line are dropped (RFC 9112 §2.2); lines may end in CRLF or
    a bare LF. Returns None while the head is incomplete, leaving ``buffer`` as it was.
    Raises ``BadRequest`` for a head that cannot be served (400), is too large (431), or uses a
    method (501) or framing (411) the server does not speak.
    """
    end = buffer.find(b"\r\n\r\n")
    if end > 0 and buffer[0] != 0x0D and buffer[0] != 0x0A:
        # The usual head, CRLF throughout and nothing before it, is split in one go; the
        # line and count limits are checked on the result, so it takes nothing the slow
        # path would refuse.
        lines = bytes(buffer[:end]).split(b"\r\n")
        if _within_limits(lines):
            del buffer[: end + 4]
            return _parse(lines)
    return _take_head_by_lines(buffer)


def _within_limits(lines: list[bytes]) -> bool:
    """No line too long, not too many, and no bare LF (which would end a line earlier)."""
    return len(lines) <= MAX_HEADERS + 1 and all(
        len(line) + 2 <= MAX_LINE_BYTES and b"\n" not in line for line in lines
    )


def _take_head_by_lines(buffer: bytearray) -> Head | None:
    start = _skip_blank_lines(buffer)
    lines: list[bytes] = []
    position = start
    while True:
        end = buffer.find(b"\n", position)
        if end < 0:
            if len(buffer) - position > MAX_LINE_BYTES:
                raise BadRequest(431, "request line or header line too long")
            if start:
                del buffer[:start]
            return None
        if end + 1 - position > MAX_LINE_BYTES:
            raise BadRequest(431, "request line or header line too long")
        line = bytes(buffer[position:end])
        position = end + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            break
        if len(lines) > MAX_HEADERS:
            raise BadRequest(431, f"more than {MAX_HEADERS} header lines")
        lines.append(line)
    del buffer[:position]
    return _parse(lines)


def _skip_blank_lines(buffer: bytearray) -> int:
    start = 0
    while buffer.startswith(b"\r\n", start) or buffer.startswith(b"\n", start):
        start += 2 if buffer[start] == 0x0D else 1
    return start


def _parse(lines: list[bytes]) -> Head:
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1]:
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if method not in METHODS:
        raise BadRequest(501, "method not implemented")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        name, colon, value = raw.decode("latin-1").partition(":")
        if not colon or not name or name != name.strip():
            raise BadRequest(400, "malformed header line")
        key = name.lower()
        value = value.strip()
        # A repeated header keeps every value, comma-joined as RFC 9110 merges lists; a
        # repeated Content-Length thereby becomes invalid rather than ambiguous.
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
    return Head(method, target, headers, keep_alive, _content_length(headers))


def _content_length(headers: Mapping[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise BadRequest(411, "send a Content-Length, not Transfer-Encoding")
    declared = headers.get("content-length", "0")
    if not (declared.isascii() and declared.isdigit()):  # "²".isdigit() is true
        raise BadRequest(400, "Content-Length must be a decimal number")
    return int(declared)


def encode_response(response: Response, *, keep_alive: bool, head_only: bool = False) -> bytes:
    """The status line, headers and (unless answering HEAD) body of ``response``."""
    lines = [
        f"HTTP/1.1 {response.status} {_reason(response.status)}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
    ]
    lines.extend(f"{name}: {value}" for name, value in response.headers.items())
    if not keep_alive:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"
