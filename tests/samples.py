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


AUTO_LABEL = "the-loop: auto-execute"
"""The label that arms a work item, as the default routing config names it."""


def labeled(number: int, *, installation: int | None = None) -> dict[str, Any]:
    """An ``issues.labeled`` delivery arming issue ``number``."""
    data = payload("issues.labeled")
    data["issue"]["number"] = number
    data["label"]["name"] = AUTO_LABEL
    return installed(data, installation)


def commented(
    number: int,
    body: str,
    *,
    comment_id: int,
    installation: int | None = None,
    on_pull_request: bool = False,
) -> dict[str, Any]:
    """An ``issue_comment.created`` delivery: Codertocat says ``body`` on issue ``number``, or
    on pull request ``number`` with ``on_pull_request`` (GitHub's mark: ``issue.pull_request``)."""
    data = payload("issue_comment.created")
    data["issue"]["number"] = number
    if on_pull_request:
        url = f"https://api.github.com/repos/Codertocat/Hello-World/pulls/{number}"
        data["issue"]["pull_request"] = {"url": url}
    data["comment"]["id"] = comment_id
    data["comment"]["body"] = body
    return installed(data, installation)


def installed(data: dict[str, Any], installation: int | None) -> dict[str, Any]:
    """``data`` as a GitHub App installation ``installation`` sends it (None: unchanged)."""
    if installation is not None:
        data["installation"] = {"id": installation, "node_id": "MDIzOkludGVncmF0aW9uNzc="}
    return data
