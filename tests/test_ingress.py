"""The webhook over real HTTP: `looprelay up`'s server and the Cloud Function's Flask app.

Every bad request gets its status code, a log line with the delivery id, and nothing queued.
"""

from __future__ import annotations

import json
import logging
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import requests

from looprelay.adapters.sqlite.queue import SqliteQueue
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.app.ingress_http import webhook_handler
from looprelay.app.local import LocalStack
from looprelay.app.messages import Request
from looprelay.app.server import LocalServer
from looprelay.config.model import (
    Config,
    EmbeddedQueueConfig,
    RetryConfig,
    ServerConfig,
    WebhookConfig,
)
from looprelay.core.envelope import Envelope
from looprelay.core.signature import sign_body
from looprelay.core.tasknames import task_name_prefix
from looprelay.core.wake import parse_wake
from looprelay.datadir import STORE_FILE
from looprelay.ports import MAX_TASK_BODY_BYTES
from looprelay.service.ingress import Ingress
from tests.cloudtasks_recorder import CloudTasksRecorder, recorder_config
from tests.fake_harness import wait_until
from tests.samples import payload_bytes

SECRET = b"ingress-test-secret"
CAP = 32_768
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Receiver:
    """A webhook under test: how to post to it and what its queue holds."""

    post: Callable[[str, Mapping[str, str], bytes], tuple[int, dict[str, Any]]]
    held: Callable[[], dict[str, bytes]]


