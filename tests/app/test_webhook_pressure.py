"""``looprelay up`` lets webhook acks go before queued work: the in-flight count behind it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from looprelay.app import webhook
from looprelay.app.messages import Request, Response, json_response
from looprelay.app.webhook import WebhookPressure

REQUEST = Request(method="POST", path="/webhook", headers={})


def _waiter(pressure: WebhookPressure) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()
    thread = threading.Thread(target=lambda: (pressure.wait_until_idle(10), done.set()))
    thread.start()
    return thread, done


def test_a_request_counts_until_it_is_answered() -> None:
    pressure = WebhookPressure()
    pressure.wait_until_idle(10)  # nothing in flight: no wait at all

    async def scenario() -> Response:
        answer: asyncio.Future[Response] = asyncio.get_running_loop().create_future()

        async def held(request: Request) -> Response:
            return await answer  # as the webhook waits for its commit

        serving = asyncio.ensure_future(pressure.tracking(held)(REQUEST))
        await asyncio.sleep(0)
        waiter, done = _waiter(pressure)
        await asyncio.sleep(0.2)
        assert not done.is_set()  # held: the request is not answered yet
        answer.set_result(json_response(202, {}))
        response = await serving
        assert await asyncio.to_thread(done.wait, 10)
        waiter.join(10)
        return response

    assert asyncio.run(scenario()).status == 202


def test_the_wait_is_bounded_and_a_failing_handler_still_counts_out() -> None:
    pressure = WebhookPressure()

    async def broken(request: Request) -> Response:
        raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError):
        asyncio.run(pressure.tracking(broken)(REQUEST))
    # The failed request left nothing in flight: no wait (it would last the whole 30 s).
    started = time.monotonic()
    pressure.wait_until_idle(30)
    assert time.monotonic() - started < 10

    async def never_answered() -> None:
        forever = asyncio.Event()

        async def stuck(request: Request) -> Response:
            await forever.wait()
            raise AssertionError("unreachable")

        serving = asyncio.ensure_future(pressure.tracking(stuck)(REQUEST))
        await asyncio.sleep(0)
        started = time.monotonic()
        pressure.wait_until_idle(0.1)  # returns after its bound although still busy
        assert time.monotonic() - started < 5
        serving.cancel()

    asyncio.run(never_answered())


def test_queued_work_waits_until_the_webhook_has_been_idle_a_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Between two deliveries of a burst the webhook is idle for a moment only: work started
    # then would hold the interpreter when the next one arrives. (0.5 s: long enough to see.)
    monkeypatch.setattr(webhook, "IDLE_GRACE_SECONDS", 0.5)
    pressure = WebhookPressure()

    async def answered(request: Request) -> Response:
        return json_response(202, {})

    asyncio.run(pressure.tracking(answered)(REQUEST))
    after_answer = time.monotonic()
    pressure.wait_until_idle(30)

    assert time.monotonic() - after_answer >= 0.4
