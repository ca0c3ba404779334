"""uvicorn's httptools protocol with the limits it lacks (docs/decisions/0007).

uvicorn closes a keep-alive connection idle between requests, but not one that never sends a
byte, nor one that sends its head a byte at a time (slowloris), and httptools puts no bound
on a head's size, nor on how slowly a body may come. Scenario for one connection: it opens
(and is counted; at the cap the oldest idle connection is closed to make room, else the one
whose request has been arriving the longest, and this one is refused only when every other
has its request in full and waits for its answer); it must start a request within
``KEEP_ALIVE_SECONDS``; once a head begins it is *receiving* until its body has arrived: the
head must end within ``head_seconds`` and ``max_head_bytes`` (else 408 or 431), and the body
must arrive at ``min_body_rate`` bytes a second on average once ``body_grace_seconds`` have
passed (else 408), and receiving connections may hold all but ``reserve`` of the slots (past
that the one receiving the longest is dropped); the request is served (answered before its
body has arrived, as an early 413 is, it lingers: ``app.lingering``); then it is idle again.
So a flood of slow heads and bodies drops its own oldest, and an ordinary delivery, which
arrives in a moment, is never the oldest.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from looprelay.app.lingering import LingeringTransport

log = logging.getLogger("looprelay.server")


@dataclass
class ConnectionGuard:
    """The limits every connection of one server shares, and its open connections, oldest
    first (on the event loop's thread only)."""

    max_connections: int
    head_seconds: float
    max_head_bytes: int
    max_headers: int
    reserve: int = 0
    min_body_rate: float = 0.0
    body_grace_seconds: float = 5.0
    open: OrderedDict[GuardedProtocol, None] = field(default_factory=OrderedDict)
    receiving: OrderedDict[GuardedProtocol, None] = field(default_factory=OrderedDict)
    """Connections whose request has begun and not fully arrived, oldest request first."""

    def admit(self, connection: GuardedProtocol) -> bool:
        """Count ``connection``; at the cap close the oldest idle one for it, else the one
        whose request has been arriving the longest. False when neither exists (every
        connection has its request in full): the new connection must be closed instead."""
        if len(self.open) >= self.max_connections:
            oldest_idle = next((c for c in self.open if c.idle), None)
            if oldest_idle is not None:
                oldest_idle.evict()
            elif self.receiving:
                next(iter(self.receiving)).drop("the server is full")
            else:
                log.warning("%d connections are busy; a new one is refused", len(self.open))
                return False
        self.open[connection] = None
        return True

    def receiving_started(self, connection: GuardedProtocol) -> None:
        """``connection`` began a request; past ``max_connections - reserve`` receiving
        ones, the oldest other is dropped, so ``reserve`` slots stay for the rest."""
        self.receiving[connection] = None
        if len(self.receiving) > max(1, self.max_connections - self.reserve):
            oldest = next(iter(self.receiving))
            if oldest is not connection:
                oldest.drop("too many requests arriving at once")

    def receiving_ended(self, connection: GuardedProtocol) -> None:
        """``connection``'s request arrived in full, or the connection closed."""
        self.receiving.pop(connection, None)

    def close_receiving(self) -> None:
        """Close every connection whose request is still arriving (the server stops)."""
        for connection in list(self.receiving):
            connection.drop("the server is stopping")

    def forget(self, connection: GuardedProtocol) -> None:
        """``connection`` closed."""
        self.open.pop(connection, None)
        self.receiving.pop(connection, None)


class _HeadTooLarge(Exception):
    """A request head passed the byte or header-count cap."""


class GuardedProtocol(HttpToolsProtocol):
    """One connection, with a deadline and a size cap on each request head."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._head_lines = 0
        self._refusal: tuple[int, str] | None = None
        self._ended = False  # the client half-closed after sending its request
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_started = 0.0
        self._body_bytes = 0
        self._linger: LingeringTransport | None = None

    @property
    def idle(self) -> bool:
        """No request under way and none begun, or answered and lingering: closing it loses
        nothing."""
        if self._linger is not None and self._linger.lingering:
            return True
        return (
            self._head_timer is None
            and (self.cycle is None or self.cycle.response_complete)
            and not self.transport.is_closing()
        )

    def evict(self) -> None:
        """Close this idle connection to make room for a new one."""
        self._shut()

    def drop(self, why: str) -> None:
        """Close this connection, whose request is still arriving, with a 408 saying
        ``why`` (unless an answer has begun already)."""
        log.info("a request still arriving is dropped: %s", why)
        self._guard.receiving_ended(self)
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()
        else:
            self._refuse(408, f"request dropped: {why}")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._guard.admit(self):
            transport.close()
            return
        # uvicorn closes through this, so an answer given before the body has arrived
        # (an early 413) lingers instead of resetting a client still sending (lingering.py).
        self._linger = LingeringTransport(
            transport, receiving=lambda: self in self._guard.receiving, on_linger=self._lingers
        )
        self.transport = self._linger
        # uvicorn arms its idle timer only after a response; a connection that never sends
        # a byte is idle from the start.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.forget(self)
        self._cancel_head_timer()
        self._cancel_body_timer()
        if self._linger is not None:
            self._linger.shut()  # its timer
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._linger is not None and self._linger.lingering:
            return  # the rest of a request already answered: read and dropped
        super().data_received(data)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        if self._linger is not None and self._linger.lingering:
            return None  # the client sent the rest: close
        # A client may end its side once its request is sent (RFC 9112 §9.6): the requests it
        # sent in full are still answered, then the connection closes. Anything cut short
        # has nobody to answer (None: the transport closes now).
        sent = self.cycle is not None and not self.cycle.response_complete
        if self.pipeline or (sent and not self.cycle.more_body):
            self._ended = True
            return True
        return None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._ended and not self.pipeline and self.cycle.response_complete:
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = self._head_lines = 0
        self._head_timer = self.loop.call_later(self._guard.head_seconds, self._head_too_slow)
        self._guard.receiving_started(self)

    def on_url(self, url: bytes) -> None:
        self._count(len(url), lines=0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value), lines=1)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()
        if self._guard.min_body_rate > 0:
            self._body_started = self.loop.time()
            self._body_bytes = 0
            self._body_timer = self.loop.call_later(
                self._guard.body_grace_seconds, self._body_too_slow
            )

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel_body_timer()
        self._guard.receiving_ended(self)
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # httptools reports a callback's exception as a parse error: answer what it was.
        status, text = self._refusal or (400, msg)
        self._refusal = None
        self._refuse(status, text)

    def _refuse(self, status: int, text: str) -> None:
        """Answer ``status`` with ``text`` and close the connection."""
        content = [
            STATUS_LINE[status],
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: " + str(len(text)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n",
            text.encode("ascii"),
        ]
        self.transport.write(b"".join(content))
        self._shut()

    def _shut(self) -> None:
        """Close the socket now, lingering or not."""
        if self._linger is not None:
            self._linger.shut()
        else:
            self.transport.close()

    def _lingers(self) -> None:
        """The answer went out before the request had arrived: it no longer counts as
        arriving, and no deadline of its own applies."""
        self._guard.receiving_ended(self)
        self._cancel_head_timer()
        self._cancel_body_timer()

    def _count(self, size: int, *, lines: int) -> None:
        self._head_bytes += size
        self._head_lines += lines
        if self._head_bytes > self._guard.max_head_bytes:
            self._refusal = (431, f"request head larger than {self._guard.max_head_bytes} bytes")
            raise _HeadTooLarge
        if self._head_lines > self._guard.max_headers:
            self._refusal = (431, f"more than {self._guard.max_headers} header lines")
            raise _HeadTooLarge

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            seconds = self._guard.head_seconds
            self._refuse(408, f"request head not received within {seconds:g} s")

    def _body_too_slow(self) -> None:
        """Drop the request unless its body came at ``min_body_rate`` on average so far;
        look again in a second."""
        self._body_timer = None
        if self.transport.is_closing():
            return
        elapsed = self.loop.time() - self._body_started
        if self._body_bytes < self._guard.min_body_rate * elapsed:
            rate = self._guard.min_body_rate
            self.drop(f"body slower than {rate:g} bytes a second")
            return
        self._body_timer = self.loop.call_later(1.0, self._body_too_slow)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
