"""Worker authentication for ``looprelay up``: a bearer secret only the embedded queue knows."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from looprelay.errors import Unauthorized

_BEARER = "bearer "


class SharedSecretAuthenticator:
    """Accepts a request whose ``Authorization: Bearer`` equals the local secret."""

    def __init__(self, secret: str) -> None:
        """Raises ``ValueError`` for an empty secret: that would accept anyone."""
        if not secret:
            raise ValueError("the worker's shared secret must not be empty")
        self._secret = secret.encode()

    def authenticate(self, headers: Mapping[str, str]) -> None:
        """Return if the bearer secret matches (constant time); raise ``Unauthorized``."""
        header = headers.get("authorization", "")
        if not header.lower().startswith(_BEARER):
            raise Unauthorized("the worker only accepts its queue's bearer secret")
        given = header[len(_BEARER) :].strip().encode()
        if not hmac.compare_digest(given, self._secret):
            raise Unauthorized("the worker only accepts its queue's bearer secret")
