"""The embedded queue's HTTP client: one dispatcher's keep-alive connection to the worker."""

from __future__ import annotations

import http.client
import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit

log = logging.getLogger("looprelay.queue")

REUSE_IDLE_SECONDS = 4.0
"""A dispatcher's keep-alive connection idle this long is closed rather than reused: well
inside the idle timeout of ``looprelay up``'s server (``app.server.KEEP_ALIVE_SECONDS``)."""


class WorkerConnection:
    """One dispatcher's keep-alive connection to the worker, reopened after any failure.

    A server closes a keep-alive connection it has seen idle for a while, and the close can
    cross a new request on the wire. So a connection idle for ``REUSE_IDLE_SECONDS`` is not
    reused, and a reused one that the server closed or reset before answering is retried once
    on a new connection (the worker's ledger makes a repeated delivery harmless).
    """

    def __init__(
        self, url: str, deadline_seconds: float, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        split = urlsplit(url)
        self._https = split.scheme == "https"
        self._host = split.hostname or "127.0.0.1"
        self._port = split.port
        self._path = (split.path or "/") + (f"?{split.query}" if split.query else "")
        self._deadline = deadline_seconds
        self._monotonic = monotonic
        self._connection: http.client.HTTPConnection | None = None
        self._idle_since = 0.0

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str | None, str]:
        """POST ``body``; return the status, the Retry-After header and the body text.

        Raises ``OSError`` or ``http.client.HTTPException`` when no answer came in time.
        """
        if self._connection is not None and (
            self._monotonic() - self._idle_since >= REUSE_IDLE_SECONDS
        ):
            self.close()
        reused = self._connection is not None
        try:
            return self._post_once(body, headers)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            if not reused:
                raise
            log.info("the worker closed an idle keep-alive connection; sending again")
            return self._post_once(body, headers)

    def _post_once(self, body: bytes, headers: dict[str, str]) -> tuple[int, str | None, str]:
        if self._connection is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._connection = kind(self._host, self._port, timeout=self._deadline)
        try:
            self._connection.request("POST", self._path, body=body, headers=headers)
            response = self._connection.getresponse()
            text = response.read().decode("utf-8", "replace")
        except BaseException:
            self.close()
            raise
        if response.will_close:
            self.close()
        self._idle_since = self._monotonic()
        return response.status, response.getheader("Retry-After"), text

    def close(self) -> None:
        """Drop the connection; the next POST opens a new one."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
