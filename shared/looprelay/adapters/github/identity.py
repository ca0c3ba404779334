"""Who the configured GitHub credentials are, asked once at start (docs: "Get the
authenticated app", ``GET /app`` with the App's JWT; "Get the authenticated user", ``GET
/user`` with a token), so a wrong credential stops ``looprelay up`` with one line instead of
showing up later as failed comments. No message carries a secret."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import requests

from looprelay.adapters.github.auth import API_HEADERS, AppAuth, auth_from_config
from looprelay.config.model import GitHubConfig
from looprelay.errors import ConfigError

log = logging.getLogger("looprelay.github")

TIMEOUT_SECONDS = 10.0


def github_identity(
    cfg: GitHubConfig, environ: Mapping[str, str], *, session: requests.Session | None = None
) -> str | None:
    """Return what the credentials act as (``GitHub App looprelay (id 7)`` or ``GitHub user
    octocat``), or None when none are configured or GitHub cannot be reached (logged).

    Raises ``ConfigError``, one line naming the key to fix, when a named variable or file is
    missing or unusable, or GitHub refuses the credential.
    """
    if cfg.app_id is None and cfg.token_env is None:
        return None
    auth = auth_from_config(cfg, environ)
    http = session or requests.Session()
    if isinstance(auth, AppAuth):
        path, key = "/app", "github.appId and its private key"
        headers = {"Authorization": f"Bearer {auth.app_jwt()}"}
    else:
        path, key = "/user", f"github.tokenEnv ({cfg.token_env})"
        headers = auth.headers(None)
    url = cfg.api_url.rstrip("/") + path
    try:
        response = http.get(url, headers=API_HEADERS | headers, timeout=TIMEOUT_SECONDS)
    except requests.RequestException as exc:
        log.warning("cannot check the GitHub credentials at %s: %s", url, type(exc).__name__)
        return None
    status = response.status_code
    if status == 200:
        body = response.json()
        if path == "/app":
            return f"GitHub App {body.get('slug')} (id {body.get('id')})"
        return f"GitHub user {body.get('login')}"
    if path == "/user" and status == 403:
        # An installation or Actions token may not read /user; GitHub took it, though.
        return "a GitHub token that cannot read /user (an installation token?)"
    if status in (401, 403, 404):
        hint = (
            "the key is not this App's, or the id is wrong (the App's settings page shows both)"
            if path == "/app"
            else "it is wrong, expired or revoked; make a new one (for example `gh auth token`)"
        )
        raise ConfigError(f"{key}: GitHub refuses this credential (HTTP {status}); {hint}")
    log.warning("cannot check the GitHub credentials: GET %s answered HTTP %d", path, status)
    return None
