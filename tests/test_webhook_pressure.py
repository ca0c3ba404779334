"""``looprelay up`` lets webhook acks go before queued work: the in-flight count behind it."""

from __future__ import annotations

import threading
import time

import pytest

from looprelay.adapters.http_server import Reply
from looprelay.embedded import WebhookPressure
from looprelay.httpmsg import Request, Response, json_response

REQUEST = Request(method="POST", path="/webhook", headers={})


def _waiter(pressure: WebhookPressure) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()
    thread = threading.Thread(target=lambda: (pressure.wait_until_idle(10), done.set()))
    thread.start()
    return thread, done


def test_a_request_counts_until_it_is_answered_even_when_the_answer_comes_later() -> None:
    pressure = WebhookPressure()
    pressure.wait_until_idle(10)  # nothing in flight: no wait at all
    replies: list[Reply] = []
    answers: list[Response] = []

    # The handler returns at once and answers later (as the webhook does after its commit).
    pressure.tracking(lambda request, reply: replies.append(reply))(REQUEST, answers.append)
    waiter, done = _waiter(pressure)
    assert not done.wait(0.2)  # held: the request is not answered yet

    replies[0](json_response(202, {}))
    assert done.wait(10)
    assert [answer.status for answer in answers] == [202]
    waiter.join(10)


def test_a_second_answer_does_not_count_out_another_request() -> None:
    pressure = WebhookPressure()
    replies: list[Reply] = []
    track = pressure.tracking(lambda request, reply: replies.append(reply))
    track(REQUEST, lambda response: None)
    track(REQUEST, lambda response: None)
    replies[0](json_response(202, {}))
    replies[0](json_response(202, {}))  # a buggy double answer
    waiter, done = _waiter(pressure)
    assert not done.wait(0.2)  # the second request is still in flight
    replies[1](json_response(202, {}))
    assert done.wait(10)
    waiter.join(10)


def test_the_wait_is_bounded_and_a_failing_handler_still_counts_out() -> None:
    pressure = WebhookPressure()

    def broken(request: Request, reply: Reply) -> None:
        raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError):
        pressure.tracking(broken)(REQUEST, lambda response: None)
    # The failed request left nothing in flight: no wait (it would last the whole 30 s).
    started = time.monotonic()
    pressure.wait_until_idle(30)
    assert time.monotonic() - started < 10

    pressure.tracking(lambda request, reply: None)(REQUEST, lambda response: None)  # never answers
    started = time.monotonic()
    pressure.wait_until_idle(0.1)  # returns after its bound although still busy
    assert time.monotonic() - started < 5