def _embedded(tmp_path: Path) -> Iterator[Receiver]:
    (tmp_path / "data").mkdir(mode=0o700)
    secret_file = tmp_path / "data" / "webhook-secret"
    secret_file.write_text(SECRET.decode())
    secret_file.chmod(0o600)
    config = Config(server=ServerConfig(port=0), webhook=WebhookConfig(max_body_bytes=CAP))
    stack = LocalStack(config, data_dir=tmp_path / "data", environ={})
    stack.start()

    def post(method: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        response = requests.request(
            method, stack.webhook_url, headers=dict(headers), data=body, timeout=10
        )
        return response.status_code, response.json()

    def held() -> dict[str, bytes]:
        # The deliveries queued; the worker (running here) may have queued a wake beside them.
        tasks = stack.queue.list_tasks()
        return {t.name: t.body for t in tasks if parse_wake(t.body) is None}

    yield Receiver(post, held)
    stack.stop()


def _cloud_function(
    recorder: CloudTasksRecorder, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Receiver]:
    import functions_framework

    queue = recorder_config(recorder)
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET.decode())
    for key, value in {
        "github__webhookSecrets": "[TEST_WEBHOOK_SECRET]",
        "webhook__maxBodyBytes": str(CAP),
        "queue__backend": "cloudtasks",
        "queue__cloudtasks": json.dumps(queue.model_dump(by_alias=True)),
    }.items():
        monkeypatch.setenv(f"LOOPRELAY__{key}", value)
    # functions-framework's own ASGI application for the entry point, on a loopback port.
    app = functions_framework.create_app(
        target="webhook", source=str(ROOT / "functions" / "main.py")
    )
    server = LocalServer(app, host="127.0.0.1", port=0)
    server.start()
    host, port = server.address

    def post(method: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        response = requests.request(
            method, f"http://{host}:{port}/", headers=dict(headers), data=body, timeout=10
        )
        return response.status_code, response.json()

    yield Receiver(post, recorder.held)
    server.stop()


@pytest.fixture(params=["embedded", "cloud-function"])
def receiver(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Receiver]:
    if request.param == "embedded":
        yield from _embedded(tmp_path)
    else:
        yield from _cloud_function(request.getfixturevalue("cloudtasks_recorder"), monkeypatch)


def _headers(
    body: bytes,
    *,
    event: str = "issue_comment",
    delivery: str | None = None,
    secret: bytes = SECRET,
    content_type: str = "application/json",
) -> dict[str, str]:
    return {
        "Content-Type": content_type,
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": sign_body(body, secret),
    }


COMMENT = payload_bytes("issue_comment.created")


class TestAccepted:
    def test_a_signed_delivery_is_queued_as_a_slim_envelope(self, receiver: Receiver) -> None:
        headers = _headers(COMMENT, delivery="d-accept")
        assert receiver.post("POST", headers, COMMENT) == (
            202,
            {"status": "queued", "delivery": "d-accept"},
        )
        [(name, task)] = receiver.held().items()
        assert name.startswith(task_name_prefix("d-accept"))
        envelope = Envelope.model_validate_json(task)
        assert (envelope.delivery_id, envelope.event, envelope.action) == (
            "d-accept",
            "issue_comment",
            "created",
        )
        assert len(task) < len(COMMENT) / 3

    def test_a_form_encoded_delivery_is_accepted(self, receiver: Receiver) -> None:
        body = urlencode({"payload": COMMENT.decode()}).encode()
        headers = _headers(body, content_type="application/x-www-form-urlencoded")
        assert receiver.post("POST", headers, body)[0] == 202
        assert len(receiver.held()) == 1

    def test_a_redelivery_of_the_same_id_is_queued_again_under_a_name_of_its_own(
        self, receiver: Receiver
    ) -> None:
        """The earlier task may have died with its name reserved; the worker's ledger settles
        a true duplicate once (tests/test_redelivery.py)."""
        headers = _headers(COMMENT, delivery="d-twice")
        assert receiver.post("POST", headers, COMMENT)[1]["status"] == "queued"
        assert receiver.post("POST", headers, COMMENT) == (
            202,
            {"status": "queued", "delivery": "d-twice"},
        )
        first, second = receiver.held().items()
        assert first[0] != second[0]
        # The same envelope but for its receipt (the order key): the ledger keeps the first.
        unkeyed = [json.loads(body) | {"order_key": ""} for _, body in (first, second)]
        assert unkeyed[0] == unkeyed[1]

    def test_a_previous_secret_still_verifies_during_rotation(self, tmp_path: Path) -> None:
        config = Config(
            server=ServerConfig(port=0), github={"webhookSecrets": ["NEW_SECRET", "OLD_SECRET"]}
        )
        stack = LocalStack(
            config, data_dir=tmp_path / "data", environ={"NEW_SECRET": "new", "OLD_SECRET": "old"}
        )
        stack.start()
        try:
            for secret in (b"new", b"old"):
                response = requests.post(
                    stack.webhook_url,
                    data=COMMENT,
                    timeout=10,
                    headers=_headers(COMMENT, secret=secret),
                )
                assert response.status_code == 202
            forged = requests.post(
                stack.webhook_url,
                data=COMMENT,
                timeout=10,
                headers=_headers(COMMENT, secret=b"older"),
            )
            assert forged.status_code == 401
        finally:
            stack.stop()

    def test_json_the_fast_parser_refuses_is_still_accepted_as_json_allows_it(
        self, receiver: Receiver
    ) -> None:
        # An escaped lone surrogate is valid JSON; the Rust parser refuses it, json.loads not.
        body = COMMENT.replace(b'"body": "You are', b'"body": "\\ud800 You are')
        assert b"\\ud800" in body
        assert receiver.post("POST", _headers(body, delivery="d-lone"), body)[0] == 202
        [task] = receiver.held().values()
        envelope = Envelope.model_validate_json(task)
        assert envelope.comment is not None and envelope.comment.body.startswith("\ufffd ")

    def test_ping_gets_200_and_is_queued_for_the_ledger(self, receiver: Receiver) -> None:
        body = payload_bytes("ping")
        headers = _headers(body, event="ping", delivery="d-ping")
        assert receiver.post("POST", headers, body) == (200, {"status": "pong"})
        [held] = [body for name, body in receiver.held().items()
                  if name.startswith(task_name_prefix("d-ping"))]  # fmt: skip
        assert Envelope.model_validate_json(held).event == "ping"

    @pytest.mark.parametrize("event", ["push", "projects_v2_item"])
    def test_an_event_off_the_allow_list_is_acknowledged_and_queued_for_the_ledger(
        self, receiver: Receiver, event: str
    ) -> None:
        body = payload_bytes("push")
        headers = _headers(body, event=event, delivery="d-off-list")
        assert receiver.post("POST", headers, body) == (
            202,
            {"status": "ignored", "delivery": "d-off-list"},
        )
        [held] = [body for name, body in receiver.held().items()
                  if name.startswith(task_name_prefix("d-off-list"))]  # fmt: skip
        assert Envelope.model_validate_json(held).event == event


def test_every_delivery_github_lists_is_in_the_ledger_with_its_outcome(tmp_path: Path) -> None:
    """GitHub's "Recent Deliveries" shows pings and events off the allow-list too: each one
    can be looked up in the ledger by its delivery id, with what became of it."""
    receiver = _embedded(tmp_path)
    posted = next(receiver)
    sent = {"d-ping": "ping", "d-push": "push", "d-projects": "projects_v2_item"}
    for delivery, event in sent.items():
        body = payload_bytes("ping" if event == "ping" else "push")
        assert posted.post("POST", _headers(body, event=event, delivery=delivery), body)[0] < 300
    store = SqliteStore(tmp_path / "data" / STORE_FILE)

    def outcomes() -> dict[str, str] | None:
        found = {d: store.get_delivery(d) for d in sent}
        settled = {d: r.outcome for d, r in found.items() if r is not None and r.settled}
        return settled if len(settled) == len(sent) else None

    assert wait_until(outcomes, what="three settled deliveries") == {
        "d-ping": "pong",
        "d-push": "ignored:event",
        "d-projects": "ignored:event",
    }
    ignored = store.list_deliveries(outcome="ignored")
    assert {r.delivery_id for r in ignored} == {"d-projects", "d-push"}
    store.close()
    next(receiver, None)


def _sha1_only(headers: dict[str, str]) -> dict[str, str]:
    headers = dict(headers)
    del headers["X-Hub-Signature-256"]
    headers["X-Hub-Signature"] = "sha1=0a4d55a8d778e5022fab701977c5d840bbc486d0"
    return headers


def _without(name: str) -> Callable[[dict[str, str]], dict[str, str]]:
    return lambda headers: {k: v for k, v in headers.items() if k != name}


BAD_REQUESTS: list[tuple[str, str, Callable[[dict[str, str]], dict[str, str]], bytes, int]] = [
    # (case, method, headers change, body, status)
    (
        "forged signature",
        "POST",
        lambda h: h | {"X-Hub-Signature-256": "sha256=" + "ab" * 32},
        COMMENT,
        401,
    ),
    (
        "signature for another secret",
        "POST",
        lambda h: h | {"X-Hub-Signature-256": sign_body(COMMENT, b"other")},
        COMMENT,
        401,
    ),
    ("sha-1 only", "POST", _sha1_only, COMMENT, 401),
    ("no signature", "POST", _without("X-Hub-Signature-256"), COMMENT, 401),
    ("missing delivery id", "POST", _without("X-GitHub-Delivery"), COMMENT, 400),
    ("missing event", "POST", _without("X-GitHub-Event"), COMMENT, 400),
    (
        "malformed delivery id",
        "POST",
        lambda h: h | {"X-GitHub-Delivery": "../../etc/passwd"},
        COMMENT,
        400,
    ),
    ("invalid json", "POST", None, b'{"action": "created",', 400),
    ("json that is not an object", "POST", None, b'["a", "list"]', 400),
    ("invalid utf-8", "POST", None, b'{"action": "\xff\xfe"}', 400),
    ("body over the cap", "POST", None, b'{"x": "' + b"a" * CAP + b'"}', 413),
    ("wrong content type", "POST", lambda h: h | {"Content-Type": "text/plain"}, COMMENT, 415),
    ("no content type", "POST", _without("Content-Type"), COMMENT, 415),
    (
        "form without payload field",
        "POST",
        lambda h: h | {"Content-Type": "application/x-www-form-urlencoded"},
        b"other=1",
        400,
    ),
    ("GET", "GET", None, b"", 405),
]


class TestRejected:
    @pytest.mark.parametrize(
        ("method", "change", "body", "status"),
        [case[1:] for case in BAD_REQUESTS],
        ids=[case[0] for case in BAD_REQUESTS],
    )
    def test_bad_requests_get_their_code_a_log_line_and_nothing_queued(
        self,
        receiver: Receiver,
        caplog: pytest.LogCaptureFixture,
        method: str,
        change: Callable[[dict[str, str]], dict[str, str]] | None,
        body: bytes,
        status: int,
    ) -> None:
        headers = _headers(body, delivery="d-bad")
        headers = change(headers) if change else headers
        with caplog.at_level(logging.INFO, logger="looprelay"):
            got, answer = receiver.post(method, headers, body)
        assert got == status
        assert set(answer) == {"error"}
        assert receiver.held() == {}
        if headers.get("X-GitHub-Delivery") == "d-bad":
            assert any(getattr(r, "delivery_id", None) == "d-bad" for r in caplog.records)

    def test_the_error_never_echoes_request_text_unescaped(self, receiver: Receiver) -> None:
        headers = _headers(COMMENT) | {"X-GitHub-Event": "<script>alert(1)</script>"}
        status, answer = receiver.post("POST", headers, COMMENT)
        assert status == 400
        assert "<script>" not in answer["error"]


class TestEmbeddedServerEdges:
    """Cases only a real socket can produce."""

    @pytest.fixture
    def stack(self, tmp_path: Path) -> Iterator[LocalStack]:
        config = Config(server=ServerConfig(port=0), webhook=WebhookConfig(max_body_bytes=CAP))
        stack = LocalStack(config, data_dir=tmp_path / "data", environ={})
        stack.start()
        yield stack
        stack.stop()

    def _raw(self, stack: LocalStack, head: bytes, body: bytes) -> bytes:
        host, port = stack.base_url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(head + body)
            conn.shutdown(socket.SHUT_WR)
            return b"".join(iter(lambda: conn.recv(65536), b""))

    def test_a_truncated_body_is_never_queued(self, stack: LocalStack) -> None:
        body = COMMENT[:500]
        headers = _headers(COMMENT, delivery="d-cut")
        head = (
            "POST /webhook HTTP/1.1\r\nHost: x\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            + f"Content-Length: {len(COMMENT)}\r\n\r\n"
        ).encode()
        # The client stops sending mid-body: the server sees the connection end and has
        # nobody to answer; the partial delivery is dropped, and GitHub records a failure.
        answer = self._raw(stack, head, body)
        assert not answer.startswith(b"HTTP/1.1 2")
        assert stack.queue.list_tasks() == []

    def test_an_oversized_declared_body_is_refused_without_reading_it(
        self, stack: LocalStack
    ) -> None:
        head = (
            "POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {30 * 1024 * 1024}\r\n\r\n"
        ).encode()
        answer = self._raw(stack, head, b"{}")
        assert answer.startswith(b"HTTP/1.1 413")

    def test_an_unknown_path_is_404(self, stack: LocalStack) -> None:
        response = requests.post(stack.base_url + "/nope", data=b"{}", timeout=10)
        assert response.status_code == 404

    def test_health(self, stack: LocalStack) -> None:
        assert requests.get(stack.base_url + "/healthz", timeout=10).json() == {"status": "ok"}


class TestQueueRefusals:
    """A refusal from Cloud Tasks is never the sender's fault: 503 when a retry may succeed,
    500 when our queue configuration or grants are wrong, never a 4xx."""

    @pytest.fixture
    def cloud(
        self, cloudtasks_recorder: CloudTasksRecorder, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[Receiver]:
        yield from _cloud_function(cloudtasks_recorder, monkeypatch)

    @pytest.mark.parametrize(
        ("refusal", "status"),
        [(400, 500), (401, 500), (403, 500), (404, 500), (503, 503), (429, 503), (504, 503)],
    )
    def test_a_refusal_is_503_or_500_by_what_it_means(
        self,
        cloud: Receiver,
        cloudtasks_recorder: CloudTasksRecorder,
        caplog: pytest.LogCaptureFixture,
        refusal: int,
        status: int,
    ) -> None:
        cloudtasks_recorder.fail_next(100, status=refusal)
        with caplog.at_level(logging.ERROR, logger="looprelay"):
            got, answer = cloud.post("POST", _headers(COMMENT, delivery="d-refused"), COMMENT)

        assert (got, set(answer)) == (status, {"error"})
        assert cloudtasks_recorder.held() == {}
        assert any(getattr(r, "delivery_id", None) == "d-refused" for r in caplog.records)


class TestTaskSize:
    def test_text_that_escaping_inflates_is_shrunk_until_the_task_fits_one_megabyte(
        self, tmp_path: Path
    ) -> None:
        queue = SqliteQueue(
            tmp_path / "queue.db", retry=RetryConfig(), settings=EmbeddedQueueConfig()
        )
        ingress = Ingress(
            secrets=[SECRET], queue=queue, config=WebhookConfig(max_text_chars=200_000)
        )
        body_dict = json.loads(COMMENT)
        body_dict["comment"]["body"] = "\u0001" * 200_000  # six bytes each once JSON-escaped
        body = json.dumps(body_dict).encode()
        headers = {k.lower(): v for k, v in _headers(body, delivery="d-huge").items()}
        response = webhook_handler(ingress)(
            Request(method="POST", path="/webhook", headers=headers, body=body)
        )
        assert response.status == 202
        [task] = queue.list_tasks()
        assert len(task.body) <= MAX_TASK_BODY_BYTES
        envelope = Envelope.model_validate_json(task.body)
        assert envelope.comment is not None and 0 < len(envelope.comment.body) < 200_000
        assert "comment.body" in envelope.truncated
        queue.close()
