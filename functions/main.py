"""Cloud Functions entry points: each serves looprelay's ASGI application for its function
through functions-framework's ASGI mode (``functions_framework.aio``, Starlette on uvicorn)."""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import functions_framework.aio
from starlette.responses import Response

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.types import Receive, Scope, Send


@contextmanager
def _no_collections_while_loading() -> Iterator[None]:
    """Loading the application allocates tens of thousands of objects that live as long as
    the instance (pydantic's validators, the config): the collector would walk them several
    times during a cold start for nothing. Pause it, then freeze what loaded so later
    collections skip it too."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


@functools.cache
def _app(function: str) -> Starlette:
    with _no_collections_while_loading():
        # Imported here, inside the pause: looprelay's modules are most of what loads.
        from looprelay.app.cloud import cloud_config
        from looprelay.app.compose import build_app
        from looprelay.logs import configure_logging

        configure_logging()
        return build_app(cloud_config(os.environ), os.environ, function=function)


class _Served(Response):
    """Hands the request, unread, to looprelay's application, which sends the answer."""

    def __init__(self, function: str) -> None:
        self._function = function

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _app(self._function)(scope, receive, send)


# Build the deployed target's application at import, so a misconfigured deployment fails to
# start (and the rollout stops) instead of answering 500 to every delivery. Building opens no
# connection and starts no thread: this runs in gunicorn's arbiter, before it forks the worker
# that serves, and the runner API's listeners start in that worker on its first request
# (looprelay.app.asgi.StartInServingProcess). What loaded is frozen before the fork, so the
# worker shares those pages instead of copying them as the collector would touch them.
if os.environ.get("FUNCTION_TARGET") in (
    "webhook",
    "worker",
    "runners",
    "sweeper",
    "poller",
    "status",
):
    _app(os.environ["FUNCTION_TARGET"])


@functions_framework.aio.http
async def webhook(request: Request) -> Response:
    """GitHub's deliveries: verify, enqueue, 202."""
    return _Served("webhook")


@functions_framework.aio.http
async def worker(request: Request) -> Response:
    """Cloud Tasks' target: settle the delivery in the ledger."""
    return _Served("worker")


@functions_framework.aio.http
async def runners(request: Request) -> Response:
    """Runner agents: register, heartbeat, rotate, poll, results (``/runner/v1/...``)."""
    return _Served("runners")


@functions_framework.aio.http
async def sweeper(request: Request) -> Response:
    """Cloud Scheduler's target: redeliver failed GitHub deliveries the ledger lacks."""
    return _Served("sweeper")


@functions_framework.aio.http
async def poller(request: Request) -> Response:
    """Cloud Scheduler's target: poll github.poll.repositories once, queueing what is new."""
    return _Served("poller")


@functions_framework.aio.http
async def status(request: Request) -> Response:
    """Operators, through IAM: the status page and its JSON (``GET /status``)."""
    return _Served("status")
