"""Runner credentials: minting, hashing and checking secrets and registration tokens.

Secrets and tokens are 256 random bits, so a plain SHA-256 is enough to store them: there is
nothing to brute-force. Only hashes reach the store; comparisons are constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

RUNNER_ID_PREFIX = "r-"
TOKEN_PREFIX = "lrreg_"  # noqa: S105 - a prefix, not a secret
SECRET_PREFIX = "lrsec_"  # noqa: S105 - a prefix, not a secret
SESSION_TOKEN_PREFIX = "lrses_"  # noqa: S105 - a prefix, not a secret
_RUNNER_ID = re.compile(r"^r-[0-9a-f]{16}$")
_BEARER = "bearer "


def new_runner_id() -> str:
    """Return a fresh runner id."""
    return RUNNER_ID_PREFIX + secrets.token_hex(8)


def new_registration_token() -> str:
    """Return a fresh registration token (shown to the operator once)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_runner_secret() -> str:
    """Return a fresh runner secret (shown to the runner once)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_session_token() -> str:
    """Return a fresh session token (given to the runner once, for its harness)."""
    return SESSION_TOKEN_PREFIX + secrets.token_urlsafe(32)


def parse_session_bearer(header: str) -> str | None:
    """The session token of ``Bearer lrses_...``; None when the header has another shape."""
    if not header.lower().startswith(_BEARER):
        return None
    token = header[len(_BEARER) :].strip()
    return token if token.startswith(SESSION_TOKEN_PREFIX) else None


def hash_credential(value: str) -> str:
    """Return the hex SHA-256 of a token or secret, the only form the store keeps."""
    return hashlib.sha256(value.encode()).hexdigest()


def credential_matches(value: str, stored_hash: str) -> bool:
    """Compare ``value`` with a stored hash in constant time."""
    return hmac.compare_digest(hash_credential(value), stored_hash)


def parse_runner_bearer(header: str) -> tuple[str, str] | None:
    """Split ``Bearer <runner_id>:<secret>``; None when the header has another shape."""
    if not header.lower().startswith(_BEARER):
        return None
    runner_id, sep, secret = header[len(_BEARER) :].strip().partition(":")
    if not sep or not secret or not _RUNNER_ID.match(runner_id):
        return None
    return runner_id, secret
