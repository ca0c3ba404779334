"""The worker's HTTP face: a queue task's POST in, the worker's settlement as 200 out.

The queue reads the status alone: 2xx ends the task (a delivery settled ``failed`` too, a dead
letter to replay, and one waiting in its inbox for a wake the worker queued), 5xx retries it
with backoff, and 4xx is a caller that is not the queue or a body ingress did not write.
"""

from __future__ import annotations

import math
from dataclasses import replace

from looprelay.app.asgi import Handler
from looprelay.app.messages import Request, Response, json_response
from looprelay.errors import BadDelivery, Transient, Unauthorized
from looprelay.service.worker import Settlement, Worker


def worker_handler(worker: Worker) -> Handler:
    """The worker as a blocking handler: each POST settles one delivery. Never raises."""

    def handle(request: Request) -> Response:
        if request.method != "POST":
            return json_response(405, {"error": "only POST is accepted here"})
        try:
            settlement = worker.settle(request.headers, request.body)
        except Unauthorized as exc:
            return json_response(exc.status, {"error": str(exc)})
        except BadDelivery as exc:
            return json_response(400, {"error": str(exc)})
        except Transient as exc:
            # The worker's own message, never its cause's: the queue retries either way.
            busy = json_response(503, {"error": str(exc)})
            if exc.retry_after is None:
                return busy
            # Whole seconds (RFC 9110), rounded up: a sooner retry would find it not ready.
            return replace(busy, headers={"retry-after": str(math.ceil(exc.retry_after))})
        return json_response(200, _answer(settlement))

    return handle


def _answer(settlement: Settlement) -> dict[str, str | None]:
    if settlement.waiting_until is not None:
        # Done for the queue: the wake queued for then brings the inbox back.
        return {"status": "waiting", "until": settlement.waiting_until.isoformat()}
    status = "already-settled" if settlement.already else "settled"
    return {"status": status, "outcome": settlement.outcome}
