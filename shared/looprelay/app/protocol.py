"""uvicorn's httptools protocol with the limits it lacks (docs/decisions/0007).

uvicorn closes a keep-alive connection idle between requests, but not one that never sends a
byte, nor one that sends its head a byte at a time (slowloris), and httptools puts no bound
on a head's size. Scenario for one connection: it opens (and is counted; at the cap the
oldest idle connection is closed to make room, or this one when none is idle); it must start
a request within ``KEEP_ALIVE_SECONDS``; once a head begins it must end within
``head_seconds`` and ``max_head_bytes``, else the connection gets 408 or 431 and is closed;
the request is served; then it is idle again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

log = logging.getLogger("looprelay.server")


@dataclass
class ConnectionGuard:
    """The limits every connection of one server shares, and its open connections, oldest
    first (on the event loop's thread only)."""

    max_connections: int
    head_seconds: float
    max_head_bytes: int
    max_headers: int
    open: OrderedDict[GuardedProtocol, None] = field(default_factory=OrderedDict)

    def admit(self, connection: GuardedProtocol) -> bool:
        """Count ``connection``; at the cap close the oldest idle one for it. False when
        none is idle: the new connection must be closed instead."""
        if len(self.open) >= self.max_connections:
            oldest_idle = next((c for c in self.open if c.idle), None)
            if oldest_idle is None:
                log.warning("%d connections are busy; a new one is refused", len(self.open))
                return False
            oldest_idle.evict()
        self.open[connection] = None
        return True

    def forget(self, connection: GuardedProtocol) -> None:
        """``connection`` closed."""
        self.open.pop(connection, None)


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

    @property
    def idle(self) -> bool:
        """No request under way and none begun: closing it loses nothing."""
        return (
            self._head_timer is None
            and (self.cycle is None or self.cycle.response_complete)
            and not self.transport.is_closing()
        )

    def evict(self) -> None:
        """Close this idle connection to make room for a new one."""
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._guard.admit(self):
            transport.close()
            return
        # uvicorn arms its idle timer only after a response; a connection that never sends
        # a byte is idle from the start.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.forget(self)
        self._cancel_head_timer()
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:  # type: ignore[override]
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

    def on_url(self, url: bytes) -> None:
        self._count(len(url), lines=0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value), lines=1)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()

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
        self.transport.close()

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

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
