"""The ASGI application: paths to async handlers, with the HTTP edge adapted here once.

Handlers stay framework-free (``httpmsg.Request`` in, ``httpmsg.Response`` out). At the edge
each request's body is read while it streams, and reading stops as soon as it passes the
endpoint's cap: the client gets a 413 it can read, and nothing larger is ever held. A path no
endpoint serves is answered 404 without reading its body at all. Handlers that block (the
store, GitHub) run on a bounded pool of threads (:class:`Blocking`); waiting never holds one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response as StarletteResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from looprelay.app.budget import BodyBudget, Loan, OverBudget
from looprelay.app.messages import Request, Response, json_response

log = logging.getLogger("looprelay.server")

Handler = Callable[[Request], Response]
"""A framework-free handler that may block."""
AsyncHandler = Callable[[Request], Awaitable[Response]]
"""A framework-free handler that waits without a thread."""

DRAIN_LIMIT_BYTES = 64 * 1024 * 1024
"""Past its cap, a body declared up to this size is still read (and dropped) after the 413,
so a client that sends all before it reads sees the answer; a larger or undeclared one gets
the 413 with ``Connection: close``."""
BODY_SECONDS = 60.0
"""Longest a request body may take to arrive once its head has (a slow sender gets 408)."""
BUDGET_RETRY_SECONDS = 5
"""The Retry-After of a 503 for a body the budget cannot hold now."""
BLOCKING_THREADS = 32
"""Threads for blocking handlers at once; further calls wait for one without a thread."""
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_T = TypeVar("_T")


Refusal = Callable[[Request, int], Response]
"""The answer to a request whose body passed the cap ``int`` (the request has no body)."""


def too_large(request: Request, cap: int) -> Response:
    """The default :data:`Refusal`: 413 with a JSON error, logged."""
    log.warning("%s refused: body larger than %d bytes", request.path, cap)
    return json_response(413, {"error": f"body larger than {cap} bytes"})


@dataclass(frozen=True)
class Endpoint:
    """One path, or every path under a prefix (``path`` ending in ``/``, other than ``/``
    itself), and its handler.

    ``refuse`` answers a body past ``max_body_bytes`` (with a 413, its body unread).
    """

    path: str
    handle: AsyncHandler
    max_body_bytes: int
    refuse: Refusal = too_large
    body_seconds: float = BODY_SECONDS


class Blocking:
    """Runs blocking handlers on a bounded pool of threads."""

    def __init__(self, threads: int = BLOCKING_THREADS) -> None:
        self._limiter = anyio.CapacityLimiter(threads)

    def __call__(self, handler: Handler) -> AsyncHandler:
        """``handler`` as an async handler; a call waits for a free thread first."""

        async def run(request: Request) -> Response:
            return await anyio.to_thread.run_sync(handler, request, limiter=self._limiter)

        return run

    async def run(self, call: Callable[[], _T]) -> _T:
        """Run ``call()`` on one of the pool's threads and return what it returns."""
        return await anyio.to_thread.run_sync(call, limiter=self._limiter)


class _BodyTooLarge(Exception):
    """The body passed the endpoint's cap while it was read."""


class _Served:
    """The ASGI app of one endpoint: read the capped body, call the handler, answer."""

    def __init__(self, endpoint: Endpoint, budget: BodyBudget) -> None:
        self._endpoint = endpoint
        self._budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loan = self._budget.loan()
        try:
            await self._serve(scope, receive, send, loan)
        finally:
            loan.release()

    async def _serve(self, scope: Scope, receive: Receive, send: Send, loan: Loan) -> None:
        cap = self._endpoint.max_body_bytes
        declared = _declared_length(scope)
        try:
            if declared is not None and declared > cap:
                raise _BodyTooLarge
            async with asyncio.timeout(self._endpoint.body_seconds):
                body = await _read_capped(receive, cap, loan)
        except OverBudget:
            log.warning("%s refused: bodies in flight hold the body budget", scope["path"])
            busy = json_response(503, {"error": "too many request bodies in flight; retry later"})
            retry = {"retry-after": str(BUDGET_RETRY_SECONDS)}
            await _answer(send, replace(busy, headers=retry), close=True)
            return
        except TimeoutError:
            slow = json_response(
                408, {"error": f"body not received within {self._endpoint.body_seconds:g} s"}
            )
            await _answer(send, slow, close=True)
            return
        except ClientDisconnect:
            return  # the client left mid-body: nobody is there to answer
        except _BodyTooLarge:
            drain = declared is not None and declared <= DRAIN_LIMIT_BYTES
            refused = self._endpoint.refuse(to_request(scope, b""), cap)
            await _answer(send, refused, close=not drain)
            return
        request = to_request(scope, body)
        try:
            response = await self._endpoint.handle(request)
        except Exception:
            log.exception("unhandled error serving %s", request.path)
            response = json_response(500, {"error": "internal error"})
        await _answer(send, response)


