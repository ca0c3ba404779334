"""The webhook's stage: a request's parts in, a verified slim envelope on the queue, and an
``Acknowledgement`` or a ``Refusal`` out (``app/ingress_http.py`` gives each its HTTP answer).

Checks run cheapest first and each failure has one refusal kind. Nothing here runs
policy; it must answer well inside GitHub's 10-second budget.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from secrets import token_hex
from typing import Any
from urllib.parse import parse_qs

from pydantic_core import from_json

from looprelay.adapters.clock import SystemClock
from looprelay.config.model import WebhookConfig
from looprelay.core.envelope import Envelope, project_envelope
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


class RefusalKind(StrEnum):
    """Why a delivery was not taken: who must act, and the one answer it earns."""

    METHOD_NOT_ALLOWED = "method-not-allowed"
    TOO_LARGE = "too-large"
    UNSUPPORTED_MEDIA = "unsupported-media"
    BAD_REQUEST = "bad-request"
    BAD_SIGNATURE = "bad-signature"
    QUEUE_UNAVAILABLE = "queue-unavailable"
    """The queue failed for now; GitHub records a failed delivery the sweeper redelivers."""
    QUEUE_MISCONFIGURED = "queue-misconfigured"
    """The queue refused the task: our configuration or grants, never the sender's request."""


@dataclass(frozen=True)
class Refusal:
    """A delivery not taken: its kind and a one-line message safe to send back."""

    kind: RefusalKind
    message: str


@dataclass(frozen=True)
class Acknowledgement:
    """A delivery taken: ``status`` is the admission's (``queued``, ``ignored``, ``pong``) or
    ``duplicate`` when the queue already had its task (a ping stays ``pong``)."""

    delivery_id: str
    status: str


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
        new_attempt: Callable[[], str] | None = None,
    ) -> None:
        """``rejections`` decides which refusals are logged (default: the first 10 of each
        status a minute); ``clock`` stamps each delivery's order key; ``new_attempt`` makes the
        token that names each request's task (default :func:`attempt_tokens`). Raises
        ``ConfigError`` when verification is on and there is no secret (fail closed)."""
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
        self._new_attempt = new_attempt or attempt_tokens()

    def receive(
        self, method: str, headers: Mapping[str, str], body: bytes
    ) -> Acknowledgement | Refusal:
        """Take one delivery (``headers`` with lower-case names), enqueueing it through the
        queue port; never raises."""
        admitted = self.admit(method, headers, body)
        if isinstance(admitted, Refusal):
            return admitted
        return self.acknowledge(admitted, lambda: self._queue.enqueue(admitted.task))

    def admit(self, method: str, headers: Mapping[str, str], body: bytes) -> Admission | Refusal:
        """Check one delivery: why it is refused (logged, sampled), else the task to enqueue
        (an ignored event's and a ping's too: the worker records them). Never raises.

        With :meth:`acknowledge` it lets a server that must not block (``looprelay up``)
        enqueue the task without waiting, and answer when the enqueue is durable.
        """
        admitted = self._admit(method, headers, body)
        if isinstance(admitted, Refusal):
            self._log_refusal(admitted, headers.get(DELIVERY_HEADER, ""))
        return admitted

    def acknowledge(
        self, admission: Admission, enqueued: Callable[[], bool]
    ) -> Acknowledgement | Refusal:
        """The outcome for an admitted delivery once ``enqueued()`` says whether the queue
        took it; see :func:`acknowledge`."""
        return acknowledge(admission, enqueued)

    def _log_refusal(self, refusal: Refusal, delivery_id: str) -> None:
        # Anyone can send refused requests: the log takes a sample, so noise cannot fill a disk.
        self._rejections.warning(
            log,
            refusal.kind,
            "webhook rejected: %s",
            refusal.message,
            kind=f"webhook rejections of kind {refusal.kind}",
            extra={"delivery_id": _loggable(delivery_id), "fields": {"refusal": refusal.kind}},
        )

    def _admit(self, method: str, headers: Mapping[str, str], body: bytes) -> Admission | Refusal:
        if method != "POST":
            return Refusal(RefusalKind.METHOD_NOT_ALLOWED, "only POST is accepted here")
        media_type = _media_type(headers.get("content-type", ""))
        event = headers.get(EVENT_HEADER, "")
        delivery_id = headers.get(DELIVERY_HEADER, "")
        refused = (
            self._check_size(headers, body)
            or _check_media_type(media_type)
            or _check_names(event, delivery_id)
            or self._check_signature(headers, body)
        )
        if refused is not None:
            return refused
        try:
            payload = _decode(body, media_type)
        except BadDelivery as exc:
            return Refusal(RefusalKind.BAD_REQUEST, str(exc))
        status = "pong" if event == "ping" else "queued" if event in self._allowed else "ignored"
        if status == "ignored":
            log.info(
                "event %s is not on the allow-list; recorded as ignored",
                event,
                extra={"delivery_id": delivery_id},
            )
        return admit_payload(
            event=event,
            delivery_id=delivery_id,
            payload=payload,
            config=self._config,
            received_at=self._clock.now(),
            attempt=self._new_attempt(),
            status=status,
        )

    def _check_size(self, headers: Mapping[str, str], body: bytes) -> Refusal | None:
        declared = headers.get("content-length")
        length = _decimal(declared) if declared is not None else None
        limit = self._config.max_body_bytes
        if len(body) > limit or (length is not None and length > limit):
            return Refusal(RefusalKind.TOO_LARGE, f"body larger than {limit} bytes")
        if declared is not None and length != len(body):
            return Refusal(
                RefusalKind.BAD_REQUEST, "body length does not match Content-Length (truncated?)"
            )
        return None

    def _check_signature(self, headers: Mapping[str, str], body: bytes) -> Refusal | None:
        if not self._verify:
            log.warning(
                "SIGNATURE NOT VERIFIED: started with --insecure-no-verify; "
                "never expose this server"
            )
            return None
        header = headers.get(SIGNATURE_HEADER)
        if header is None:
            legacy = "x-hub-signature" in headers
            return Refusal(
                RefusalKind.BAD_SIGNATURE,
                "SHA-1 X-Hub-Signature is not accepted; send X-Hub-Signature-256"
                if legacy
                else "missing X-Hub-Signature-256 header",
            )
        if not verify_signature(body, header, self._secrets):
            return Refusal(
                RefusalKind.BAD_SIGNATURE, "signature does not match any configured secret"
            )
        return None


