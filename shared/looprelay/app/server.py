"""The server of ``looprelay up``: uvicorn (httptools parser, uvloop) with explicit limits.

uvicorn parses HTTP/1.1 (pipelining, bad framing, oversized numbers: httptools' llhttp) and
closes keep-alive connections idle for ``KEEP_ALIVE_SECONDS``. ``protocol.GuardedProtocol``
adds the limits it lacks (docs/decisions/0007): a deadline for each request head, a cap on its
size, a cap on open connections that evicts the oldest idle one first. The application caps
each body while it streams (``app.asgi``).

The socket is bound when :class:`LocalServer` is made, so the port is known (and a taken one
refused) before anything is started.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import uvicorn
import uvloop

from looprelay.app.protocol import ConnectionGuard, GuardedProtocol
from looprelay.app.watchdog import Watchdog

log = logging.getLogger("looprelay.server")

FD_CEILING = 1_048_576
"""Where the descriptor limit is raised to when its hard limit is unlimited."""
KEEP_ALIVE_SECONDS = 15
"""A connection with no request under way is closed after this long without a byte."""
HEAD_SECONDS = 10.0
"""Longest a request head (request line and headers) may take to arrive once it began."""
MAX_HEAD_BYTES = 64 * 1024
"""Largest request head accepted (431 beyond)."""
MAX_HEADERS = 100
"""Most header lines accepted in one request (431 beyond)."""
BACKLOG = 2048
"""Connections the kernel holds for ``accept``."""
GRACEFUL_SECONDS = 5.0
"""On stop, how long requests under way (a long poll) may finish before they are cancelled."""
MIN_BODY_RATE = 4096.0
"""Bytes a second a request body must average once ``BODY_GRACE_SECONDS`` have passed since
its head (a slower one gets 408): GitHub sends a delivery at once."""
BODY_GRACE_SECONDS = 5.0
"""How long a body may take before its rate is looked at."""
RESERVE_FRACTION = 0.125
"""The share of the connection cap that requests still arriving may never hold: room for
idle keep-alive connections, long polls and new arrivals while a flood of slow ones
rotates through the rest."""
FD_RESERVE = 256
"""Descriptors kept free of connections: the databases, the log, the process' own pipes."""
MIN_CONNECTIONS = 16


@dataclass(frozen=True)
class Limits:
    """What one server allows (the module's constants; tests pass smaller ones).

    ``max_connections``: connections open at once (``server.maxConnections``); None, as many
    as the descriptor limit allows once raised to its hard limit (``FD_RESERVE`` kept
    free). Past it the oldest idle connection is closed for a new one, or the new one is if
    none is idle."""

    max_connections: int | None = None
    keep_alive_seconds: int = KEEP_ALIVE_SECONDS
    head_seconds: float = HEAD_SECONDS
    max_head_bytes: int = MAX_HEAD_BYTES
    max_headers: int = MAX_HEADERS
    min_body_rate: float = MIN_BODY_RATE
    body_grace_seconds: float = BODY_GRACE_SECONDS


