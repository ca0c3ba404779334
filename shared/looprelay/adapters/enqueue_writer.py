"""The embedded queue's enqueue writer: a process of its own that makes enqueues durable.

``looprelay up`` runs the webhook, the worker and the runner API in one Python process, and
an ack may go out only once its task is on disk. Committing in a thread of that process made
every ack pay for the interpreter lock twice (the commit's own Python, and the hand-offs
around each SQLite call); in a process of its own the commit runs on the other core. The
parent sends request frames over a socket pair; this process commits everything that arrived
together as one transaction (one fsync for the batch: group commit) and answers a frame per
request. It exits when the parent's end closes, so it never outlives ``looprelay up``. Its
first frame, :data:`READY`, says its database is open.

Frames (big-endian): a request is ``seq u32, now f64, window_start f64, name_len u16,
body_len u32`` then the name (ASCII) and the body; a result is ``seq u32, code u8, text_len
u16`` then the text, with ``code`` one of :data:`DUPLICATE`, :data:`QUEUED`, :data:`FAILED`.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import sqlite3
import struct
import sys
from dataclasses import dataclass

from looprelay.adapters.sqlite_common import SqliteDatabase
from looprelay.errors import Transient

REQUEST = struct.Struct("!IddHI")
RESULT = struct.Struct("!IBH")
DUPLICATE, QUEUED, FAILED = 0, 1, 2
READY = RESULT.pack(0, 3, 0)
"""The first frame the writer sends: its database is open and it takes requests."""
_RECV_BYTES = 1 << 20
IDLE_CHECKPOINT_SECONDS = 1.0
_MAX_TEXT = 500

INSERT_UNLESS_TAKEN = (
    "INSERT INTO tasks (name, body, state, eta, created_at) VALUES (?,?,'pending',?,?)"
    " ON CONFLICT(name) DO UPDATE SET body = excluded.body, state = 'pending',"
    " attempts = 0, executions = 0, eta = excluded.eta,"
    " created_at = excluded.created_at, finished_at = NULL,"
    " last_status = NULL, last_error = NULL"
    " WHERE tasks.state = 'done' AND tasks.finished_at < ?"
)
"""Queue a task unless its name is taken: pending or leased, dead, or done within the dedup
window (a done task older than ``window_start`` is queued afresh)."""


@dataclass(frozen=True, slots=True)
class Request:
    """One task to enqueue, as a frame carries it."""

    seq: int
    now: float
    window_start: float
    name: str
    body: bytes


def encode_request(request: Request) -> bytes:
    """The frame for ``request``."""
    name = request.name.encode("ascii")
    head = REQUEST.pack(
        request.seq, request.now, request.window_start, len(name), len(request.body)
    )
    return head + name + request.body


def encode_result(seq: int, code: int, text: str = "") -> bytes:
    """The frame answering request ``seq``."""
    raw = text.encode("utf-8", "replace")[:_MAX_TEXT]
    return RESULT.pack(seq, code, len(raw)) + raw


def take_requests(buffer: bytearray) -> list[Request]:
    """Remove and return the complete request frames at the front of ``buffer``."""
    requests: list[Request] = []
    while len(buffer) >= REQUEST.size:
        seq, now, window_start, name_len, body_len = REQUEST.unpack_from(buffer)
        end = REQUEST.size + name_len + body_len
        if len(buffer) < end:
            break
        name = bytes(buffer[REQUEST.size : REQUEST.size + name_len]).decode("ascii")
        body = bytes(buffer[REQUEST.size + name_len : end])
        requests.append(Request(seq, now, window_start, name, body))
        del buffer[:end]
    return requests


def take_results(buffer: bytearray) -> list[tuple[int, int, str]]:
    """Remove and return the complete ``(seq, code, text)`` result frames in ``buffer``."""
    results: list[tuple[int, int, str]] = []
    while len(buffer) >= RESULT.size:
        seq, code, text_len = RESULT.unpack_from(buffer)
        end = RESULT.size + text_len
        if len(buffer) < end:
            break
        results.append((seq, code, bytes(buffer[RESULT.size : end]).decode("utf-8", "replace")))
        del buffer[:end]
    return results


def commit_batch(database: SqliteDatabase, batch: list[Request]) -> bytes:
    """Insert ``batch`` in one transaction; the result frames once it is committed.

    A failed transaction fails every request of the batch: nothing of it was written.
    """
    try:
        with database.transaction() as db:
            codes = [
                QUEUED
                if db.execute(
                    INSERT_UNLESS_TAKEN,
                    (item.name, item.body, item.now, item.now, item.window_start),
                ).rowcount
                else DUPLICATE
                for item in batch
            ]
    except (Transient, sqlite3.Error) as exc:
        return b"".join(encode_result(item.seq, FAILED, str(exc)) for item in batch)
    return b"".join(encode_result(item.seq, code) for item, code in zip(batch, codes, strict=True))


def serve(database: SqliteDatabase, parent: socket.socket) -> None:
    """Commit what the parent sends, batch by batch, until it closes its end.

    The write-ahead log is folded back into the database only after ``IDLE_CHECKPOINT_SECONDS``
    without a request (the connection's automatic checkpoint is off): a checkpoint inside a
    commit would hold up every ack waiting for it. The parent's own writes to the file
    checkpoint it too, so the log stays bounded during a long burst.
    """
    buffer = bytearray()
    dirty = False
    while True:
        readable, _, _ = select.select([parent], [], [], IDLE_CHECKPOINT_SECONDS)
        if not readable:
            if dirty:
                # A checkpoint that cannot run now (the parent is writing) runs next time.
                with contextlib.suppress(Transient):
                    database.execute("PRAGMA wal_checkpoint(PASSIVE)")
                dirty = False
            continue
        chunk = parent.recv(_RECV_BYTES)
        if not chunk:
            return
        buffer += chunk
        # Everything that arrived while the last batch committed is the next batch.
        batch = take_requests(buffer)
        if batch:
            parent.sendall(commit_batch(database, batch))
            dirty = True


def main(argv: list[str]) -> int:
    """``python -m looprelay.adapters.enqueue_writer FD PATH``: serve the socket ``FD``."""
    fd, path = int(argv[0]), argv[1]
    # Ctrl-C reaches the whole process group; the parent decides when this process ends
    # (by closing its end), so requests already sent are still committed and answered.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = socket.socket(fileno=fd)
    database = SqliteDatabase(path, schema="", what="embedded queue")
    database.execute("PRAGMA wal_autocheckpoint=0")  # see serve()
    try:
        parent.sendall(READY)
        serve(database, parent)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent is gone; so is everyone waiting for an answer
    finally:
        database.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
