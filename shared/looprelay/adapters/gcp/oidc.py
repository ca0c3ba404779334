"""Google OIDC tokens behind the ``TaskAuthenticator`` port: proves a worker call is the queue's.

Cloud Tasks signs each HTTP task with an ID token for the queue's service account
(https://cloud.google.com/tasks/docs/creating-http-target-tasks#token); this adapter checks it.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import cachecontrol
import google.auth.transport.requests
import requests
from google.auth import exceptions as google_exceptions
from google.auth import transport
from google.oauth2 import id_token
from jwt import PyJWTError

from looprelay.errors import Transient, Unauthorized

AUTHORIZATION_HEADER = "authorization"
REMOVED_SIGNATURE = "SIGNATURE_REMOVED_BY_GOOGLE"
GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
GOOGLE_ISSUERS = frozenset({"https://accounts.google.com", "accounts.google.com"})
_BEARER = "bearer"

# The certificate endpoint's fault, not the caller's: the queue should retry. google-auth wraps
# network errors and non-200 answers in TransportError; a raw JSONDecodeError can only come from
# the certificate body (token segments are re-raised as MalformedError).
_CERTS_UNAVAILABLE: tuple[type[Exception], ...] = (
    google_exceptions.TransportError,
    json.JSONDecodeError,
)
# Everything else verify_token raises is the token's fault: malformed, bad signature, unknown
# kid, expired, early or wrong audience. InvalidValue and MalformedError are ValueErrors;
# PyJWTError covers a certs_url in JWK format.
_TOKEN_REJECTED: tuple[type[Exception], ...] = (ValueError, PyJWTError)


class OidcTaskAuthenticator:
    """Accepts a request only with a Google ID token for our audience and service account."""

    def __init__(
        self,
        *,
        audience: str,
        service_account_email: str,
        certs_url: str = GOOGLE_CERTS_URL,
        request: transport.Request | None = None,
        clock_skew_seconds: int = 10,
        platform_verifies_signature: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Configure the expected ``audience`` (the task's ``oidc_token.audience``, by default the
        worker URL) and the queue's ``service_account_email``.

        ``request`` fetches ``certs_url``; the default is a ``requests.Session`` wrapped in
        CacheControl, as google-auth advises (``google.oauth2.id_token``), so the certificates
        are fetched again only once their ``Cache-Control: max-age`` has run out (Google
        serves hours), with google-auth's 120 s timeout. ``clock_skew_seconds`` widens the
        ``iat``/``exp`` window both ways.

        ``platform_verifies_signature``: behind Cloud Run's IAM invoker check, Google verifies
        the token and replaces its signature with ``SIGNATURE_REMOVED_BY_GOOGLE`` before the
        request arrives; only such a token then has its claims checked without a signature.
        Never set it on a worker that is reachable without IAM.
        """
        self._audience = audience
        self._email = service_account_email.casefold()
        self._certs_url = certs_url
        self._request = request or google.auth.transport.requests.Request(
            session=cachecontrol.CacheControl(requests.Session())
        )
        self._clock_skew_seconds = clock_skew_seconds
        self._platform_verified = platform_verifies_signature
        self._clock = clock

    def authenticate(self, headers: Mapping[str, str]) -> None:
        """Return if ``headers`` carry ``Authorization: Bearer <Google ID token>`` for us.

        Expects lower-case header names. Raises ``Unauthorized(status=401)`` for a missing or
        malformed header or a token that fails verification (signature, expiry, audience,
        issuer); ``Unauthorized(status=403)`` for a valid Google token of another identity;
        ``Transient`` when Google's certificates cannot be fetched. The token never appears in
        a message.
        """
        claims = self._verify(_bearer_token(headers))
        issuer = claims.get("iss")
        if issuer not in GOOGLE_ISSUERS:
            raise Unauthorized(
                f"the ID token's issuer {issuer!r} is not Google; only Cloud Tasks may call "
                "the worker",
                status=401,
            )
        email = claims.get("email")
        if not isinstance(email, str) or email.casefold() != self._email:
            raise Unauthorized(
                f"the ID token is for {email!r}, not the queue's service account; set the "
                "task's oidc_token.service_account_email to the configured account",
                status=403,
            )
        # Google sends a JSON boolean; anything but true fails closed.
        if claims.get("email_verified") is not True:
            raise Unauthorized(
                f"the ID token's email {email!r} is not verified; only the queue's service "
                "account may call the worker",
                status=403,
            )

    def _verify(self, token: str) -> Mapping[str, Any]:
        _, _, rest = token.partition(".")
        payload, _, signature = rest.partition(".")
        if self._platform_verified and signature == REMOVED_SIGNATURE:
            return self._platform_claims(payload)
        try:
            claims: Mapping[str, Any] = id_token.verify_token(
                token,
                self._request,
                audience=self._audience,
                certs_url=self._certs_url,
                clock_skew_in_seconds=self._clock_skew_seconds,
            )
        except (*_CERTS_UNAVAILABLE, *_TOKEN_REJECTED) as exc:
            _classify(exc, certs_url=self._certs_url)
        return claims

    def _platform_claims(self, payload: str) -> Mapping[str, Any]:
        """Claims of a token Cloud Run already verified: audience and time are still checked."""
        try:
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (ValueError, TypeError):
            claims = None
        now, skew = self._clock(), self._clock_skew_seconds
        fresh = (
            isinstance(claims, dict)
            and isinstance(claims.get("exp"), int | float)
            and (claims["exp"] + skew > now and claims.get("iat", 0) - skew <= now)
        )
        if not fresh or not isinstance(claims, dict) or claims.get("aud") != self._audience:
            raise Unauthorized(
                "the platform-verified ID token is malformed, expired or for another audience",
                status=401,
            )
        return claims


def _bearer_token(headers: Mapping[str, str]) -> str:
    """Return the token of an ``Authorization: Bearer`` header; ``Unauthorized(401)`` if absent."""
    scheme, _, token = headers.get(AUTHORIZATION_HEADER, "").strip().partition(" ")
    token = token.strip()
    # The auth scheme is case-insensitive (RFC 9110 §11.1).
    if scheme.casefold() != _BEARER or not token:
        raise Unauthorized(
            "the worker needs an 'Authorization: Bearer <ID token>' header; give the Cloud Task "
            "an oidc_token",
            status=401,
        )
    return token


def _classify(exc: Exception, *, certs_url: str) -> NoReturn:
    """Translate a google-auth failure into ``Transient`` (certificates) or ``Unauthorized``."""
    if isinstance(exc, _CERTS_UNAVAILABLE):
        raise Transient(
            f"could not fetch Google's token certificates from {certs_url}; the queue will retry"
        ) from exc
    # google-auth quotes the token in some messages ("Wrong number of segments in token: ..."),
    # so the cause is named by class and the chain is cut to keep the token out of logs.
    raise Unauthorized(
        f"the bearer token failed Google ID-token verification ({type(exc).__name__}: bad "
        "signature, unknown key, expired, not yet valid or wrong audience); check the task's "
        "oidc_token audience",
        status=401,
    ) from None
