"""How ``GitHubRest`` proves who it is: a token, or a GitHub App's installation tokens (docs:
"Generating a JSON Web Token (JWT) for a GitHub App", "... an installation access token ...").
Tokens, JWTs and keys never appear in a message or a log line."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Protocol

import jwt
import requests
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from looprelay.config.model import GitHubConfig
from looprelay.datadir import read_private
from looprelay.errors import ConfigError, Permanent, Transient

API_HEADERS = {  # docs "Getting started with the REST API": media type and version
    "Accept": "application/vnd.github+json",
    "X-GitHub-Api-Version": "2022-11-28",
    "User-Agent": "looprelay",
}

JWT_BACKDATE_SECONDS = 60  # docs: set iat 60 s in the past against clock drift
JWT_LIFETIME_SECONDS = 540  # exp at most 10 min ahead; 9 min from now leaves margin
JWT_REUSE_SECONDS = 60  # a JWT stays good for 8 more minutes when it is last reused
TOKEN_REFRESH_MARGIN_SECONDS = 60  # installation tokens live 1 h; renew a minute early
SECONDARY_LIMIT_WAIT_SECONDS = 60.0


class GitHubAuth(Protocol):
    """Gives the ``Authorization`` header for a call on behalf of an installation."""

    def headers(self, installation_id: int | None) -> dict[str, str]:
        """Return the auth headers; raises ``Permanent`` or ``Transient`` when it cannot."""
        ...


class TokenAuth:
    """One fixed token (a personal access token or similar, for local use)."""

    def __init__(self, token: str) -> None:
        """Keep ``token``; raises ``ValueError`` for an empty one."""
        if not token.strip():
            raise ValueError("the GitHub token is empty")
        self._token = token.strip()

    def headers(self, installation_id: int | None) -> dict[str, str]:
        """Return ``Authorization: Bearer <token>``; ``installation_id`` is ignored."""
        return {"Authorization": f"Bearer {self._token}"}


class AppAuth:
    """A GitHub App: an RS256 JWT exchanged for per-installation tokens, cached until near expiry.
    Thread-safe: the cache's lock is held through an exchange, so racing callers mint one token."""

    def __init__(
        self,
        *,
        app_id: int,
        private_key_pem: str,
        api_url: str,
        session: requests.Session,
        clock: Callable[[], float] = time.time,
        timeout_seconds: float = 10.0,
    ) -> None:
        """Configure the App (``clock``, epoch seconds, is a test switch); raises ``ValueError``
        when ``private_key_pem`` is not a PEM RSA private key."""
        self._app_id = app_id
        self._key = _load_rsa_key(private_key_pem)
        self._api_url = api_url.rstrip("/")
        self._session = session
        self._clock = clock
        self._timeout = timeout_seconds
        self._tokens: dict[int, tuple[str, float]] = {}  # installation -> (token, renew at)
        self._jwt: tuple[int, str] = (0, "")  # (issued at, JWT)
        self._lock = threading.Lock()

    def headers(self, installation_id: int | None) -> dict[str, str]:
        """Return ``Authorization: Bearer <installation token>``, exchanging a JWT if needed.

        One exchange attempt (10 s timeout by default); the caller owns retries. Raises
        ``Permanent`` when ``installation_id`` is None or GitHub refuses the JWT (401/403/404),
        ``Transient`` on network errors, 5xx and rate limits.
        """
        if installation_id is None:
            raise Permanent(
                f"GitHub App {self._app_id} auth needs an installation id and this call has "
                "none; the event did not come through the App (or set github.tokenEnv instead)"
            )
        with self._lock:
            token, renew_at = self._tokens.get(installation_id, ("", 0.0))
            if self._clock() >= renew_at:
                token, renew_at = self._exchange(installation_id)
                self._tokens[installation_id] = (token, renew_at)
        return {"Authorization": f"Bearer {token}"}

    def app_jwt(self) -> str:
        """Return a JWT for the App: ``iat`` now-60 s, ``exp`` now+540 s, ``iss`` the id.

        One signed within the last ``JWT_REUSE_SECONDS`` is reused: a sweep makes thousands of
        App calls, and an RSA signature each would cost more than the call's own work.
        """
        now = int(self._clock())
        issued, token = self._jwt
        if token and 0 <= now - issued < JWT_REUSE_SECONDS:
            return token
        claims = {
            "iat": now - JWT_BACKDATE_SECONDS,
            "exp": now + JWT_LIFETIME_SECONDS,
            "iss": str(self._app_id),
        }
        token = jwt.encode(claims, self._key, algorithm="RS256")
        self._jwt = (now, token)
        return token

    def _exchange(self, installation_id: int) -> tuple[str, float]:
        what = f"GitHub App {self._app_id}: token for installation {installation_id}"
        url = f"{self._api_url}/app/installations/{installation_id}/access_tokens"
        headers = API_HEADERS | {"Authorization": f"Bearer {self.app_jwt()}"}
        try:
            response = self._session.post(url, headers=headers, timeout=self._timeout)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise Transient(f"{what}: {type(exc).__name__} reaching {self._api_url}") from exc
        status = response.status_code
        limited = status == 403 and rate_limit_wait(response, self._clock()) is not None
        if status >= 500 or status == 429 or limited:
            raise Transient(f"{what}: HTTP {status}, try again later")
        if status != 201:
            raise Permanent(
                f"{what}: HTTP {status}; check github.appId, the private key and that the App "
                "is still installed on the repository"
            )
        try:
            body = response.json()
            token = str(body["token"])
            expires_at = datetime.fromisoformat(str(body["expires_at"])).timestamp()
        except (ValueError, KeyError, TypeError) as exc:
            raise Transient(f"{what}: the answer is not an installation token") from exc
        return token, expires_at - TOKEN_REFRESH_MARGIN_SECONDS


