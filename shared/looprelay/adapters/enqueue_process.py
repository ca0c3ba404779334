"""The parent's side of the enqueue writer (``enqueue_writer``): start it, send it tasks and
turn its answers into futures.

Answers are read by the HTTP server's loop when the socket turns readable (``looprelay up``
registers it, so an ack goes out the moment its commit lands, with no thread hand-off), or
else by a thread of its own. A writer that died fails what it was answering as ``Transient``
and is started again by the next submit.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from looprelay.adapters.enqueue_writer import (
    FAILED,
    QUEUED,
    READY,
    Request,
    encode_request,
    take_results,
)
from looprelay.errors import Transient

log = logging.getLogger("looprelay.queue")

SEND_TIMEOUT_SECONDS = 10.0
"""Longest a submit waits for room in the socket while the writer is busy."""
START_TIMEOUT_SECONDS = 30.0
"""Longest a start waits for the writer to say it is ready."""
_RECV_BYTES = 1 << 16
_ANSWER_WAIT_SECONDS = 1.0
"""How often the answer thread of a queue without a loop looks whether its writer is gone."""


class EnqueueProcess:
    """One writer process for one queue file; thread-safe."""

    def __init__(
        self, path: str | Path, *, on_start: Callable[[socket.socket], None] | None = None
    ) -> None:
        """Remember the file; the process starts with the first :meth:`submit`.

        ``on_start(sock)`` is told the socket of each writer started, so a selector loop can
        :meth:`collect` when it turns readable (``looprelay up``'s HTTP server does);
        without it a thread of this object collects.
        """
        self._path = str(path)
        self._on_start = on_start
        self._lock = threading.RLock()  # the process, its socket and the sequence number
        self._read_lock = threading.Lock()  # the socket's reading side and the inbox
        # The futures waiting for answers, apart from the process lock, so that collecting
        # never waits for a submit blocked on a full socket.
        self._pending_lock = threading.Lock()
        self._pending: dict[int, Future[bool]] = {}
        self._seq = 0
        self._inbox = bytearray()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._closed = False

    def start(self) -> None:
        """Start the writer now rather than with the first submit (which would wait for it).

        Raises ``Transient`` when it cannot be started.
        """
        with self._lock:
            self._started()

    def submit(self, request: Request) -> Future[bool]:
        """Send one task; the future says True (queued) or False (the name is taken) once
        the writer committed it, or fails with ``Transient``. ``request.seq`` is ignored.

        Waits up to ``SEND_TIMEOUT_SECONDS`` for room in the socket.
        """
        future: Future[bool] = Future()
        with self._lock:
            try:
                sock = self._started()
                self._seq = (self._seq + 1) % (1 << 32)
                with self._pending_lock:
                    self._pending[self._seq] = future
                frame = encode_request(
                    Request(
                        self._seq, request.now, request.window_start, request.name, request.body
                    )
                )
                _send_all(sock, frame)
            except (OSError, Transient) as exc:
                with self._pending_lock:
                    self._pending.pop(self._seq, None)
                failure = exc if isinstance(exc, Transient) else Transient(f"enqueue writer: {exc}")
                future.set_exception(failure)
        return future

    def collect(self) -> None:
        """Resolve the futures whose answers have arrived; never blocks."""
        with self._read_lock:
            sock = self._sock
            if sock is None:
                return
            lost = ""
            try:
                while chunk := sock.recv(_RECV_BYTES):
                    self._inbox += chunk
                lost = "the enqueue writer exited"
            except (BlockingIOError, InterruptedError):
                pass  # nothing more to read now
            except OSError as exc:
                lost = f"the enqueue writer's socket failed: {exc}"
            results = take_results(self._inbox)
        with self._pending_lock:
            resolved = [(self._pending.pop(seq, None), code, text) for seq, code, text in results]
        for future, code, text in resolved:
            if future is None:
                continue
            if code == FAILED:
                future.set_exception(Transient(f"embedded queue busy or unavailable: {text}"))
            else:
                future.set_result(code == QUEUED)
        if lost:
            self._lost(sock, lost)

    def close(self) -> None:
        """Let the writer commit and answer what was sent, then end it."""
        with self._lock:
            self._closed = True
            sock, process = self._sock, self._process
        if sock is None or process is None:
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)  # the writer answers what it has, then exits
        try:
            process.wait(SEND_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self.collect()
        self._lost(sock, "the embedded queue is closed")

    def _started(self) -> socket.socket:
        if self._closed:
            raise Transient("the embedded queue is closed: the task was not queued")
        if self._sock is not None:
            return self._sock
        ours, theirs = socket.socketpair()
        try:
            command = [sys.executable, "-m", "looprelay.adapters.enqueue_writer"]
            self._process = subprocess.Popen(  # noqa: S603 (our own module, no shell)
                [*command, str(theirs.fileno()), self._path],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            ours.close()
            raise Transient(f"cannot start the enqueue writer: {exc}") from exc
        finally:
            theirs.close()
        try:
            _await_ready(ours)
        except Transient:
            ours.close()
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()
            self._process = None
            raise
        ours.setblocking(False)  # reads never wait; sends wait in _send_all
        self._sock = ours
        if self._on_start is not None:
            self._on_start(ours)
        else:
            threading.Thread(
                target=self._collect_until_lost, args=(ours,), name="enqueue-answers", daemon=True
            ).start()
        return ours

    def _collect_until_lost(self, sock: socket.socket) -> None:
        while sock.fileno() != -1:
            with contextlib.suppress(OSError, ValueError):  # closed under the wait
                select.select([sock], [], [], _ANSWER_WAIT_SECONDS)
            self.collect()

    def _lost(self, sock: socket.socket, reason: str) -> None:
        """Forget a writer whose socket ended: what it did not answer fails."""
        with self._lock:
            if self._sock is not sock:
                return  # already forgotten
            self._sock = None
            process, self._process = self._process, None
            with self._pending_lock:
                pending, self._pending = self._pending, {}
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        with self._read_lock:
            self._inbox.clear()
            sock.close()
        if pending and not self._closed:
            log.error("%s; %d enqueue(s) failed and the next one restarts it", reason, len(pending))
        for future in pending.values():
            future.set_exception(Transient(f"{reason}; the task may not be queued"))


def _send_all(sock: socket.socket, data: bytes) -> None:
    """Send all of ``data`` on a non-blocking socket, waiting for room up to the timeout."""
    view = memoryview(data)
    deadline = time.monotonic() + SEND_TIMEOUT_SECONDS
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Transient("the enqueue writer is not taking tasks (timed out)") from None
            select.select([], [sock], [], remaining)


def _await_ready(sock: socket.socket) -> None:
    """Wait for the writer's READY frame, so nothing is acked on a writer still starting
    (it imports and opens the database first: 0.1-0.3 s, more on a loaded machine)."""
    sock.settimeout(START_TIMEOUT_SECONDS)
    received = b""
    try:
        while len(received) < len(READY):
            chunk = sock.recv(len(READY) - len(received))
            if not chunk:
                raise Transient("the enqueue writer exited while starting (see its error above)")
            received += chunk
    except TimeoutError:
        raise Transient(
            f"the enqueue writer did not start within {START_TIMEOUT_SECONDS:.0f}s"
        ) from None
    if received != READY:
        raise Transient("the enqueue writer answered something other than READY")
