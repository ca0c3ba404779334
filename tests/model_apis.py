"""Loopback stand-ins for the model APIs the coding-agent CLIs talk to, so that each real CLI
completes real turns offline: OpenAI's Responses API (Codex, through a custom model provider's
``base_url``), Google's Gemini API (Gemini CLI, ``GOOGLE_GEMINI_BASE_URL``) and Anthropic's
Messages API (Copilot CLI's own-provider mode, ``COPILOT_PROVIDER_TYPE=anthropic``).

A :class:`ModelApi` answers every generation request with :data:`ANSWER`, streamed where the
CLI asks for a stream, and records each request's body; with ``failing`` it answers 400 with
the API's own error shape (a request error, which no CLI retries), so a turn fails with the
provider's message. :meth:`ModelApi.saw`
tells whether any request carried a text (a prompt, or an earlier turn replayed on resume).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.anthropic_api import MESSAGE, message_stream

ANSWER = MESSAGE["content"][0]["text"]
"""What every stand-in answers, the Anthropic one's text."""
REFUSAL = "the test stand-in refuses this request"
"""The error message a failing stand-in gives."""

Reply = tuple[int, str, bytes]
"""An HTTP status, a content type and a body."""


def _sse(events: list[dict[str, object]], *, named: bool) -> bytes:
    lines = []
    for event in events:
        head = f"event: {event['type']}\n" if named else ""
        lines.append(f"{head}data: {json.dumps(event)}\n\n")
    return "".join(lines).encode()


def responses_api(path: str, body: bytes, failing: bool) -> Reply:
    """OpenAI's Responses API, as ``codex exec`` calls it: ``POST /v1/responses``, streamed."""
    if failing:
        error = {"error": {"message": REFUSAL, "type": "invalid_request_error", "code": None}}
        return 400, "application/json", json.dumps(error).encode()
    if not path.split("?", maxsplit=1)[0].endswith("/responses"):
        return 200, "application/json", b'{"object": "list", "data": [], "models": []}'
    item = {
        "type": "message",
        "id": "msg_looprelay_test",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
    }
    usage = {
        "input_tokens": 1,
        "output_tokens": 1,
        "total_tokens": 2,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    done = {"id": "resp_looprelay_test", "object": "response", "status": "completed"}
    done |= {"model": "gpt-5", "output": [item], "usage": usage}
    events: list[dict[str, object]] = [
        {"type": "response.created", "response": {**done, "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
        {
            "type": "response.output_text.delta",
            "item_id": item["id"],
            "output_index": 0,
            "content_index": 0,
            "delta": ANSWER,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": done},
    ]
    return 200, "text/event-stream", _sse(events, named=True)


def gemini_api(path: str, body: bytes, failing: bool) -> Reply:
    """Google's Gemini API: ``POST /v1beta/models/<m>:generateContent`` or
    ``:streamGenerateContent?alt=sse``, and ``:countTokens``."""
    if failing:
        error = {"error": {"code": 400, "message": REFUSAL, "status": "INVALID_ARGUMENT"}}
        return 400, "application/json", json.dumps(error).encode()
    if ":countTokens" in path:
        return 200, "application/json", b'{"totalTokens": 1}'
    chunk = {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": ANSWER}]},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
    }
    if "alt=sse" in path:
        return 200, "text/event-stream", _sse([chunk], named=False)
    return 200, "application/json", json.dumps(chunk).encode()


def messages_api(path: str, body: bytes, failing: bool) -> Reply:
    """Anthropic's Messages API: ``POST /v1/messages`` (streamed when asked), token counts."""
    if failing:
        error = {"type": "error", "error": {"type": "invalid_request_error", "message": REFUSAL}}
        return 400, "application/json", json.dumps(error).encode()
    if "/messages" not in path or path.split("?", maxsplit=1)[0].endswith("/count_tokens"):
        return 200, "application/json", b'{"input_tokens": 1}'
    try:
        streamed = bool(json.loads(body or b"{}").get("stream"))
    except ValueError:
        streamed = False
    if streamed:
        return 200, "text/event-stream", message_stream()
    return 200, "application/json", json.dumps(MESSAGE).encode()


class ModelApi:
    """One stand-in on 127.0.0.1 speaking ``dialect``; see the module docstring."""

    def __init__(
        self, dialect: Callable[[str, bytes, bool], Reply], *, failing: bool = False
    ) -> None:
        self.bodies: list[bytes] = []
        self.arrivals: list[float] = []
        """When each of ``bodies`` was received (wall clock)."""
        self.failing = failing
        lock, api = threading.Lock(), self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with lock:
                    api.bodies.append(body)
                    api.arrivals.append(time.time())
                status, kind, reply = dialect(self.path, body, api.failing)
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def saw(self, text: str) -> bool:
        """Tell whether a request body held ``text`` (as JSON string content)."""
        return self.first_seen(text) is not None

    def first_seen(self, text: str) -> float | None:
        """When the first request holding ``text`` was received (wall clock), if one was."""
        needle = json.dumps(text)[1:-1].encode()
        received = list(zip(self.arrivals, self.bodies, strict=False))
        return next((at for at, body in received if needle in body), None)

    def requests_with(self, text: str) -> int:
        """How many request bodies held ``text``."""
        needle = json.dumps(text)[1:-1].encode()
        return sum(needle in body for body in list(self.bodies))

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
