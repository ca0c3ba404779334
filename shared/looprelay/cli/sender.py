"""Sign and post a payload the way GitHub does; used by ``looprelay send`` and tests."""

from __future__ import annotations

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
