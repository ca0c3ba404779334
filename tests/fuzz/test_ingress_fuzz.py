"""Property-based tests of the webhook (``app.ingress_http`` over ``Ingress``), real embedded queue.

Whatever arrives (headers in any case, missing or odd; any bytes; any size around the cap;
signed or not), the webhook answers: 202/200 for what it takes, a 4xx with a small JSON error
for what it refuses, 503 or 500 only when the queue fails, and never raises. A correctly signed
allowed event is queued exactly once, as an envelope that fits a Cloud Task with every text
field within its cap; a refusal queues nothing.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from hypothesis import given
from hypothesis import strategies as st

from looprelay.adapters.sqlite.queue import SqliteQueue
from looprelay.app.ingress_http import webhook_handler
from looprelay.app.messages import Request, Response, lower_headers
from looprelay.config.model import EmbeddedQueueConfig, RetryConfig, WebhookConfig
from looprelay.core.envelope import NAME_CAP, TITLE_CAP, Envelope
from looprelay.core.signature import sign_body
from looprelay.core.tasknames import task_name_prefix
from looprelay.errors import Permanent, Transient
from looprelay.ports import MAX_TASK_BODY_BYTES, Task
from looprelay.service.ingress import Ingress
from tests.fuzz.budget import examples
from tests.fuzz.strategies import ANY_CHAR, JSON_VALUES, github_payloads
from tests.samples import payload_bytes

SECRETS = (b"primary-secret", b"previous-secret")
CAP = 16_384
JSON_TYPE = "application/json"
FORM_TYPE = "application/x-www-form-urlencoded"
REFUSALS = {400, 401, 405, 413, 415}
COMMENT = payload_bytes("issue_comment.created")


@dataclass
class Outcome:
    """What one request got, and what the queue held afterwards."""

    response: Response
    tasks: dict[str, bytes]

    @property
    def answer(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.response.body)
        return loaded


@contextmanager
def _ingress(config: WebhookConfig) -> Iterator[tuple[Ingress, SqliteQueue]]:
    with tempfile.TemporaryDirectory() as directory:
        queue = SqliteQueue(
            Path(directory) / "queue.db", retry=RetryConfig(), settings=EmbeddedQueueConfig()
        )
        try:
            yield Ingress(secrets=SECRETS, queue=queue, config=config), queue
        finally:
            queue.close()


def _send(config: WebhookConfig, *requests: Request) -> list[Outcome]:
    """Hand each request to a fresh webhook in turn; never lets an exception pass silently."""
    outcomes = []
    with _ingress(config) as (ingress, queue):
        for request in requests:
            response = webhook_handler(ingress)(request)
            tasks = {task.name: task.body for task in queue.list_tasks()}
            outcomes.append(Outcome(response, tasks))
    return outcomes


def _request(
    body: bytes,
    *,
    delivery: str,
    event: str,
    content_type: str = JSON_TYPE,
    secret: bytes = SECRETS[0],
    extra: dict[str, str] | None = None,
) -> Request:
    headers = {
        "Content-Type": content_type,
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": sign_body(body, secret),
        "Content-Length": str(len(body)),
        **(extra or {}),
    }
    # Servers lower-case names at their edge (httpmsg); the webhook sees what they pass on.
    return Request(method="POST", path="/webhook", headers=lower_headers(headers), body=body)


def _assert_refusal(outcome: Outcome) -> None:
    assert outcome.response.status in REFUSALS, outcome.response
    assert outcome.response.content_type == "application/json"
    assert set(outcome.answer) == {"error"} and isinstance(outcome.answer["error"], str)
    assert outcome.tasks == {}


def _walk_text(envelope: Envelope) -> Iterator[tuple[str, str, int]]:
    """Every text field of an envelope with the cap it must respect (free text: the config's)."""
    yield from (("delivery_id", envelope.delivery_id, 128), ("event", envelope.event, 64))
    names: list[tuple[str, str | None]] = [("action", envelope.action), ("label", envelope.label)]
    for actor in (envelope.sender, envelope.comment and envelope.comment.author):
        names.append(("login", actor.login if actor else None))
    if envelope.repository:
        names.append(("repository", envelope.repository.full_name))
    if envelope.pull_request:
        pr = envelope.pull_request
        names += [("head_ref", pr.head_ref), ("base_ref", pr.base_ref), ("state", pr.state)]
        yield ("pull_request.title", pr.title, TITLE_CAP)
        yield ("pull_request.body", pr.body, -1)
    if envelope.issue:
        yield ("issue.title", envelope.issue.title, TITLE_CAP)
        names += [("issue.label", label) for label in envelope.issue.labels]
    if envelope.comment:
        yield ("comment.body", envelope.comment.body, -1)
    names += [("repo", name) for name in envelope.repositories_added]
    yield from ((field, value, NAME_CAP) for field, value in names if value is not None)


class TestSignedAllowedDeliveries:
    @examples(0.8)
    @given(
        event_payload=github_payloads(),
        form=st.booleans(),
        ascii_json=st.booleans(),
        secret=st.sampled_from(SECRETS),
        max_text_chars=st.sampled_from([256, 4_096, 65_536, 200_000]),
        content_type_case=st.sampled_from(["", "; charset=utf-8", "upper"]),
    )
    def test_is_queued_exactly_once_within_the_task_and_text_caps(
        self,
        event_payload: tuple[str, dict[str, Any]],
        form: bool,
        ascii_json: bool,
        secret: bytes,
        max_text_chars: int,
        content_type_case: str,
    ) -> None:
        event, data = event_payload
        text = json.dumps(data, ensure_ascii=ascii_json)
        if _has_surrogate(text):  # a lone surrogate has no UTF-8 form: GitHub escapes it
            text = json.dumps(data)
        body = (urlencode({"payload": text}) if form else text).encode()
        content_type = FORM_TYPE if form else JSON_TYPE
        if content_type_case == "upper":
            content_type = content_type.upper()
        else:
            content_type += content_type_case
        delivery = str(uuid.uuid4())
        request = _request(
            body, delivery=delivery, event=event, content_type=content_type, secret=secret
        )
        first, again = _send(WebhookConfig(max_text_chars=max_text_chars), request, request)

        assert (first.response.status, first.answer) == (
            202,
            {"status": "queued", "delivery": delivery},
        )
        [(name, task_body)] = first.tasks.items()
        assert name.startswith(task_name_prefix(delivery))
        assert len(task_body) <= MAX_TASK_BODY_BYTES
        envelope = Envelope.model_validate_json(task_body)
        assert (envelope.delivery_id, envelope.event) == (delivery, event)
        for field, value, cap in _walk_text(envelope):
            assert len(value) <= (max_text_chars if cap < 0 else cap), field
        # Queued again under a name of its own; the worker's ledger settles it once.
        assert (again.response.status, again.answer["status"]) == (202, "queued")
        # The same envelope both times, but for an event that is not a new comment, whose order
        # key is the moment the webhook received it.
        bodies = [Envelope.model_validate_json(b) for b in again.tasks.values()]
        assert [b.model_copy(update={"order_key": ""}) for b in bodies] == [
            envelope.model_copy(update={"order_key": ""})
        ] * 2

    @examples(0.4)
    @given(length=st.integers(0, 8), char=st.sampled_from(["a", "é", "\U0001f600"]))
    def test_a_body_around_the_cap_is_taken_up_to_it_and_refused_beyond(
        self, length: int, char: str
    ) -> None:
        data = json.loads(COMMENT)
        data["comment"]["body"] = ""
        empty = json.dumps(data, ensure_ascii=False).encode()
        filler = (CAP - len(empty)) // len(char.encode()) - 4 + length
        data["comment"]["body"] = char * filler
        body = json.dumps(data, ensure_ascii=False).encode()
        [outcome] = _send(
            WebhookConfig(max_body_bytes=CAP),
            _request(body, delivery="d-cap", event="issue_comment"),
        )
        if len(body) <= CAP:
            assert outcome.response.status == 202
            assert len(outcome.tasks) == 1
        else:
            assert outcome.response.status == 413
            _assert_refusal(outcome)


class _FailingQueue:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def enqueue(self, task: Task) -> bool:
        self.calls += 1
        raise self.error


class TestQueueFailures:
    @examples(0.2)
    @given(event_payload=github_payloads(), transient=st.booleans())
    def test_a_failing_queue_is_503_when_transient_and_500_when_permanent(
        self, event_payload: tuple[str, dict[str, Any]], transient: bool
    ) -> None:
        event, data = event_payload
        body = json.dumps(data).encode()
        error = Transient("queue down") if transient else Permanent("no such queue")
        queue = _FailingQueue(error)
        ingress = Ingress(secrets=SECRETS, queue=queue, config=WebhookConfig())
        response = webhook_handler(ingress)(_request(body, delivery="d-fail", event=event))
        assert queue.calls == 1
        assert response.status == (503 if transient else 500)
        assert set(json.loads(response.body)) == {"error"}


# -- arbitrary requests ---------------------------------------------------------------------

HEADER_NAMES = st.sampled_from(
    [
        "Content-Type",
        "content-type",
        "CONTENT-TYPE",
        "X-GitHub-Event",
        "x-github-event",
        "X-GITHUB-DELIVERY",
        "X-GitHub-Delivery",
        "X-Hub-Signature-256",
        "x-hub-signature-256",
        "X-Hub-Signature",
        "Content-Length",
        "Transfer-Encoding",
        "User-Agent",
    ]
)
# ASCII only: a non-ASCII digit in Content-Length is its own case below.
HEADER_VALUES = st.one_of(
    st.sampled_from(
        [
            JSON_TYPE,
            FORM_TYPE,
            "Application/JSON; charset=utf-8",
            "text/plain",
            "",
            "issue_comment",
            "ping",
            "push",
            "ISSUES",
            "../../etc/passwd",
            "sha256=" + "0" * 64,
            "sha1=" + "0" * 40,
            "sha256=zz",
            "-1",
            "0",
            "99999999999999999999",
            "chunked",
        ]
    ),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
)
BODIES = st.one_of(
    st.binary(max_size=300),
    st.just(COMMENT),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    st.sampled_from(
        [
            b"",
            b"{}",
            b"[" * 50_000 + b"]" * 50_000,
            b'{"a":' * 3_000 + b"1" + b"}" * 3_000,
            b"\xff\xfe{}",
            b'{"action": "\xed\xa0\x80"}',  # an encoded surrogate: not UTF-8
            b"payload=%7B%7D&payload=%7B%7D",
            b"payload=%FF",
            b"payload=" + b"%5B" * 5_000,
            b"other=1",
            b'{"x": "' + b"a" * CAP + b'"}',
        ]
    ),
    st.text(ANY_CHAR, max_size=50).map(
        lambda t: urlencode({"payload": t}, errors="surrogatepass").encode()
    ),
)


@st.composite
def arbitrary_requests(draw: st.DrawFn) -> tuple[Request, bool]:
    """A request of any shape; True when it is signed correctly (a signature is no licence)."""
    body = draw(BODIES)
    headers = draw(st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=8))
    signed = draw(st.booleans())
    if signed:
        headers["X-Hub-Signature-256"] = sign_body(body, draw(st.sampled_from(SECRETS)))
    if draw(st.booleans()):
        headers["X-GitHub-Delivery"] = str(uuid.uuid4())
    if draw(st.booleans()):
        headers["X-GitHub-Event"] = draw(st.sampled_from(["issue_comment", "issues", "ping"]))
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "HEAD", "DELETE"]))
    request = Request(method=method, path="/webhook", headers=lower_headers(headers), body=body)
    return request, signed


