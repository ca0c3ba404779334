"""`looprelay up`'s server exits 0 when told to stop and 1 when it stopped serving by itself,
so a supervisor restarts it (the data directory's lock goes with the process)."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette

from looprelay.app.asgi import Endpoint, build_asgi
from looprelay.app.messages import Request, Response, json_response
from looprelay.app.server import LocalServer

DEADLINE = 20.0


@pytest.fixture(autouse=True)
def _signal_handlers() -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def _app(health_status: int) -> Starlette:
    async def health(request: Request) -> Response:
        return json_response(health_status, {"status": "ok" if health_status < 500 else "bad"})

    return build_asgi([Endpoint("/healthz", health, 1024)])


def _serve_with_timeout(server: LocalServer) -> int:
    # A guard against a hung test: a signal stops the server (with status 0) after the deadline.
    timer = threading.Timer(DEADLINE, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        return server.serve(on_started=lambda: None, on_stopping=lambda: None)
    finally:
        timer.cancel()


def test_a_signal_stops_it_with_status_0_after_the_stopping_work() -> None:
    server = LocalServer(_app(200), host="127.0.0.1", port=0, watchdog_seconds=0.2)
    stopped: list[bool] = []

    def started() -> None:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()

    def serve() -> int:
        return server.serve(on_started=started, on_stopping=lambda: stopped.append(True))

    assert serve() == 0
    assert stopped == [True]


def test_a_server_whose_event_loop_stops_running_stops_with_status_1() -> None:
    # The loop is held (a handler that blocks it) for longer than three checks.
    async def stuck(request: Request) -> Response:
        time.sleep(2.0)
        return json_response(200, {})

    app = build_asgi([Endpoint("/stuck", stuck, 1024)])
    server = LocalServer(app, host="127.0.0.1", port=0, watchdog_seconds=0.2)

    def started() -> None:
        host, port = server.address
        threading.Thread(target=_get, args=(host, port, "/stuck"), daemon=True).start()

    timer = threading.Timer(DEADLINE, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert server.serve(on_started=started, on_stopping=lambda: None) == 1
    finally:
        timer.cancel()


def test_a_server_whose_health_route_fails_is_still_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The check is the event loop, not a request: a full or failing listener is no stop.
    server = LocalServer(_app(500), host="127.0.0.1", port=0, watchdog_seconds=0.1)

    def started() -> None:
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()

    assert server.serve(on_started=started, on_stopping=lambda: None) == 0


def _get(host: str, port: int, path: str) -> None:
    connection = http.client.HTTPConnection(host, port, timeout=DEADLINE)
    with contextlib.suppress(OSError, http.client.HTTPException):
        connection.request("GET", path)
        connection.getresponse().read()
    connection.close()
