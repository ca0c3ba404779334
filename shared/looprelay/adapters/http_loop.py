"""The selector loop behind ``EmbeddedHttpServer``: one thread owns every socket.

It accepts, reads, parses (``http_wire``) and writes. A ``Deferred`` handler runs on the loop
and answers through ``reply`` now or later from any thread; every other handler may block and
runs on ``HandlerThreads``. A connection serves one request at a time, in order; bytes a client
sends ahead wait in its buffer. Other parts of the process may have the loop watch a socket of
theirs (the embedded queue's enqueue writer).
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from looprelay.adapters.handler_threads import HandlerThreads
from looprelay.adapters.http_routes import Deferred, Handler, Routes
from looprelay.adapters.http_wire import (
    CONTINUE,
    BadRequest,
    Head,
    encode_response,
    take_head,
)
from looprelay.httpmsg import Request, Response, json_response

log = logging.getLogger("looprelay.server")

IDLE_TIMEOUT_SECONDS = 75.0
"""A connection silent this long (between requests or mid-request) is closed."""
_RECV_BYTES = 64 * 1024
_AHEAD_BYTES = 256 * 1024
"""Most bytes buffered from a client whose current request is still being served."""
_SWEEP_SECONDS = 1.0


class _Connection:
    """One client connection's buffers and where it is in its current request."""

    __slots__ = (
        "busy",
        "close_after_write",
        "closed",
        "eof",
        "head",
        "inbox",
        "interest",
        "last_active",
        "outbox",
        "sock",
    )

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = bytearray()
        self.outbox = b""
        self.head: Head | None = None  # parsed, waiting for its body
        self.busy = False  # a handler has the current request
        self.eof = False  # the client sent all it will send
        self.closed = False
        self.close_after_write = False
        self.interest = 0
        self.last_active = time.monotonic()


@dataclass(frozen=True)
class _Watch:
    """A socket some other part of the process reads when it turns readable."""

    sock: socket.socket
    on_readable: Callable[[], None]


class _Replier:
    """Answers one request once; later calls are ignored (and logged)."""

    __slots__ = ("_connection", "_head_only", "_keep_alive", "_loop", "_unused")

    def __init__(
        self, loop: ServerLoop, connection: _Connection, *, keep_alive: bool, head_only: bool
    ) -> None:
        self._loop = loop
        self._connection = connection
        self._keep_alive = keep_alive
        self._head_only = head_only
        self._unused = threading.Lock()  # taken by the first answer, from whichever thread

    def __call__(self, response: Response) -> None:
        if not self._unused.acquire(blocking=False):
            log.error("a handler answered one request twice; the second answer is dropped")
            return
        data = encode_response(response, keep_alive=self._keep_alive, head_only=self._head_only)
        self._loop.send_from_any_thread(self._connection, data, keep_alive=self._keep_alive)


