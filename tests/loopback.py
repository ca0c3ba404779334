"""A loopback HTTP server for the fakes: real HTTP on 127.0.0.1, on a free port."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    # socketserver's default backlog of 5 refuses a burst of connections (15 webhooks at
    # once), which the clients then retry after a backoff: a delay no real service adds.
    request_queue_size = 128


class LoopbackServer:
    """A ThreadingHTTPServer on 127.0.0.1 and a free port, serving from a daemon thread.

    The port is bound on construction, so ``url`` is known before ``start``.
    """

    def __init__(
        self, handler: type[BaseHTTPRequestHandler], *, poll_interval: float = 0.02
    ) -> None:
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": poll_interval}, daemon=True
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        """Serve in the background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port; waits at most 5 s for the serving thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
