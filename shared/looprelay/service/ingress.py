"""The webhook: raw HTTP in, a verified slim envelope on the queue, 202 out.

Checks run cheapest first and each failure has one status code. Nothing here runs
policy; it must answer well inside GitHub's 10-second budget.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from secrets import token_hex
from typing import Any
from urllib.parse import parse_qs

from pydantic_core import from_json

from looprelay.adapters.clock import SystemClock
from looprelay.app.messages import Request, Response, json_response
from looprelay.config.model import WebhookConfig
from looprelay.core.envelope import Envelope, project_envelope
from looprelay.core.order import order_group
from looprelay.core.signature import verify_signature
from looprelay.core.tasknames import delivery_task_name
from looprelay.errors import BadDelivery, ConfigError, Permanent, Transient
from looprelay.logsampling import LogSampler
from looprelay.ports import MAX_TASK_BODY_BYTES, Clock, Queue, Task

log = logging.getLogger("looprelay.service.ingress")

EVENT_HEADER = "x-github-event"
DELIVERY_HEADER = "x-github-delivery"
SIGNATURE_HEADER = "x-hub-signature-256"
JSON_TYPE = "application/json"
FORM_TYPE = "application/x-www-form-urlencoded"
_DELIVERY_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_EVENT_NAME = re.compile(r"^[a-z0-9_]{1,64}$")  # projects_v2_item has digits


@dataclass(frozen=True)
class Admission:
    """A verified delivery, projected to its task, waiting to be enqueued."""

    task: Task
    delivery_id: str
    event: str
    action: str | None
    status: str = "queued"
    """The acknowledgement: ``queued``, ``ignored`` (an event off the allow-list) or ``pong``
    (GitHub's ping). All three are queued, so the worker records each in the ledger."""


class Ingress:
    """Verifies deliveries and enqueues them; one instance serves many requests."""

    def __init__(
        self,
        *,
        secrets: Sequence[bytes],
        queue: Queue,
        config: WebhookConfig,
        verify: bool = True,
        rejections: LogSampler | None = None,
        clock: Clock | None = None,
        new_attempt: Callable[[], str] = lambda: token_hex(8),
    ) -> None:
        """``rejections`` decides which refusals are logged (default: the first 10 of each
        status a minute); ``clock`` stamps each delivery's order key; ``new_attempt`` makes the
        token that names each request's task (``core.tasknames``). Raises ``ConfigError`` when
        verification is on and there is no secret (fail closed)."""
        if verify and not secrets:
            raise ConfigError(
                "no webhook secret: set github.webhookSecrets to the names of environment "
                "variables holding the secret; refusing to accept unsigned deliveries"
            )
        self._secrets = tuple(secrets)
        self._queue = queue
        self._config = config
        self._allowed = config.allowed_events()
        self._verify = verify
        self._rejections = rejections or LogSampler()
        self._clock = clock or SystemClock()
        self._new_attempt = new_attempt

    def handle(self, request: Request) -> Response:
        """Answer one webhook request, enqueueing it through the queue port; never raises."""
        admitted = self.admit(request)
        if isinstance(admitted, Response):
            return admitted
        return self.answer(admitted, lambda: self._queue.enqueue(admitted.task))

    def admit(self, request: Request) -> Response | Admission:
        """Check one webhook request: the final answer when it is refused, else the task to
        enqueue (an ignored event's and a ping's too: the worker records them). Never raises.

        With :meth:`answer` it lets a server that must not block (``looprelay up``) enqueue
        the task without waiting, and answer when the enqueue is durable.
        """
        try:
            return self._admit(request)
        except BadDelivery as exc:
            return self._refused(exc, request.headers.get(DELIVERY_HEADER, ""))

    def answer(self, admission: Admission, enqueued: Callable[[], bool]) -> Response:
        """The answer for an admitted delivery once ``enqueued()`` says whether the queue took
        it (True) or already had it (False). Never raises for what ``Queue.enqueue`` raises:
        ``Transient`` becomes 503 and ``Permanent`` (the queue refused: our configuration or
        permissions are wrong, never the sender's request) 500; GitHub records either as a
        failed delivery, which the sweeper redelivers once the cause is fixed.
        """
        delivery_id = admission.delivery_id
        try:
            queued = enqueued()
        except Permanent as exc:
            log.error(
                "the queue refused the delivery; fix the queue's configuration or grants, "
                "the sweeper redelivers it then: %s",
                exc,
                extra={"delivery_id": delivery_id},
            )
            return json_response(500, {"error": "the queue refused the delivery; see the log"})
        except Transient as exc:
            log.error(
                "enqueue failed, GitHub will record a failed delivery: %s",
                exc,
                extra={"delivery_id": delivery_id},
            )
            return json_response(503, {"error": "queue unavailable; redeliver later"})
        log.info(
            "delivery %s",
            "queued" if queued else "duplicate",
            extra={
                "delivery_id": delivery_id,
                "fields": {"event": admission.event, "action": admission.action},
            },
        )
        if admission.status == "pong":
            return json_response(200, {"status": "pong"})
        status = admission.status if queued else "duplicate"
        return json_response(202, {"status": status, "delivery": delivery_id})

    def _refused(self, exc: BadDelivery, delivery_id: str) -> Response:
        # Anyone can send refused requests: the log takes a sample, so noise cannot fill a disk.
        self._rejections.warning(
            log,
            exc.status,
            "webhook rejected: %s",
            exc,
            kind=f"webhook rejections with status {exc.status}",
            extra={"delivery_id": _loggable(delivery_id), "fields": {"status": exc.status}},
        )
        return json_response(exc.status, {"error": str(exc)})

    def _admit(self, request: Request) -> Response | Admission:
        if request.method != "POST":
            raise BadDelivery("only POST is accepted here", status=405)
        self._check_size(request)
        media_type = _media_type(request.headers.get("content-type", ""))
        if media_type not in (JSON_TYPE, FORM_TYPE):
            raise BadDelivery(f"content type must be {JSON_TYPE} or {FORM_TYPE}", status=415)
        event = request.headers.get(EVENT_HEADER, "")
        delivery_id = request.headers.get(DELIVERY_HEADER, "")
        if not _EVENT_NAME.match(event):
            raise BadDelivery("missing or malformed X-GitHub-Event header")
        if not _DELIVERY_ID.match(delivery_id):
            raise BadDelivery("missing or malformed X-GitHub-Delivery header")
        self._check_signature(request)
        payload = _decode(request.body, media_type)
        status = "pong" if event == "ping" else "queued" if event in self._allowed else "ignored"
        if status == "ignored":
            log.info(
                "event %s is not on the allow-list; recorded as ignored",
                event,
                extra={"delivery_id": delivery_id},
            )
        envelope, body = self._project(event, delivery_id, payload)
        # A name of its own: the task of an earlier attempt may have died with its name still
        # reserved; a true duplicate is settled once by the worker's ledger.
        task = Task(
            name=delivery_task_name(delivery_id, attempt=self._new_attempt()),
            body=body,
            group=order_group(envelope),
            order_key=envelope.order_key,
        )
        return Admission(
            task=task, delivery_id=delivery_id, event=event, action=envelope.action, status=status
        )

    def _check_size(self, request: Request) -> None:
        declared = request.headers.get("content-length")
        length = _decimal(declared) if declared is not None else None
        limit = self._config.max_body_bytes
        if len(request.body) > limit or (length is not None and length > limit):
            raise BadDelivery(f"body larger than {limit} bytes", status=413)
        if declared is not None and length != len(request.body):
            raise BadDelivery("body length does not match Content-Length (truncated?)")

    def _check_signature(self, request: Request) -> None:
        if not self._verify:
            log.warning(
                "SIGNATURE NOT VERIFIED: started with --insecure-no-verify; "
                "never expose this server"
            )
            return
        header = request.headers.get(SIGNATURE_HEADER)
        if header is None:
            legacy = "x-hub-signature" in request.headers
            raise BadDelivery(
                "SHA-1 X-Hub-Signature is not accepted; send X-Hub-Signature-256"
                if legacy
                else "missing X-Hub-Signature-256 header",
                status=401,
            )
        if not verify_signature(request.body, header, self._secrets):
            raise BadDelivery("signature does not match any configured secret", status=401)

    def _project(
        self, event: str, delivery_id: str, payload: dict[str, Any]
    ) -> tuple[Envelope, bytes]:
        # A Cloud Task holds 1 MB with its name and headers; escaping and UTF-8 can inflate
        # text up to six-fold, so shrink the per-field cap until the encoded envelope fits
        # rather than refuse it.
        cap = self._config.max_text_chars
        received_at = self._clock.now()
        while True:
            envelope = project_envelope(
                event=event,
                delivery_id=delivery_id,
                payload=payload,
                max_text_chars=cap,
                received_at=received_at,
            )
            body = envelope.model_dump_json().encode()
            if len(body) <= MAX_TASK_BODY_BYTES or cap <= 1:
                return envelope, body
            cap //= 2


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _decode(body: bytes, media_type: str) -> dict[str, Any]:
    """Decode the JSON object GitHub sent, directly or as the form field ``payload``."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadDelivery("body is not valid UTF-8") from exc
    if media_type == FORM_TYPE:
        fields = parse_qs(text, keep_blank_values=True, strict_parsing=False)
        values = fields.get("payload")
        if not values or len(values) != 1:
            raise BadDelivery("form body must carry exactly one payload= field")
        text = values[0]
    try:
        # pydantic-core's parser costs half of json.loads, an ack's biggest step.
        payload = from_json(text, cache_strings=False)
    except ValueError:
        # It refuses some JSON that json.loads takes (an escaped lone surrogate, very deep
        # nesting); only such bodies pay for the second parse.
        try:
            payload = json.loads(text)
        except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, huge ints
            raise BadDelivery("body is not valid JSON") from exc
    if not isinstance(payload, dict):
        raise BadDelivery("payload must be a JSON object")
    return payload


def _decimal(text: str) -> int | None:
    """The value of an all-ASCII-digits header, else None (``"²".isdigit()`` is true)."""
    return int(text) if text.isascii() and text.isdigit() else None


def _loggable(delivery_id: str) -> str | None:
    """Only a well-formed delivery id reaches the logs; anything else could forge lines."""
    return delivery_id if _DELIVERY_ID.match(delivery_id) else None
