"""The floor for ``bench/ingress.py``: the least a webhook receiver can do and still be correct.

Stdlib threaded HTTP/1.1 (keep-alive) server that reads the body, checks
``X-Hub-Signature-256`` (HMAC-SHA256, constant-time compare) and answers 202 with a tiny JSON
body. No parsing, no persistence, no queue.

Usage: ``python bench/bare_receiver.py --port N --secret-file F``; stop with SIGINT.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SIGNATURE_HEADER = "X-Hub-Signature-256"
HEALTH_PATH = "/healthz"
_ACCEPTED = b'{"status":"accepted"}'
_REFUSED = b'{"error":"signature does not match"}'
_BAD_LENGTH = b'{"error":"send a numeric Content-Length"}'


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, port: int, secret: bytes) -> None:
        self.secret = secret
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
    args = parser.parse_args()
    secret = args.secret_file.read_text(encoding="ascii").strip().encode()
    if not secret:
        parser.error(f"{args.secret_file} is empty; write the webhook secret into it")
    server = _Server(args.port, secret)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