class _Uvicorn(uvicorn.Server):
    """uvicorn's server without its own signal handling: ``LocalServer`` owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class LocalServer:
    """Serves one ASGI application on a socket bound at construction."""

    def __init__(
        self,
        app: Callable[..., object],
        *,
        host: str,
        port: int,
        limits: Limits = Limits(),
        watchdog_seconds: float = Watchdog.PERIOD_SECONDS,
        listener: socket.socket | None = None,
    ) -> None:
        """Bind ``host:port`` now (port 0: any free one) to serve ``app`` within ``limits``,
        or serve on ``listener``, a socket :func:`bind_listener` bound before ``app`` existed.

        Raises ``OSError`` when the address is taken or not allowed.
        """
        self._socket = listener or bind_listener(host, port)
        bound_host, bound_port = self._socket.getsockname()[:2]
        self._address = (str(bound_host), int(bound_port))
        self._app = app
        self._limits = limits
        self._watchdog_seconds = watchdog_seconds
        self._server: _Uvicorn | None = None
        self._guard: ConnectionGuard | None = None
        self._thread: threading.Thread | None = None
        self._failed = False
        self._watchdog: Watchdog | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port (useful with port 0)."""
        return self._address

    def serve(self, *, on_started: Callable[[], None], on_stopping: Callable[[], None]) -> int:
        """Serve on this (the main) thread until SIGINT or SIGTERM; return the exit status.

        ``on_started()`` runs once the server accepts connections; ``on_stopping()`` runs on a
        thread when a signal came, before the server stops (it may still use the server).
        Returns 0 after a signal and 1 when the server stopped serving by itself (its
        listener failed, or its event loop stopped running callbacks: ``Watchdog``), so a supervisor
        restarts it.
        """
        stop_requested = threading.Event()

        async def main() -> None:
            loop = asyncio.get_running_loop()
            server = self._new_server()

            def on_signal() -> None:
                if stop_requested.is_set():
                    server.force_exit = True  # a second signal: stop now
                    return
                stop_requested.set()
                if self._watchdog is not None:
                    self._watchdog.stop()  # first: a stop on purpose is no failure
                loop.run_in_executor(None, self._then, on_stopping, server, loop)

            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, on_signal)
            await self._serve(server, on_started)

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
        if not stop_requested.is_set() or self._failed:
            log.error("the server stopped serving; exiting with status 1")
            return 1
        return 0

    def start(self) -> None:
        """Serve from a background thread (tests, benchmarks); :meth:`stop` ends it.

        Returns once the server accepts connections. Raises ``RuntimeError`` when it could
        not start.
        """
        started = threading.Event()

        def run() -> None:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(self._serve(self._new_server(), started.set))

        self._thread = threading.Thread(target=run, name="http-server", daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError("the HTTP server did not start within 30 s")

    def stop(self) -> None:
        """Stop the server started by :meth:`start` (requests under way get
        ``GRACEFUL_SECONDS``) and close its socket."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(GRACEFUL_SECONDS + 10)
        self._socket.close()

    def busy_connections(self) -> int:
        """How many open connections have a request under way (an approximate read from
        another thread, for operators and tests; 0 before the server starts)."""
        guard = self._guard
        return 0 if guard is None else sum(not c.idle for c in list(guard.open))

    def _then(
        self, on_stopping: Callable[[], None], server: _Uvicorn, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Run the caller's stopping work (it answers waiting polls), then, on the loop,
        close the connections whose request is still arriving (nobody will answer them, and
        uvicorn would wait for them and then cancel them with a traceback each) and let the
        server stop."""
        started = time.monotonic()
        try:
            on_stopping()
        except Exception:
            log.exception("stopping failed after %.1fs", time.monotonic() - started)

        def stop() -> None:
            if self._guard is not None:
                self._guard.close_receiving()
            server.should_exit = True

        loop.call_soon_threadsafe(stop)

    def _new_server(self) -> _Uvicorn:
        cap = connection_cap(self._limits.max_connections)
        self._guard = ConnectionGuard(
            max_connections=cap,
            head_seconds=self._limits.head_seconds,
            max_head_bytes=self._limits.max_head_bytes,
            max_headers=self._limits.max_headers,
            reserve=int(cap * RESERVE_FRACTION),
            min_body_rate=self._limits.min_body_rate,
            body_grace_seconds=self._limits.body_grace_seconds,
        )
        self._server = _Uvicorn(_config(self._app, self._limits, self._guard))
        return self._server

    async def _serve(self, server: _Uvicorn, on_started: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()

        def unhealthy() -> None:
            self._failed = True
            server.should_exit = True

        watchdog = Watchdog(loop, on_failure=unhealthy, period=self._watchdog_seconds)
        self._watchdog = watchdog
        serving = asyncio.ensure_future(server.serve(sockets=[self._socket]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started:
            watchdog.start()
            on_started()
        try:
            await serving
        finally:
            watchdog.stop()
        if not server.started:
            self._failed = True


def _config(app: Callable[..., object], limits: Limits, guard: ConnectionGuard) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        http=functools.partial(GuardedProtocol, guard=guard),  # type: ignore[arg-type]
        loop="none",
        lifespan="off",
        ws="none",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=limits.keep_alive_seconds,
        timeout_graceful_shutdown=int(GRACEFUL_SECONDS),
        backlog=BACKLOG,
    )


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port``; raises ``OSError`` when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def connection_cap(wanted: int | None) -> int:
    """How many connections may be open at once: ``wanted``, or with None as many as the
    descriptor limit (``RLIMIT_NOFILE``) allows; the soft limit is raised toward the hard one
    to fit either (an ``accept`` at the limit fails and is retried, so connections must stay
    under it). Logs a warning when the limit allows fewer than ``wanted``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_CEILING if wanted is None else wanted + FD_RESERVE
    if hard != resource.RLIM_INFINITY:
        target = min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    allowed = FD_CEILING if soft == resource.RLIM_INFINITY else soft - FD_RESERVE
    cap = allowed if wanted is None else min(wanted, allowed)
    if wanted is not None and cap < wanted:
        log.warning(
            "the descriptor limit (%d) allows %d connections, not server.maxConnections %d; "
            "raise `ulimit -n`",
            soft,
            max(cap, MIN_CONNECTIONS),
            wanted,
        )
    return max(cap, MIN_CONNECTIONS)
