"""The webhook's HTTP face: ingress's outcomes as status codes and JSON bodies, for the cloud's
blocking handler and ``looprelay up``'s durable ack (``app/webhook.py``) alike."""

from __future__ import annotations

from collections.abc import Mapping

from looprelay.app.asgi import Handler, too_large
from looprelay.app.asgi import Refusal as BodyRefusal
from looprelay.app.messages import Request, Response, json_response
from looprelay.service.ingress import Acknowledgement, Ingress, Refusal, RefusalKind

REFUSAL_STATUS: Mapping[RefusalKind, int] = {
    RefusalKind.METHOD_NOT_ALLOWED: 405,
    RefusalKind.TOO_LARGE: 413,
    RefusalKind.UNSUPPORTED_MEDIA: 415,
    RefusalKind.BAD_REQUEST: 400,
    RefusalKind.BAD_SIGNATURE: 401,
    RefusalKind.QUEUE_UNAVAILABLE: 503,
    RefusalKind.QUEUE_MISCONFIGURED: 500,
}
"""Each refusal's status code. GitHub records a 5xx as a failed delivery, which the sweeper
redelivers once the queue is back or fixed."""


def webhook_handler(ingress: Ingress) -> Handler:
    """The webhook as a blocking handler: checks, then enqueues through the queue port and
    waits for it (the cloud's webhook). Never raises."""

    def handle(request: Request) -> Response:
        return webhook_answer(ingress.receive(request.method, request.headers, request.body))

    return handle


def webhook_answer(outcome: Acknowledgement | Refusal) -> Response:
    """The HTTP answer to one delivery's outcome: 202 with its status and id (200 for GitHub's
    ping), or the refusal's status code with its message."""
    if isinstance(outcome, Refusal):
        return json_response(REFUSAL_STATUS[outcome.kind], {"error": outcome.message})
    if outcome.status == "pong":
        return json_response(200, {"status": "pong"})
    return json_response(202, {"status": outcome.status, "delivery": outcome.delivery_id})


def size_refusal(ingress: Ingress) -> BodyRefusal:
    """The webhook's 413 as ingress gives it (logged with the delivery id): ingress judges
    the request by a Content-Length past the cap, its body never read."""

    def refuse(request: Request, cap: int) -> Response:
        oversized = {**request.headers, "content-length": str(cap + 1)}
        admitted = ingress.admit(request.method, oversized, request.body)
        return (
            webhook_answer(admitted) if isinstance(admitted, Refusal) else too_large(request, cap)
        )

    return refuse
