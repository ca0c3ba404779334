"""The webhook of ``looprelay up`` as an async handler: acked once its enqueue is durable,
ahead of the queue's own work."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from looprelay.app.asgi import AsyncHandler
from looprelay.app.ingress_http import webhook_answer
from looprelay.app.messages import Request, Response
from looprelay.ports import Task
from looprelay.service.ingress import Ingress, Refusal

log = logging.getLogger("looprelay.up")

IDLE_GRACE_SECONDS = 0.002
"""How long the webhook must have been idle before background work goes ahead. Between two
deliveries of a burst the webhook is idle for a fraction of a millisecond; work started in
that gap holds the interpreter when the next request arrives (a third of the acks per second
at 8 connections in ``bench/ingress.py``). Outside bursts it delays routing by this much."""

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
        self._watching = threading.Lock()
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
        after ``seconds``.

        One caller watches the count at a time; the others wait behind it on a lock, so a
        burst's every idle moment wakes one thread, not every dispatcher (each woken thread
        takes the interpreter from the acks)."""
        deadline = time.monotonic() + seconds
        if not self._watching.acquire(timeout=seconds):
            return
        try:
            self._watch(deadline)
        finally:
            self._watching.release()

    def _watch(self, deadline: float) -> None:
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
