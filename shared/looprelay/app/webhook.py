"""The webhook's HTTP face: ingress's outcomes as status codes and JSON bodies; in the cloud a
blocking handler, in ``looprelay up`` an async one acked once its enqueue is durable, ahead of
the queue's own work."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future

from looprelay.app.asgi import AsyncHandler, Handler, too_large
from looprelay.app.asgi import Refusal as BodyRefusal
from looprelay.app.messages import Request, Response, json_response
from looprelay.ports import Task
from looprelay.service.ingress import Acknowledgement, Ingress, Refusal, RefusalKind

log = logging.getLogger("looprelay.up")

IDLE_GRACE_SECONDS = 0.002
"""How long the webhook must have been idle before background work goes ahead. Between two
deliveries of a burst the webhook is idle for a fraction of a millisecond; work started in
that gap holds the interpreter when the next request arrives (a third of the acks per second
at 8 connections in ``bench/ingress.py``). Outside bursts it delays routing by this much."""

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

EnqueueSoon = Callable[[Task], "Future[bool]"]
"""Start a durable enqueue; the future resolves once it is on disk (``Queue.enqueue``'s
answer or exception)."""


class WebhookPressure:
    """Counts webhook requests in flight, so background work can let them go first.

    GitHub waits 10 s for an ack and never retries a failed delivery by itself, while a
    queued task has hours; in one process the two share a core (and the GIL), so during a
    burst the queue's dispatchers wait for the webhook to be idle (for a bounded time).
    """

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._in_flight = 0
        self._last_answered = 0.0  # time.monotonic() when the in-flight count last hit 0

    def tracking(self, handle: AsyncHandler) -> AsyncHandler:
        """Wrap ``handle`` so each request counts from its arrival until it is answered."""

        async def tracked(request: Request) -> Response:
            with self._idle:
                self._in_flight += 1
            try:
                return await handle(request)
            finally:
                with self._idle:
                    self._in_flight -= 1
                    if not self._in_flight:
                        self._last_answered = time.monotonic()
                        self._idle.notify_all()

        return tracked

    def wait_until_idle(self, seconds: float) -> None:
        """Return once no webhook request has been in flight for ``IDLE_GRACE_SECONDS``, or
        after ``seconds``."""
        deadline = time.monotonic() + seconds
        with self._idle:
            while (remaining := deadline - time.monotonic()) > 0:
                if self._in_flight:
                    self._idle.wait(remaining)
                    continue
                quiet = time.monotonic() - self._last_answered
                if quiet >= IDLE_GRACE_SECONDS:
                    return
                self._idle.wait(min(remaining, IDLE_GRACE_SECONDS - quiet))


def acknowledge_when_durable(ingress: Ingress, enqueue_soon: EnqueueSoon) -> AsyncHandler:
    """The webhook for an event loop: checks run on the loop (a fraction of a millisecond of
    Python), the task joins the queue's next group commit, and the 202 goes out once that
    commit is on disk. No thread waits for the fsync."""

    async def handle(request: Request) -> Response:
        admitted = ingress.admit(request.method, request.headers, request.body)
        if isinstance(admitted, Refusal):
            return webhook_answer(admitted)
        landed = asyncio.wrap_future(enqueue_soon(admitted.task))
        try:
            queued = await landed
        except Exception as exc:
            failure = exc
            return webhook_answer(ingress.acknowledge(admitted, lambda: _raise(failure)))
        return webhook_answer(ingress.acknowledge(admitted, lambda: queued))

    return handle


def _raise(exc: Exception) -> bool:
    raise exc


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