def build_asgi(
    endpoints: Sequence[Endpoint],
    *,
    start: Sequence[Callable[[], None]] = (),
    budget: BodyBudget | None = None,
) -> Starlette:
    """The application serving ``endpoints``: exact paths, then prefixes; 404 elsewhere.

    Every body read is charged to ``budget`` (one per application, so per process; a
    default one when None): past it a request gets 503 with ``Retry-After``.

    ``start`` is called in the process that serves, once, before its first request (or at
    the ASGI lifespan's startup where the server sends one): what opens threads or gRPC
    streams goes there, never where the application is built. functions-framework builds it
    when it imports the functions, in gunicorn's arbiter, which serves nothing and forks the
    worker that does; and it sends our application no lifespan, since its own routes call it.
    """
    shared = budget or BodyBudget()
    routes = [
        Route(
            endpoint.path + ("{rest:path}" if _is_prefix(endpoint.path) else ""),
            _Served(endpoint, shared),
            methods=_METHODS,
        )
        for endpoint in endpoints
    ]
    middleware = [Middleware(StartInServingProcess, start=tuple(start))] if start else []
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={404: _not_found, 405: _not_found},
    )


class StartInServingProcess:
    """ASGI middleware: calls each of ``start`` once in each process that serves, before
    the first request (or lifespan event) it passes on. A process forked after a start (the
    calls already made in its parent) starts them again, in itself."""

    def __init__(self, app: ASGIApp, *, start: Sequence[Callable[[], None]]) -> None:
        self._app = app
        self._start = start
        self._started_in: int | None = None
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._started_in != os.getpid():
            self._start_here()
        await self._app(scope, receive, send)

    def _start_here(self) -> None:
        # Each call only starts a thread, so the loop is held for microseconds.
        with self._lock:
            if self._started_in == os.getpid():
                return
            for start in self._start:
                start()
            self._started_in = os.getpid()
            log.info("started %d listener(s) in serving process %d", len(self._start), os.getpid())


def _is_prefix(path: str) -> bool:
    return path != "/" and path.endswith("/")


def to_request(scope: Scope, body: bytes) -> Request:
    """The ``httpmsg.Request`` of an ASGI HTTP scope: header names lower case (ASGI's own),
    repeated headers comma-joined as RFC 9110 merges lists."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return Request(
        method=scope["method"],
        path=scope["path"],
        query=scope.get("query_string", b"").decode("latin-1"),
        headers=headers,
        body=body,
        client=(scope.get("client") or ("",))[0] or "",
    )


def to_starlette(response: Response) -> StarletteResponse:
    """The Starlette response for a handler's ``response`` (Starlette's exception handlers
    answer with one; the endpoints send theirs straight to the server: ``_answer``)."""
    return StarletteResponse(
        response.body,
        status_code=response.status,
        headers=dict(response.headers),
        media_type=response.content_type,
    )


async def _read_capped(receive: Receive, cap: int, loan: Loan) -> bytes:
    """The whole body, read as it streams and charged to ``loan``; raises ``_BodyTooLarge``
    the moment it passes ``cap``, ``OverBudget`` when the budget cannot hold it, and
    Starlette's ``ClientDisconnect`` when the client leaves mid-body."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise _BodyTooLarge
        loan.charge(len(chunk))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _declared_length(scope: Scope) -> int | None:
    """The Content-Length the client declared, if any (the server has checked its form)."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and len(value) <= 20:
            return int(value)
    return None


async def _answer(send: Send, response: Response, *, close: bool = False) -> None:
    """Send ``response`` as its two ASGI messages (with ``Connection: close`` if ``close``):
    on the ack's path a Starlette response object cost more than the messages themselves."""
    headers = [
        (b"content-type", response.content_type.encode("latin-1")),
        (b"content-length", b"%d" % len(response.body)),
        *(
            (name.lower().encode("latin-1"), v.encode("latin-1"))
            for name, v in response.headers.items()
        ),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


async def _not_found(request: StarletteRequest, exc: Any) -> StarletteResponse:
    # Matches the handlers' own JSON errors; the body, if any, is never read.
    return to_starlette(json_response(404, {"error": "no such path"}))
