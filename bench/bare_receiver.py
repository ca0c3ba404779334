"""The floor for ``bench/ingress.py``: the least a webhook receiver can do and still be correct.

Stdlib threaded HTTP/1.1 (keep-alive) server that reads the body, checks
``X-Hub-Signature-256`` (HMAC-SHA256, constant-time compare) and answers 202 with a tiny JSON
body. No parsing, no persistence, no queue.

With ``--journal F`` it is the durable floor instead: each verified body is written to a
preallocated journal file and ``fdatasync``'d before its 202, many requests sharing one sync
(group commit). Writes overwrite blocks the file already has (it wraps around at its end), so
no sync has to journal a change of the file's size: the least a receiver whose ack survives a
power cut can do on this disk.

Usage: ``python bench/bare_receiver.py --port N --secret-file F [--journal F]``; stop with
SIGINT.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SIGNATURE_HEADER = "X-Hub-Signature-256"
HEALTH_PATH = "/healthz"
_ACCEPTED = b'{"status":"accepted"}'
_REFUSED = b'{"error":"signature does not match"}'
_BAD_LENGTH = b'{"error":"send a numeric Content-Length"}'
JOURNAL_BYTES = 256 << 20


class Journal:
    """Group-committed, preallocated append log: :meth:`write` returns once its record is
    synced. The first writer to find no sync running syncs for everyone waiting."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        block = b"\0" * (1 << 20)
        for offset in range(0, JOURNAL_BYTES, len(block)):
            os.pwrite(self._fd, block, offset)
        os.fsync(self._fd)
        self._offset = 0
        self._changed = threading.Condition()
        self._waiting: list[bytes] = []
        self._written = 0  # records synced so far
        self._queued = 0  # records handed in so far
        self._syncing = False

    def write(self, record: bytes) -> None:
        with self._changed:
            self._waiting.append(record)
            self._queued += 1
            mine = self._queued
            while self._written < mine:
                if self._syncing:
                    self._changed.wait()
                    continue
                batch, self._waiting = self._waiting, []
                self._syncing = True
                self._changed.release()
                try:
                    self._sync(b"".join(batch))
                finally:
                    self._changed.acquire()
                    self._syncing = False
                    self._written += len(batch)
                    self._changed.notify_all()

    def _sync(self, data: bytes) -> None:
        if self._offset + len(data) > JOURNAL_BYTES:
            self._offset = 0
        os.pwrite(self._fd, data, self._offset)
        self._offset += len(data)
        os.fdatasync(self._fd)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, port: int, secret: bytes, journal: Journal | None) -> None:
        self.secret = secret
        self.journal = journal
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's
    # delayed ACK of the headers (~40 ms on Linux), so every response would take 40 ms.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        """Silence access lines: printing them would be most of the work."""

    def do_GET(self) -> None:
        """Answer the readiness probe."""
        found = self.path == HEALTH_PATH
        self._reply(200 if found else 404, b'{"status":"ok"}' if found else b"{}")

    def do_POST(self) -> None:
        """Read the body, verify its signature, answer 202 or 401."""
        declared = self.headers.get("Content-Length", "")
        if not declared.isdigit():
            self.close_connection = True
            self._reply(411, _BAD_LENGTH)
            return
        body = self.rfile.read(int(declared))
        digest = hmac.new(self.server.secret, body, hashlib.sha256).hexdigest()
        given = self.headers.get(SIGNATURE_HEADER, "")
        if hmac.compare_digest(f"sha256={digest}".encode(), given.encode()):
            if self.server.journal is not None:
                delivery = self.headers.get("X-GitHub-Delivery", "").encode("ascii", "replace")
                self.server.journal.write(b"%d %s\n" % (len(body), delivery) + body)
            self._reply(202, _ACCEPTED)
        else:
            self._reply(401, _REFUSED)

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    """Serve on 127.0.0.1 until interrupted; the secret file must hold the webhook secret."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--journal", type=Path, help="sync each body here before the 202")
    args = parser.parse_args()
    secret = args.secret_file.read_text(encoding="ascii").strip().encode()
    if not secret:
        parser.error(f"{args.secret_file} is empty; write the webhook secret into it")
    server = _Server(args.port, secret, Journal(args.journal) if args.journal else None)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
