"""Loopback stand-ins for an Anthropic API endpoint, for tests that run the real Claude CLI.

A :class:`Recorder` is an HTTP server on 127.0.0.1 that records each request's path. By default
it refuses every request with 401 at once (an attacker's server, or an operator API a turn should
end on quickly); with ``answer`` it answers the Messages API with one short assistant text, as a
stream when asked for one, so that a headless ``claude -p`` turn ends ``done``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = "Noted."
"""The assistant text an answering recorder gives every turn."""
_REFUSAL = b'{"type":"error","error":{"type":"authentication_error","message":"no"}}'
MESSAGE = {
    "id": "msg_looprelay_test",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": ANSWER}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


def message_stream() -> bytes:
    """The Messages API's server-sent events for :data:`MESSAGE`."""
    start = {**MESSAGE, "content": [], "stop_reason": None}
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": ANSWER},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()


class Recorder:
    """An HTTP server on 127.0.0.1 recording each request's path; see the module docstring."""

    def __init__(self, *, answer: bool = False) -> None:
        self.paths: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                recorder.paths.append(self.path)
                if not answer:
                    self._send(401, "application/json", _REFUSAL)
                elif "/messages" not in self.path or self.path.split("?")[0].endswith(
                    "/count_tokens"
                ):
                    self._send(200, "application/json", b'{"input_tokens": 1}')
                elif _streamed(raw):
                    self._send(200, "text/event-stream", message_stream())
                else:
                    self._send(200, "application/json", json.dumps(MESSAGE).encode())

            do_GET = do_POST

            def _send(self, status: int, kind: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()


def _streamed(raw: bytes) -> bool:
    try:
        return bool(json.loads(raw or b"{}").get("stream"))
    except ValueError:
        return False
