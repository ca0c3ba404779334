"""``GET /status``: the operator's status page (HTML) and its JSON, and who may read it.

Under ``looprelay up`` only a caller on this machine may, unless an operator token is
configured: then a caller presenting it (``Authorization: Bearer TOKEN``) may too. "On this
machine" means a loopback peer that also names a loopback host and came through no proxy: a
tunnel (which connects from loopback) forwards a public ``Host`` or adds a forwarding header,
and a DNS-rebinding page names its own host, so neither passes. In the cloud the function
serving it sits behind IAM, which has checked the caller before this code runs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
from typing import Protocol
from urllib.parse import parse_qs, unquote

from looprelay.app.asgi import AsyncHandler, Blocking
from looprelay.app.messages import Request, Response, json_response
from looprelay.core.deliveries import DeliveryPage
from looprelay.core.status import StatusView
from looprelay.service.status import (
    COPY_SCRIPT,
    MAX_RECENT_DELIVERIES,
    RECENT_DELIVERIES,
    render_delivery_html,
    render_html,
)

STATUS_PATH = "/status"
DELIVERY_PATH = "/status/deliveries/"
"""``/status/deliveries/ID``: one delivery and its events (a prefix endpoint)."""
JSON_TYPE = "application/json"
_FORWARDING_HEADERS = (
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-real-ip",
    # Cloudflare's tunnel names the caller in CF-Connecting-IP (and, on Enterprise plans,
    # True-Client-IP), often without X-Forwarded-For.
    "cf-connecting-ip",
    "true-client-ip",
)
_LOCAL_NAMES = frozenset({"localhost", "localhost."})
_PAGE_HEADERS = {
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    # Inline CSS and our one copy script (by its hash): no frame, no form, nothing fetched.
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "script-src 'sha256-"
    + base64.b64encode(hashlib.sha256(COPY_SCRIPT.encode()).digest()).decode()
    + "'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
}


class StatusPages(Protocol):
    """What the status endpoints read (``service.status.StatusReader``)."""

    def read(self, deliveries: int = RECENT_DELIVERIES) -> StatusView:
        """The whole view, as of now, with the last ``deliveries`` deliveries."""
        ...

    def delivery(self, delivery_id: str) -> DeliveryPage | None:
        """One delivery's page; None when there is no such delivery."""
        ...


def is_local(request: Request) -> bool:
    """Whether ``request`` came from this machine and no proxy: a loopback peer, a loopback
    ``Host``, no forwarding header."""
    if any(name in request.headers for name in _FORWARDING_HEADERS):
        return False
    return _is_loopback(request.client) and _is_loopback_host(request.headers.get("host", ""))


def has_token(request: Request, token: bytes) -> bool:
    """Whether ``request`` carries ``Authorization: Bearer <token>`` (compared in constant
    time)."""
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token)


def status_handler(
    pages: StatusPages,
    blocking: Blocking,
    *,
    local_only: bool,
    token: bytes | None = None,
) -> AsyncHandler:
    """The async handler of ``/status`` and ``/status/deliveries/ID``: ``pages`` read
    (blocking, on ``blocking``'s threads) and rendered as HTML, or JSON for ``Accept:
    application/json``; an unknown delivery is a 404.

    ``local_only`` (``up``): refuse callers off this machine unless they present ``token``.
    Without it (a cloud function) the platform's IAM has authenticated the caller.
    """

    async def handle(request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return json_response(405, {"error": "only GET is accepted here"})
        refusal = _refusal(request, token) if local_only else None
        if refusal is not None:
            return refusal
        if request.path.startswith(DELIVERY_PATH):
            delivery_id = unquote(request.path.removeprefix(DELIVERY_PATH))
            page = await blocking.run(lambda: pages.delivery(delivery_id))
            if page is None:
                return json_response(404, {"error": f"no delivery {delivery_id[:100]!r}"})
            return _render_page(page, request)
        count = _deliveries(request.query)
        if count is None:
            return json_response(
                400, {"error": f"deliveries must be a whole number 1-{MAX_RECENT_DELIVERIES}"}
            )
        view = await blocking.run(lambda: pages.read(count))
        return _render(view, request)

    return handle


async def to_status(request: Request) -> Response:
    """``GET /``: a pointer to the status page, not a bare 404."""
    return Response(
        307,
        b'{"see": "/status"}',
        headers={"location": STATUS_PATH, "cache-control": "no-store"},
    )


def _refusal(request: Request, token: bytes | None) -> Response | None:
    if token is not None and has_token(request, token):
        return None
    if is_local(request):
        return None
    if token is None:
        return json_response(
            403,
            {
                "error": "/status answers only callers on this machine; set "
                "server.operatorTokenEnv to let others in with a Bearer token"
            },
        )
    answer = json_response(401, {"error": "send Authorization: Bearer <operator token>"})
    return Response(
        answer.status, answer.body, headers={"www-authenticate": 'Bearer realm="looprelay"'}
    )


def _render(view: StatusView, request: Request) -> Response:
    if _wants_json(request.headers.get("accept", "")):
        body = view.model_dump_json().encode()
        return Response(200, body, headers={"cache-control": "no-store"})
    html = render_html(view).encode()
    return Response(200, html, content_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)


def _deliveries(query: str) -> int | None:
    """How many deliveries ``?deliveries=N`` asks for (the default without it); None when N is
    no whole number in range."""
    asked = parse_qs(query).get("deliveries")
    if not asked:
        return RECENT_DELIVERIES
    text = asked[-1]
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_RECENT_DELIVERIES:
        return None
    return int(text)


def _render_page(page: DeliveryPage, request: Request) -> Response:
    if _wants_json(request.headers.get("accept", "")):
        return Response(200, page.model_dump_json().encode(), headers={"cache-control": "no-store"})
    html = render_delivery_html(page).encode()
    return Response(200, html, content_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)


def _wants_json(accept: str) -> bool:
    """JSON when the client asks for it and not for HTML (a browser asks for HTML)."""
    types = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return JSON_TYPE in types and "text/html" not in types


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_loopback_host(host: str) -> bool:
    """Whether a ``Host`` header (``name``, ``name:port``, ``[v6]:port``) names this machine."""
    name = host[1:].partition("]")[0] if host.startswith("[") else host.partition(":")[0]
    return name.lower() in _LOCAL_NAMES or _is_loopback(name)
