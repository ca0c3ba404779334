"""The HTTP server of ``looprelay up``: HTTP/1.1 with keep-alive, a thread per connection.

It turns each request into an ``httpmsg.Request`` for the route owning its path and writes
the ``Response`` back in one send. The request parser is deliberately small: looprelay's
clients (GitHub, ``looprelay send``, runner agents) send a request line, a few headers and a
``Content-Length`` body, and parsing only that is several times cheaper per request than the
stdlib's ``http.server``, whose cost was most of a webhook ack. Bodies are read only up to the
configured cap, so an oversized upload costs nothing but its headers.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from io import BufferedIOBase

from looprelay.httpmsg import Request, Response, json_response

log = logging.getLogger("looprelay.server")

Handler = Callable[[Request], Response]

MAX_LINE_BYTES = 8192
"""Longest request line or header line accepted (431 beyond)."""
MAX_HEADERS = 100
"""Most header lines accepted in one request (431 beyond)."""
IDLE_TIMEOUT_SECONDS = 75.0
"""A connection silent this long (between requests or mid-request) is closed."""
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


class Routes:
    """Exact paths, then path prefixes (``/runner/``), to handlers."""

    def __init__(self, exact: Mapping[str, Handler], prefixes: Mapping[str, Handler]) -> None:
        self._exact = dict(exact)
        self._prefixes = dict(prefixes)

    def find(self, path: str) -> Handler | None:
        """Return the handler owning ``path``, or None."""
        if path in self._exact:
            return self._exact[path]
        for prefix, handler in self._prefixes.items():
            if path.startswith(prefix):
                return handler
        return None


class _BadRequest(Exception):
    """The bytes on the connection are not a request we serve; answer and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Head:
    """A parsed request line and headers."""

    __slots__ = ("headers", "keep_alive", "method", "target")

    def __init__(self, method: str, target: str, headers: dict[str, str], keep_alive: bool) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.keep_alive = keep_alive


def _read_line(rfile: BufferedIOBase) -> bytes:
    line = rfile.readline(MAX_LINE_BYTES + 1)
    if len(line) > MAX_LINE_BYTES:
        raise _BadRequest(431, "request line or header line too long")
    return line


def _read_head(rfile: BufferedIOBase) -> _Head | None:
    """Parse a request line and headers; None when the client closed between requests."""
    line = _read_line(rfile)
    while line in (b"\r\n", b"\n"):  # RFC 9112 §2.2: ignore blank lines before a request
        line = _read_line(rfile)
    if not line:
        return None
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1]:
        raise _BadRequest(400, "malformed request line")
    method, target, version = parts
    if method not in _METHODS:
        raise _BadRequest(501, "method not implemented")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        raw = _read_line(rfile)
        if raw in (b"\r\n", b"\n"):
            break
        if not raw.endswith(b"\n"):
            raise _BadRequest(400, "connection closed inside the headers")
        name, colon, value = raw.decode("latin-1").partition(":")
        if not colon or not name or name != name.strip():
            raise _BadRequest(400, "malformed header line")
        key = name.lower()
        value = value.strip()
        # A repeated header keeps its first value except where RFC 9110 lets lists merge.
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    else:
        raise _BadRequest(431, f"more than {MAX_HEADERS} header lines")
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
    return _Head(method, target, headers, keep_alive)


def _content_length(headers: Mapping[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise _BadRequest(411, "send a Content-Length, not Transfer-Encoding")
    declared = headers.get("content-length", "0")
    if not (declared.isascii() and declared.isdigit()):  # "²".isdigit() is true
        raise _BadRequest(400, "Content-Length must be a decimal number")
    return int(declared)


def _encode(response: Response, *, keep_alive: bool, head_only: bool = False) -> bytes:
    reason = _reason(response.status)
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
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


class _ConnectionHandler(socketserver.StreamRequestHandler):
    """Serves requests on one connection until either side closes it."""

    server: _Server
    timeout = IDLE_TIMEOUT_SECONDS
    disable_nagle_algorithm = True  # a small response must not wait for a delayed ACK
    rbufsize = 64 * 1024

    def handle(self) -> None:
        try:
            while self._serve_one():
                pass
        except (TimeoutError, ConnectionError):
            pass  # an idle or vanished client: nothing to answer

    def _serve_one(self) -> bool:
        try:
            head = _read_head(self.rfile)
            if head is None:
                return False
            length = _content_length(head.headers)
        except _BadRequest as exc:
            self._send(json_response(exc.status, {"error": str(exc)}), keep_alive=False)
            return False
        path, _, query = head.target.partition("?")
        handler = self.server.routes.find(path)
        keep_alive = head.keep_alive
        if length > self.server.max_body_bytes:
            # The body stays unread, so the connection cannot carry another request.
            keep_alive, body = False, b""
        else:
            if length and head.headers.get("expect", "").lower() == "100-continue":
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = self.rfile.read(length) if length else b""
            if len(body) < length:
                # The client stopped sending mid-body: let the handler say what is wrong
                # (the webhook names a truncated delivery), then close.
                keep_alive = False
        if handler is None:
            response = json_response(404, {"error": "no such path"})
        else:
            response = self._call(
                handler,
                Request(
                    method=head.method, path=path, query=query, headers=head.headers, body=body
                ),
            )
        self._send(response, keep_alive=keep_alive, head_only=head.method == "HEAD")
        return keep_alive

    @staticmethod
    def _call(handler: Handler, request: Request) -> Response:
        try:
            return handler(request)
        except Exception:
            log.exception("unhandled error serving %s", request.path)
            return json_response(500, {"error": "internal error"})

    def _send(self, response: Response, *, keep_alive: bool, head_only: bool = False) -> None:
        self.wfile.write(_encode(response, keep_alive=keep_alive, head_only=head_only))


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], max_body_bytes: int) -> None:
        self.routes = Routes({}, {})
        self.max_body_bytes = max_body_bytes
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _ConnectionHandler)


class EmbeddedHttpServer:
    """Serves ``routes`` on ``host:port`` in a background thread."""

    def __init__(self, *, host: str, port: int, max_body_bytes: int) -> None:
        """Bind now, so the real port is known before handlers are built.

        Raises ``OSError`` when the address is taken or not allowed.
        """
        self._server = _Server((host, port), max_body_bytes)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port (useful with port 0)."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self, routes: Routes) -> None:
        """Serve ``routes`` in a background thread."""
        self._server.routes = routes
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="http-server",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
