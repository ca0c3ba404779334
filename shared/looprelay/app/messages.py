"""Framework-free HTTP messages: what every handler takes and returns.

The ASGI application converts at its edge (``app.asgi``), lower-casing header names, so
handlers never see a web framework.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Request:
    """One HTTP request; ``headers`` keys are lower case."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes = b""
    query: str = ""
    client: str = ""
    """The peer's address as the server saw it (empty when unknown)."""


@dataclass(frozen=True)
class Response:
    """One HTTP response, always small JSON unless said otherwise."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)


def json_response(status: int, payload: Mapping[str, Any]) -> Response:
    """Build a JSON response; ``json.dumps`` escapes anything that came from a request."""
    return Response(status=status, body=json.dumps(payload, ensure_ascii=True).encode())


def lower_headers(items: Any) -> dict[str, str]:
    """Return a dict of ``items`` (pairs or a mapping) with lower-cased names."""
    pairs = items.items() if isinstance(items, Mapping) else items
    return {str(name).lower(): str(value) for name, value in pairs}
