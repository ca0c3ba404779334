"""Real GitHub payloads from ``tests/fixtures/github`` (see its NOTICE.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "github"


def payload(name: str) -> dict[str, Any]:
    """Load the fixture ``<name>.json`` as a dict (a fresh copy each call)."""
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return loaded


def payload_bytes(name: str) -> bytes:
    """The fixture's exact bytes, as GitHub would sign them."""
    return (FIXTURES / f"{name}.json").read_bytes()
