"""The HTTP server of ``looprelay up``: HTTP/1.1 with keep-alive on one selector loop
(``http_loop``), serving ``Routes`` (``http_routes``).

One loop thread rather than a thread per connection: in one Python process, threads
contending for the interpreter cost more than a webhook ack itself. A ``Deferred`` handler
(the webhook) answers when its enqueue is durable without holding a thread; blocking handlers
(a long poll, the worker's routing) run on threads of their own.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from looprelay.adapters.http_loop import ServerLoop
from looprelay.adapters.http_routes import Deferred, DeferredHandle, Handler, Reply, Routes

__all__ = ["Deferred", "DeferredHandle", "EmbeddedHttpServer", "Handler", "Reply", "Routes"]

_BACKLOG = 512


class EmbeddedHttpServer:
    """Serves ``routes`` on ``host:port`` from a background thread."""

    def __init__(self, *, host: str, port: int, max_body_bytes: int) -> None:
        """Bind now, so the real port is known before handlers are built.

        Raises ``OSError`` when the address is taken or not allowed.
        """
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(_BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._address = listener.getsockname()[:2]
        self._loop = ServerLoop(listener, max_body_bytes)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port (useful with port 0)."""
        host, port = self._address
        return str(host), int(port)

    def start(self, routes: Routes) -> None:
        """Serve ``routes`` from a background thread."""
        self._loop.routes = routes
        self._thread = threading.Thread(target=self._loop.run, name="http-server", daemon=True)
        self._thread.start()

    def watch(self, sock: socket.socket, on_readable: Callable[[], None]) -> None:
        """Have the loop call ``on_readable()`` whenever ``sock`` turns readable, until
        ``sock`` is closed; callable from any thread, before or after :meth:`start`.

        ``on_readable`` runs on the loop: it must not block.
        """
        self._loop.watch(sock, on_readable)

    def stop(self) -> None:
        """Stop accepting, close every connection and the socket."""
        if self._thread is None:
            self._loop.shut_down()
            return
        self._loop.stop()
        self._thread.join(5)
