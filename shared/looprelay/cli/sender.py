"""Sign and post a payload the way GitHub does; used by ``looprelay send`` and tests."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

import requests

from looprelay.core.signature import sign_body

SEND_TIMEOUT_SECONDS = 10.0
"""GitHub itself gives a receiver 10 s."""


def post_delivery(
    *, url: str, event: str, body: bytes, secret: bytes, delivery_id: str, form: bool = False
) -> tuple[int, str]:
    """POST ``body`` signed with ``secret``; return the status and the response text.

    With ``form`` the JSON travels as ``payload=`` in a form body, as GitHub can send it.
    Raises ``requests.RequestException`` when the server cannot be reached.
    """
    content_type = "application/json"
    if form:
        body = urlencode({"payload": body.decode("utf-8")}).encode()
        content_type = "application/x-www-form-urlencoded"
    headers = {
        "Content-Type": content_type,
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery_id,
        "X-Hub-Signature-256": sign_body(body, secret),
        "User-Agent": "looprelay-send",
    }
    response = requests.post(url, data=body, headers=headers, timeout=SEND_TIMEOUT_SECONDS)
    return response.status_code, response.text


def comment_payload(
    *,
    repository: str,
    issue: int,
    body: str,
    login: str,
    user_id: int | None = None,
    labels: Sequence[str] = (),
    title: str = "",
) -> dict[str, Any]:
    """An ``issue_comment.created`` payload with what looprelay reads of one, for trying it
    without a fixture: ``login`` comments ``body`` on issue ``issue`` of ``repository``.

    Without ``user_id`` the login gets a stable made-up id (the same login, the same id), so
    a login pinned on first sight stays pinned across tries.
    """
    user = {"login": login, "id": user_id or _made_up_id(login), "type": "User"}
    return {
        "action": "created",
        "issue": {
            "number": issue,
            "title": title or f"Issue {issue}",
            "state": "open",
            "user": user,
            "labels": [{"name": name} for name in labels],
        },
        "comment": {"id": _made_up_id(f"{repository}#{issue}:{body}"), "body": body, "user": user},
        "repository": {"full_name": repository, "private": False},
        "sender": user,
    }


def _made_up_id(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") + 1