def admit_payload(
    *,
    event: str,
    delivery_id: str,
    payload: Mapping[str, Any],
    config: WebhookConfig,
    received_at: datetime,
    attempt: str,
    status: str = "queued",
) -> Admission:
    """The task for a delivery already verified (a webhook's signature) or read from GitHub
    itself (the poller's): its envelope, its name, its order. Never raises for payload shape.

    Both front doors admit through here, so the worker cannot tell them apart.
    """
    envelope, body = _project(event, delivery_id, payload, config, received_at)
    # A name of its own: the task of an earlier attempt may have died with its name still
    # reserved; a true duplicate is settled once by the worker's ledger.
    task = Task(name=delivery_task_name(delivery_id, attempt=attempt), body=body)
    return Admission(
        task=task, delivery_id=delivery_id, event=event, action=envelope.action, status=status
    )


def acknowledge(admission: Admission, enqueued: Callable[[], bool]) -> Acknowledgement | Refusal:
    """The outcome for an admitted delivery once ``enqueued()`` says whether the queue took
    it (True) or already had it (False). Never raises for what ``Queue.enqueue`` raises:
    ``Transient`` is ``queue-unavailable`` and ``Permanent`` ``queue-misconfigured``;
    GitHub records either as a failed delivery, which the sweeper redelivers once the cause
    is fixed.
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
        return Refusal(
            RefusalKind.QUEUE_MISCONFIGURED, "the queue refused the delivery; see the log"
        )
    except Transient as exc:
        log.error(
            "enqueue failed, GitHub will record a failed delivery: %s",
            exc,
            extra={"delivery_id": delivery_id},
        )
        return Refusal(RefusalKind.QUEUE_UNAVAILABLE, "queue unavailable; redeliver later")
    log.info(
        "delivery %s",
        "queued" if queued else "duplicate",
        extra={
            "delivery_id": delivery_id,
            "fields": {"event": admission.event, "action": admission.action},
        },
    )
    unchanged = queued or admission.status == "pong"
    return Acknowledgement(delivery_id, admission.status if unchanged else "duplicate")


def _project(
    event: str,
    delivery_id: str,
    payload: Mapping[str, Any],
    config: WebhookConfig,
    received_at: datetime,
) -> tuple[Envelope, bytes]:
    # A Cloud Task holds 1 MB with its name and headers; escaping and UTF-8 can inflate
    # text up to six-fold, so shrink the per-field cap until the encoded envelope fits
    # rather than refuse it.
    cap = config.max_text_chars
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


def attempt_tokens() -> Callable[[], str]:
    """A maker of tokens unique to each request of this process (``core.tasknames``): a
    random prefix drawn once, then a count. A fresh random token each took a system call
    that let the queue's threads take the interpreter from the ack."""
    prefix = token_hex(6)
    count = itertools.count()
    return lambda: f"{prefix}{next(count):x}"


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _check_media_type(media_type: str) -> Refusal | None:
    if media_type in (JSON_TYPE, FORM_TYPE):
        return None
    return Refusal(
        RefusalKind.UNSUPPORTED_MEDIA, f"content type must be {JSON_TYPE} or {FORM_TYPE}"
    )


def _check_names(event: str, delivery_id: str) -> Refusal | None:
    if not _EVENT_NAME.match(event):
        return Refusal(RefusalKind.BAD_REQUEST, "missing or malformed X-GitHub-Event header")
    if not _DELIVERY_ID.match(delivery_id):
        return Refusal(RefusalKind.BAD_REQUEST, "missing or malformed X-GitHub-Delivery header")
    return None


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
