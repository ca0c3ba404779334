"""The HTTP server of ``looprelay up``: stdlib, threaded, keep-alive, framework-free.

It turns each request into an ``httpmsg.Request`` for the route owning its path and writes
the ``Response`` back. Bodies are read only up to the configured cap, so an oversized upload
costs nothing but its headers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from looprelay.httpmsg import Request, Response, json_response, lower_headers

log = logging.getLogger("looprelay.server")

Handler = Callable[[Request], Response]


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


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a webhook burst reuses connections
    # Without TCP_NODELAY a small response waits ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        """Access lines stay out of the JSON log; handlers log what matters."""

    def _serve(self) -> None:
        split = urlsplit(self.path)
        handler = self.server.routes.find(split.path)
        if handler is None:
            self._discard_body()
            self._write(json_response(404, {"error": "no such path"}))
            return
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            self._write(json_response(411, {"error": "send a Content-Length"}))
            return
        declared = self.headers.get("Content-Length", "0")
        length = int(declared) if declared.isdigit() else 0
        if length > self.server.max_body_bytes:
            self.close_connection = True  # the unread body must not be parsed as a request
            body = b""
        else:
            body = self.rfile.read(length) if length else b""
        request = Request(
            method=self.command,
            path=split.path,
            query=split.query,
            headers=lower_headers(self.headers.items()),
            body=body,
        )
        try:
            response = handler(request)
        except Exception:
            log.exception("unhandled error serving %s", split.path)
            response = json_response(500, {"error": "internal error"})
        self._write(response)

    def _discard_body(self) -> None:
        declared = self.headers.get("Content-Length", "0")
        length = int(declared) if declared.isdigit() else 0
        if 0 < length <= self.server.max_body_bytes:
            self.rfile.read(length)
        elif length:
            self.close_connection = True

    def _write(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(response.body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], max_body_bytes: int) -> None:
        self.routes = Routes({}, {})
        self.max_body_bytes = max_body_bytes
        super().__init__(address, _RequestHandler)


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