def rate_limit_wait(response: requests.Response, now: float) -> float | None:
    """Return the seconds a rate-limited answer asks to wait, or None when it is not one (docs
    "Rate limits for the REST API": ``retry-after`` seconds; else, with ``x-ratelimit-remaining``
    0, until ``x-ratelimit-reset``; else a secondary-limit message means "at least one minute")."""
    headers = response.headers
    retry_after = _number(headers.get("retry-after"))
    if retry_after is not None:
        return max(retry_after, 0.0)
    reset = _number(headers.get("x-ratelimit-reset"))
    if headers.get("x-ratelimit-remaining") == "0" and reset is not None:
        return max(reset - now, 0.0)
    return SECONDARY_LIMIT_WAIT_SECONDS if "secondary rate limit" in response.text.lower() else None


def quota_spent_until(response: requests.Response) -> float | None:
    """Return ``x-ratelimit-reset`` (epoch seconds) when the answer says the quota is spent
    (``x-ratelimit-remaining: 0``), else None: the next call would be refused until then."""
    if response.headers.get("x-ratelimit-remaining") != "0":
        return None
    return _number(response.headers.get("x-ratelimit-reset"))


def auth_from_config(cfg: GitHubConfig, environ: Mapping[str, str]) -> GitHubAuth:
    """Choose the auth: App (``appId`` + ``privateKeyEnv``, preferred) or token (``tokenEnv``).

    Raises ``ConfigError`` naming the keys to set when neither is configured, and naming the
    variable when a named environment variable is unset, empty or not a usable key.
    """
    if cfg.app_id is not None and (cfg.private_key_env or cfg.private_key_file):
        pem, where = app_private_key(cfg, environ)
        try:
            return AppAuth(
                app_id=cfg.app_id,
                private_key_pem=pem,
                api_url=cfg.api_url,
                session=requests.Session(),
            )
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    if cfg.token_env:
        return TokenAuth(_secret(environ, cfg.token_env))
    raise ConfigError(
        "github: no credentials; set github.appId and github.privateKeyEnv (App auth) or "
        "github.tokenEnv (token auth) to the name of an environment variable holding the secret"
    )


def app_private_key(cfg: GitHubConfig, environ: Mapping[str, str]) -> tuple[str, str]:
    """Return the App's PEM (from ``privateKeyEnv``, else ``privateKeyFile``) and where it came
    from, for messages; raises ``ConfigError`` naming the variable or file when it is missing,
    empty or readable by others."""
    if cfg.private_key_env:
        # Keys pasted into one-line env files often carry their newlines as "\\n".
        pem = _secret(environ, cfg.private_key_env).replace("\\n", "\n")
        return pem, f"environment variable {cfg.private_key_env}"
    path = Path(cfg.private_key_file or "")
    if not path.is_file():
        raise ConfigError(
            f"github.privateKeyFile {path} does not exist; run `looprelay app create` again"
        )
    return read_private(path), f"file {path}"


def _secret(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise ConfigError(f"environment variable {name} (github config) is unset or empty")
    return value


def _number(value: str | None) -> float | None:
    try:
        number = float(value or "nan")
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _load_rsa_key(pem: str) -> RSAPrivateKey:
    try:
        key = load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError("not a PEM private key without a passphrase") from exc
    if not isinstance(key, RSAPrivateKey):
        raise ValueError("not an RSA private key; GitHub Apps sign with RS256")
    return key
