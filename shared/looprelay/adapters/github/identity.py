"""Who the configured GitHub credentials are, asked once at start (docs: "Get the
authenticated app", ``GET /app`` with the App's JWT; "Get the authenticated user", ``GET
/user`` with a token), so a wrong credential stops ``looprelay up`` with one line instead of
showing up later as failed comments. No message carries a secret."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import quote

import requests

from looprelay.adapters.github.auth import API_HEADERS, AppAuth, auth_from_config
from looprelay.config.model import GitHubConfig
from looprelay.errors import ConfigError, Permanent, Transient

log = logging.getLogger("looprelay.github")

TIMEOUT_SECONDS = 10.0
MAX_REPOSITORIES = 100
"""Most repositories whose label is looked for at start (one page of each listing)."""


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


def missing_label_commands(
    cfg: GitHubConfig,
    environ: Mapping[str, str],
    label: str,
    *,
    session: requests.Session | None = None,
) -> list[tuple[str, str]]:
    """Return, once per served repository that lacks ``label``, the repository and the
    command that creates the label there. Served: the repositories the App is installed on
    (App auth), else those ``github.poll.repositories`` names (a token's other repositories
    are not looked at). Empty without credentials or when GitHub cannot be asked (logged).
    Never raises for GitHub's answers."""
    if cfg.app_id is None and cfg.token_env is None:
        return []
    auth = auth_from_config(cfg, environ)
    http = session or requests.Session()
    api = cfg.api_url.rstrip("/")
    commands = []
    try:
        served = (
            _installed_repositories(auth, http, api)
            if isinstance(auth, AppAuth)
            else (_Installed(name, auth.headers(None)) for name in cfg.poll.repositories)
        )
        for repository in served:
            url = f"{api}/repos/{repository.full}/labels/{quote(label, safe='')}"
            answer = http.get(
                url, headers=API_HEADERS | repository.headers, timeout=TIMEOUT_SECONDS
            )
            if answer.status_code == 404:
                commands.append(
                    (
                        repository.full,
                        f"gh label create {shlex.quote(label)} --repo {repository.full} "
                        "--color 0E8A16 --description 'looprelay: arms an issue or pull request'",
                    )
                )
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        log.warning("cannot look for the label %r: %s", label, type(exc).__name__)
    except (Permanent, Transient) as exc:  # the installation token exchange
        log.warning("cannot look for the label %r: %s", label, exc)
    return commands


@dataclass(frozen=True)
class _Installed:
    full: str
    headers: dict[str, str]


def _installed_repositories(
    auth: AppAuth, http: requests.Session, api: str
) -> Iterator[_Installed]:
    """The repositories of the App's installations (docs: "List installations for the
    authenticated app", "List repositories accessible to the app installation"), at most
    ``MAX_REPOSITORIES``."""
    jwt_headers = API_HEADERS | {"Authorization": f"Bearer {auth.app_jwt()}"}
    listed = http.get(
        f"{api}/app/installations?per_page=100", headers=jwt_headers, timeout=TIMEOUT_SECONDS
    )
    listed.raise_for_status()
    count = 0
    for installation in listed.json():
        headers = auth.headers(int(installation["id"]))
        repos = http.get(
            f"{api}/installation/repositories?per_page=100",
            headers=API_HEADERS | headers,
            timeout=TIMEOUT_SECONDS,
        )
        repos.raise_for_status()
        for repository in repos.json()["repositories"]:
            if count >= MAX_REPOSITORIES:
                return
            count += 1
            yield _Installed(str(repository["full_name"]), headers)
