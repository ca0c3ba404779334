"""``looprelay up`` lets webhook acks go before queued work: the in-flight count behind it."""

from __future__ import annotations

import threading
import time

import pytest

from looprelay.embedded import WebhookPressure
from looprelay.httpmsg import Request, Response, json_response

REQUEST = Request(method="POST", path="/webhook", headers={})


def test_idle_returns_at_once_and_a_request_in_flight_holds_the_wait_until_it_ends() -> None:
    pressure = WebhookPressure()
    entered, release = threading.Event(), threading.Event()

    def slow(request: Request) -> Response:
        entered.set()
        release.wait(10)
        return json_response(202, {})

    pressure.wait_until_idle(10)  # nothing in flight: no wait at all

    serving = threading.Thread(target=pressure.tracking(slow), args=(REQUEST,))
    serving.start()
    assert entered.wait(10)
    waiter_done = threading.Event()
    waiter = threading.Thread(target=lambda: (pressure.wait_until_idle(10), waiter_done.set()))
    waiter.start()
    assert not waiter_done.wait(0.2)  # held while the request is served

    release.set()
    assert waiter_done.wait(10)
    serving.join(10)
    waiter.join(10)


def test_the_wait_is_bounded_and_a_failing_handler_still_counts_out() -> None:
    pressure = WebhookPressure()

    def broken(request: Request) -> Response:
        raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError):
        pressure.tracking(broken)(REQUEST)
    # The failed request left nothing in flight: no wait (it would last the whole 30 s).
    started = time.monotonic()
    pressure.wait_until_idle(30)
    assert time.monotonic() - started < 10

    entered, release = threading.Event(), threading.Event()

    def stuck(request: Request) -> Response:
        entered.set()
        release.wait(10)
        return json_response(202, {})

    serving = threading.Thread(target=pressure.tracking(stuck), args=(REQUEST,))
    serving.start()
    assert entered.wait(10)
    started = time.monotonic()
    pressure.wait_until_idle(0.1)  # returns after its bound although still busy
    assert time.monotonic() - started < 5
    release.set()
    serving.join(10)