class ServerLoop:
    """The selector loop; everything but ``send_from_any_thread`` runs on its thread."""

    def __init__(self, listener: socket.socket, max_body_bytes: int) -> None:
        self.routes = Routes({}, {})
        self._listener = listener
        self._max_body_bytes = max_body_bytes
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._answers: deque[tuple[_Connection, bytes, bool]] = deque()
        self._answers_lock = threading.Lock()
        self._wake_pending = False  # a byte is on its way for answers not yet taken
        self._connections: set[_Connection] = set()
        self._threads = HandlerThreads(name="http-handler")
        self._stopping = False
        self._loop_thread: int | None = None
        self._new_watches: deque[_Watch] = deque()
        self._dispatching: _Connection | None = None  # whose handler runs on the loop now

    def run(self) -> None:
        """Serve until :meth:`stop`; then close every socket."""
        self._loop_thread = threading.get_ident()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, self._wake_reader)
        next_sweep = time.monotonic() + _SWEEP_SECONDS
        try:
            while not self._stopping:
                for key, events in self._selector.select(_SWEEP_SECONDS):
                    if key.data is None:
                        self._accept()
                    elif key.data is self._wake_reader:
                        self._drain_wake()
                    elif isinstance(key.data, _Watch):
                        self._on_watched(key.data)
                    else:
                        self._on_ready(key.data, events)
                    # Answers that came in meanwhile go out now: their clients' next requests
                    # then overlap with this round instead of waiting for its end.
                    self._write_answers()
                if time.monotonic() >= next_sweep:
                    self._close_idle()
                    next_sweep = time.monotonic() + _SWEEP_SECONDS
        finally:
            self.shut_down()

    def stop(self) -> None:
        """Ask the loop to end (from any thread)."""
        self._stopping = True
        self._wake()

    def watch(self, sock: socket.socket, on_readable: Callable[[], None]) -> None:
        """Call ``on_readable()`` on the loop whenever ``sock`` is readable, until it is
        closed (from any thread)."""
        self._new_watches.append(_Watch(sock, on_readable))
        self._wake()

    def send_from_any_thread(
        self, connection: _Connection, data: bytes, *, keep_alive: bool
    ) -> None:
        """Queue an answer for the loop to write; from the loop itself, write it now."""
        if threading.get_ident() == self._loop_thread:
            self._write(connection, data, keep_alive=keep_alive)
            if self._dispatching is not connection:
                # Answered later on the loop (the webhook's commit, read by a watch): the
                # requests the client sent ahead are served now, not on its next bytes.
                self._advance(connection)
            return
        with self._answers_lock:
            self._answers.append((connection, data, keep_alive))
            wake, self._wake_pending = not self._wake_pending, True
        if wake:
            self._wake()

    # -- the loop's own work ----------------------------------------------------------------

    def _wake(self) -> None:
        # A full wake pipe already wakes the loop; a closed one means it stopped.
        with contextlib.suppress(OSError):
            self._wake_writer.send(b"\0")

    def _on_watched(self, watched: _Watch) -> None:
        try:
            watched.on_readable()
        except Exception:
            log.exception("a watched socket's reader failed")
        if watched.sock.fileno() == -1:
            self._selector.unregister(watched.sock)

    def _drain_wake(self) -> None:
        while self._new_watches:
            watched = self._new_watches.popleft()
            self._register(watched.sock, selectors.EVENT_READ, watched)
        with contextlib.suppress(BlockingIOError):
            while self._wake_reader.recv(4096):
                pass

    def _write_answers(self) -> None:
        if not self._answers:
            return
        with self._answers_lock:
            # Answers queued after this take see no wake pending and send one.
            answers = list(self._answers)
            self._answers.clear()
            self._wake_pending = False
        for connection, data, keep_alive in answers:
            self._write(connection, data, keep_alive=keep_alive)
            self._advance(connection)  # a request the client sent ahead may be waiting

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                log.exception("accept failed")
                return
            sock.setblocking(False)
            # A small response must not wait for the client's delayed ACK (Nagle).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(sock)
            self._connections.add(connection)
            self._set_interest(connection)

    def _on_ready(self, connection: _Connection, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(connection)
        if events & selectors.EVENT_READ and not connection.closed:
            try:
                chunk = connection.sock.recv(_RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(connection)
                return
            connection.last_active = time.monotonic()
            if chunk:
                connection.inbox += chunk
            else:
                connection.eof = True
            if connection.busy:
                self._set_interest(connection)  # buffered until the current request is answered
            else:
                self._advance(connection)

    def _advance(self, connection: _Connection) -> None:
        """Serve the requests the buffer holds, one at a time, until one is handed to a
        handler that answers later, or more bytes are needed (a loop, not recursion: a
        client may send thousands of requests ahead)."""
        while not (connection.closed or connection.busy or connection.close_after_write):
            if not self._start_next(connection):
                return

    def _start_next(self, connection: _Connection) -> bool:
        """Dispatch the next request if it is all here; False when waiting for bytes."""
        try:
            if connection.head is None:
                connection.head = take_head(connection.inbox)
                if connection.head is None:
                    if connection.eof:
                        self._end_of_input(connection)
                    else:
                        self._set_interest(connection)
                    return False
                if connection.head.content_length > self._max_body_bytes:
                    # The body stays unread, so the connection cannot carry another request.
                    self._dispatch(connection, b"", keep_alive=False)
                    return True
        except BadRequest as exc:
            answer = json_response(exc.status, {"error": str(exc)})
            self._write(connection, encode_response(answer, keep_alive=False), keep_alive=False)
            return False
        length = connection.head.content_length
        if len(connection.inbox) >= length:
            body = bytes(connection.inbox[:length])
            del connection.inbox[:length]
            self._dispatch(connection, body, keep_alive=connection.head.keep_alive)
            return True
        if connection.eof:
            # The client stopped sending mid-body: the handler says what is wrong (the
            # webhook names a truncated delivery), then the connection closes.
            self._dispatch(connection, bytes(connection.inbox), keep_alive=False)
            return True
        if connection.head.expects_continue and not connection.outbox:
            connection.outbox = CONTINUE
            self._flush(connection)
        self._set_interest(connection)
        return False

    def _end_of_input(self, connection: _Connection) -> None:
        if connection.inbox.strip():
            answer = json_response(400, {"error": "connection closed inside the headers"})
            self._write(connection, encode_response(answer, keep_alive=False), keep_alive=False)
        else:
            self._close(connection)

    def _dispatch(self, connection: _Connection, body: bytes, *, keep_alive: bool) -> None:
        head = connection.head
        assert head is not None
        connection.head = None
        connection.busy = True
        self._set_interest(connection)
        path, _, query = head.target.partition("?")
        request = Request(
            method=head.method, path=path, query=query, headers=head.headers, body=body
        )
        reply = _Replier(self, connection, keep_alive=keep_alive, head_only=head.method == "HEAD")
        route = self.routes.find(path)
        if route is None:
            reply(json_response(404, {"error": "no such path"}))
        elif isinstance(route, Deferred):
            # An answer given inside the handler is written by _write alone: the caller's
            # _advance loop goes on to the next request.
            previous, self._dispatching = self._dispatching, connection
            try:
                route.handle(request, reply)
            except Exception:
                log.exception("unhandled error serving %s", path)
                reply(json_response(500, {"error": "internal error"}))
            finally:
                self._dispatching = previous
        else:
            self._threads.run(lambda: reply(_call(route, request)))

    def _write(self, connection: _Connection, data: bytes, *, keep_alive: bool) -> None:
        if connection.closed:
            return  # the client left while its request was served
        connection.busy = False
        connection.close_after_write = not keep_alive
        connection.outbox += data
        self._flush(connection)

    def _flush(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.outbox) if connection.outbox else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(connection)
            return
        connection.outbox = connection.outbox[sent:]
        if not connection.outbox and connection.close_after_write:
            self._close(connection)
        else:
            self._set_interest(connection)

    def _set_interest(self, connection: _Connection) -> None:
        """Watch for reading until the client is done (or, while a handler has its request,
        has sent a lot ahead); for writing while bytes wait. Reading stays registered while a
        request is served, which spares two system calls per request."""
        if connection.closed:
            return
        wanted = 0
        ahead = connection.busy and len(connection.inbox) >= _AHEAD_BYTES
        if not (connection.eof or connection.close_after_write or ahead):
            wanted |= selectors.EVENT_READ
        if connection.outbox:
            wanted |= selectors.EVENT_WRITE
        if wanted == connection.interest:
            return
        if not connection.interest:
            self._register(connection.sock, wanted, connection)
        elif not wanted:
            self._selector.unregister(connection.sock)
        else:
            self._selector.modify(connection.sock, wanted, connection)
        connection.interest = wanted

    def _register(self, sock: socket.socket, events: int, data: object) -> None:
        stale = self._selector.get_map().get(sock.fileno())
        if stale is not None:
            # A watched socket closed by another thread left its entry; its number is reused.
            self._selector.unregister(stale.fileobj)
        self._selector.register(sock, events, data)

    def _close_idle(self) -> None:
        cutoff = time.monotonic() - IDLE_TIMEOUT_SECONDS
        for connection in [c for c in self._connections if c.last_active < cutoff]:
            if not connection.busy:
                self._close(connection)

    def _close(self, connection: _Connection) -> None:
        if connection.closed:
            return
        if connection.interest:
            self._selector.unregister(connection.sock)
        connection.closed = True
        connection.interest = 0
        self._connections.discard(connection)
        connection.sock.close()

    def shut_down(self) -> None:
        """Close every socket (the loop does this as it ends)."""
        for connection in list(self._connections):
            self._close(connection)
        self._selector.close()
        self._listener.close()
        self._wake_reader.close()
        self._wake_writer.close()


def _call(handler: Handler, request: Request) -> Response:
    try:
        return handler(request)
    except Exception:
        log.exception("unhandled error serving %s", request.path)
        return json_response(500, {"error": "internal error"})
