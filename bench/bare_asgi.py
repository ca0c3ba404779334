"""The durable floor on looprelay's server stack, for ``bench/ingress.py``: the least an ASGI
webhook on uvicorn (httptools, uvloop), as ``looprelay up`` serves it, can do.

A bare ASGI callable (no Starlette, no looprelay) reads the body, checks
``X-Hub-Signature-256`` (HMAC-SHA256, constant-time compare) and, before its 202, makes the
body durable the way one of two floors does:

- ``--journal F``: ``bare_receiver.Journal``, a preallocated file ``fdatasync``'d per group of
  requests (the ``durable`` receiver's floor, on this stack instead of the stdlib server);
- ``--sqlite F``: one row per request in a SQLite table in WAL mode with
  ``synchronous=FULL``, committed by one thread per group of requests, as looprelay's
  embedded queue commits (``adapters/sqlite/enqueue_committer.py``), without its schema, dedup or
  dispatchers.

The event loop never waits for a sync: the write runs on a thread and the 202 goes out when it
returns. Set against ``durable`` it shows what the server stack adds to a durable ack; set
against ``looprelay`` what looprelay's application, its queue and its worker add.

Usage: ``python bench/bare_asgi.py --port N --secret-file F (--journal F | --sqlite F)``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import sqlite3
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bare_receiver import Journal

_ACCEPTED = b'{"status":"accepted"}'
_REFUSED = b'{"error":"signature does not match"}'
_HEADERS = [(b"content-type", b"application/json")]


class SqliteLog:
    """Rows committed by one thread, every request waiting joining the next transaction."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE tasks (name TEXT PRIMARY KEY, body BLOB)")
        self._changed = threading.Condition()
        self._pending: list[tuple[bytes, bytes, Future[None]]] = []
        threading.Thread(target=self._run, daemon=True).start()

    def write(self, name: bytes, body: bytes) -> Future[None]:
        future: Future[None] = Future()
        with self._changed:
            self._pending.append((name, body, future))
            self._changed.notify()
        return future

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending)
                batch, self._pending = self._pending, []
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                "INSERT OR IGNORE INTO tasks VALUES (?, ?)", [(n, b) for n, b, _ in batch]
            )
            self._db.execute("COMMIT")
            for _, _, future in batch:
                future.set_result(None)


def application(secret: bytes, durable: Callable[[bytes, bytes], Future[None]]) -> Any:
    """The ASGI app: 200 on ``GET /healthz``, 202 or 401 on any POST."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            await _reply(send, 200, b'{"status":"ok"}')
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        headers = dict(scope["headers"])
        digest = hmac.new(secret, body, hashlib.sha256).hexdigest()
        given = headers.get(b"x-hub-signature-256", b"")
        if not hmac.compare_digest(f"sha256={digest}".encode(), given):
            await _reply(send, 401, _REFUSED)
            return
        await asyncio.wrap_future(durable(headers.get(b"x-github-delivery", b""), body))
        await _reply(send, 202, _ACCEPTED)

    return app


async def _reply(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": body})


def _journal_writer(journal: Journal) -> Callable[[bytes, bytes], Future[None]]:
    """``Journal.write`` blocks until its group's sync, so each write waits on a pool thread
    (the group commit gathers the waiting threads' records)."""
    pool = ThreadPoolExecutor(max_workers=16)

    def write(name: bytes, body: bytes) -> Future[None]:
        return pool.submit(journal.write, b"%d %s\n" % (len(body), name) + body)

    return write


def main() -> None:
    """Serve on 127.0.0.1 until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret-file", type=Path, required=True)
    floor = parser.add_mutually_exclusive_group(required=True)
    floor.add_argument("--journal", type=Path, help="fdatasync each body here before the 202")
    floor.add_argument("--sqlite", type=Path, help="commit each body here before the 202")
    args = parser.parse_args()
    secret = args.secret_file.read_text(encoding="ascii").strip().encode()
    if not secret:
        parser.error(f"{args.secret_file} is empty; write the webhook secret into it")
    durable = (
        _journal_writer(Journal(args.journal)) if args.journal else SqliteLog(args.sqlite).write
    )
    uvicorn.run(
        application(secret, durable),
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop="uvloop",
        log_level="warning",
        access_log=False,
        lifespan="off",
    )


if __name__ == "__main__":
    main()
