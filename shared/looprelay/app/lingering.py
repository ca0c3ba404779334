"""A lingering close for connections answered before their request body has arrived.

A server that closes a socket with unread bytes in it makes the kernel send a reset, and a
client still sending its body (``http.client``, ``requests``: they read only once the body
is sent) then fails with "connection reset" and never reads the 413 that was waiting for it
(RFC 9112 §9.6; nginx's ``lingering_close``). Uvicorn closes right after the answer when the
client asked for ``Connection: close`` or the answer says it (a chunked body past its cap).
So a close while the request still arrives half-closes instead: the answer goes out with a
FIN, what the client still sends is read and dropped, and the socket is closed once the
client closes its side, or after ``LINGER_SECONDS``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

LINGER_SECONDS = 5.0
"""Longest a connection answered early is read (and dropped) before it is closed anyway."""


class LingeringTransport(asyncio.Transport):
    """The connection's transport as uvicorn sees it: ``close()`` lingers while
    ``receiving()`` says the request body is still arriving, calling ``on_linger()`` (the
    protocol then drops what it reads: ``lingering``); everything else goes to the socket's
    own transport."""

    def __init__(
        self,
        transport: asyncio.Transport,
        *,
        receiving: Callable[[], bool],
        on_linger: Callable[[], None],
    ) -> None:
        super().__init__()
        self.socket_transport = transport
        self._receiving = receiving
        self._on_linger = on_linger
        self._timer: asyncio.TimerHandle | None = None
        self.lingering = False

    def close(self) -> None:
        """Close now, or linger when the request body is still arriving."""
        real = self.socket_transport
        if self.lingering or real.is_closing() or not self._receiving() or not real.can_write_eof():
            self.shut()
            return
        self.lingering = True
        self._on_linger()
        real.write_eof()  # after what is buffered: the answer, then the FIN
        real.resume_reading()  # uvicorn may have paused it for a full body buffer
        self._timer = asyncio.get_running_loop().call_later(LINGER_SECONDS, self.shut)

    def shut(self) -> None:
        """Close the socket now, lingering or not."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.socket_transport.close()

    def is_closing(self) -> bool:
        return self.lingering or self.socket_transport.is_closing()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.socket_transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.socket_transport.writelines(list_of_data)

    def write_eof(self) -> None:
        self.socket_transport.write_eof()

    def can_write_eof(self) -> bool:
        return self.socket_transport.can_write_eof()

    def abort(self) -> None:
        self.socket_transport.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.socket_transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self.socket_transport.pause_reading()

    def resume_reading(self) -> None:
        self.socket_transport.resume_reading()

    def is_reading(self) -> bool:
        return self.socket_transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.socket_transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.socket_transport.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self.socket_transport.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.socket_transport.set_write_buffer_limits(high, low)
