"""Registering this machine as a runner: a registration token in, credentials out."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

import requests

from looprelay.agent.credentials import Credentials
from looprelay.errors import ConfigError, Transient, Unauthorized

REGISTER_TIMEOUT_SECONDS = 15.0
_REGISTER_PATH = "/runner/v1/register"


def register(
    *, server: str, token: str, name: str, labels: Mapping[str, str], version: str, capacity: int
) -> Credentials:
    """Exchange ``token`` for this runner's id and secret at ``server``.

    One attempt, ``REGISTER_TIMEOUT_SECONDS``: a token is single use, so retrying blindly could
    burn it. Raises ``Unauthorized`` for a bad token, ``ConfigError`` for a refused request
    (bad name or label) and ``Transient`` when the server cannot be reached or fails.
    """
    check_server_url(server)
    url = server.rstrip("/") + _REGISTER_PATH
    body = {
        "token": token,
        "name": name,
        "labels": dict(labels),
        "version": version,
        "capacity": capacity,
    }
    try:
        response = requests.post(url, json=body, timeout=REGISTER_TIMEOUT_SECONDS)
    except requests.ConnectionError as exc:
        # requests' own text is a paragraph of urllib3 internals; the operator needs the fix.
        raise Transient(
            f"nothing answers at {server.rstrip('/')}: is looprelay running there "
            "(`looprelay up`), and is --server its address?"
        ) from exc
    except requests.Timeout as exc:
        raise Transient(
            f"{server.rstrip('/')} did not answer within {REGISTER_TIMEOUT_SECONDS:g} s; "
            "try again when it is up"
        ) from exc
    except requests.RequestException as exc:
        raise Transient(f"cannot reach {url}: {type(exc).__name__}") from exc
    message = _error_text(response)
    if response.status_code == 401:
        raise Unauthorized(message)
    if 400 <= response.status_code < 500:
        reason = message or f"HTTP {response.status_code} with no reason given"
        raise ConfigError(
            f"{url} refused the registration ({reason}); check --server names looprelay and "
            "the name and labels are plain words"
        )
    if response.status_code != 201:
        raise Transient(f"{url} answered {response.status_code}: {message}")
    answer = response.json()
    return Credentials(
        server=server.rstrip("/"),
        runner_id=answer["runner_id"],
        secret=answer["secret"],
        name=answer["name"],
    )


def check_server_url(server: str) -> None:
    """Refuse a server URL that is not ``http(s)://host[:port]``, in one line saying the fix."""
    parsed = urlsplit(server)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(
            f"--server {server[:200]!r} must be a URL like https://looprelay.example.com "
            "or http://127.0.0.1:8484"
        )


def _error_text(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", ""))[:500]
    except ValueError:
        return response.text[:200]
