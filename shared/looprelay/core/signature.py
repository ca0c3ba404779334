"""GitHub webhook signatures: HMAC-SHA256 over the raw body.

Rules from GitHub's "Validating webhook deliveries": the header is ``sha256=`` plus 64 hex
digits, computed over the exact bytes received, compared in constant time. The legacy SHA-1
``X-Hub-Signature`` header is never accepted on its own.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

SIGNATURE_PREFIX = "sha256="
_DIGEST_HEX_CHARS = 64


def sign_body(body: bytes, secret: bytes) -> str:
    """Return the ``X-Hub-Signature-256`` value GitHub would send for ``body``."""
    return SIGNATURE_PREFIX + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(body: bytes, header: str | None, secrets: Iterable[bytes]) -> bool:
    """Tell whether ``header`` signs ``body`` under any of ``secrets`` (rotation).

    Expects the raw request bytes and the ``X-Hub-Signature-256`` value. Every secret is tried
    so the time taken does not reveal which one matched. Never raises.
    """
    if not header or not header.startswith(SIGNATURE_PREFIX):
        return False
    digest = header[len(SIGNATURE_PREFIX) :]
    if len(digest) != _DIGEST_HEX_CHARS:
        return False
    try:
        given = bytes.fromhex(digest)
    except ValueError:
        return False
    matched = False
    for secret in secrets:
        # hmac.digest is the one-shot C path: no HMAC object, no hex text per secret.
        matched |= hmac.compare_digest(hmac.digest(secret, body, hashlib.sha256), given)
    return matched