class TestArbitraryRequests:
    @examples(1.5)
    @given(arbitrary=arbitrary_requests())
    def test_every_answer_is_json_and_only_an_accepted_delivery_is_queued(
        self, arbitrary: tuple[Request, bool]
    ) -> None:
        request, _ = arbitrary
        [outcome] = _send(WebhookConfig(max_body_bytes=CAP), request)
        status = outcome.response.status
        assert outcome.response.content_type == "application/json"
        if status in REFUSALS:
            _assert_refusal(outcome)
        elif status == 200:
            # A ping is queued too, so the ledger records it (``pong``).
            assert outcome.answer == {"status": "pong"}
            [name] = outcome.tasks
            assert name.startswith(task_name_prefix(request.headers["x-github-delivery"]))
        else:
            assert status == 202, outcome.response
            delivery = request.headers["x-github-delivery"]
            if outcome.answer["status"] != "ignored":
                assert outcome.answer == {"status": "queued", "delivery": delivery}
            # An ignored event is queued as well, for the ledger (``ignored:event``).
            [(name, task_body)] = outcome.tasks.items()
            assert name.startswith(task_name_prefix(delivery))
            assert len(task_body) <= MAX_TASK_BODY_BYTES

    @examples(0.6)
    @given(
        body=BODIES,
        signature=st.one_of(
            st.none(), HEADER_VALUES, st.just("sha256=" + "A" * 64), st.text(max_size=80)
        ),
    )
    def test_a_request_not_signed_with_a_configured_secret_is_401_and_queues_nothing(
        self, body: bytes, signature: str | None
    ) -> None:
        request = _request(body, delivery="d-forged", event="issue_comment")
        headers = dict(request.headers)
        headers.pop("x-hub-signature-256")
        if signature is not None:
            headers["x-hub-signature-256"] = signature
        forged = Request(method="POST", path="/webhook", headers=headers, body=body)
        [outcome] = _send(WebhookConfig(max_body_bytes=CAP * 4), forged)
        _assert_refusal(outcome)
        if len(body) <= CAP * 4:
            assert outcome.response.status == 401


def _has_surrogate(text: str) -> bool:
    return any("\ud800" <= char <= "\udfff" for char in text)


class TestIngressRegressions:
    """Inputs the fuzzing found that escape ``Ingress.receive`` (service/ingress.py is the
    lead's to fix)."""

    def test_an_integer_of_5000_digits_is_400_not_an_exception(self) -> None:
        body = b'{"action": "created", "n": ' + b"1" * 5_000 + b"}"
        [outcome] = _send(WebhookConfig(), _request(body, delivery="d-int", event="issues"))
        assert outcome.response.status == 400
        _assert_refusal(outcome)

    def test_a_content_length_of_a_non_ascii_digit_is_400_not_an_exception(self) -> None:
        request = _request(COMMENT, delivery="d-len", event="issue_comment")
        headers = dict(request.headers) | {"content-length": "\u00b2"}
        [outcome] = _send(
            WebhookConfig(), Request(method="POST", path="/webhook", headers=headers, body=COMMENT)
        )
        assert outcome.response.status == 400
        _assert_refusal(outcome)
