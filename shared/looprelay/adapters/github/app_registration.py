"""Turning a manifest flow's code into a GitHub App's credentials (docs: "Registering a GitHub
App from a manifest", step 3: ``POST /app-manifests/{code}/conversions``) and keeping them in
the data directory: each secret in a file of its own, mode 0600, and a config fragment that
names them so ``looprelay up`` needs no environment variable."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import requests
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from looprelay.adapters.github.auth import API_HEADERS
from looprelay.config.model import APP_FRAGMENT_FILE
from looprelay.datadir import WEBHOOK_SECRET_FILE, ensure_data_dir
from looprelay.errors import ConfigError
from looprelay.filemodes import write_private_file

PRIVATE_KEY_FILE = "github-app.pem"
CLIENT_SECRET_FILE = "github-app-client-secret"  # noqa: S105 - a file name
APP_FILE = "github-app.json"
"""What identifies the App without being a secret: id, slug, owner, client id, URL."""
TIMEOUT_SECONDS = 30.0


class AppOwner(BaseModel):
    """The account that owns the App."""

    model_config = ConfigDict(extra="ignore")
    login: str


class CreatedApp(BaseModel):
    """The conversion's answer, as GitHub documents it (201)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    id: int
    slug: str
    node_id: str
    owner: AppOwner
    name: str
    client_id: str
    client_secret: str
    webhook_secret: str
    pem: str
    html_url: str

    @property
    def install_url(self) -> str:
        """Where the owner installs the App on repositories."""
        return f"{self.html_url.rstrip('/')}/installations/new"


def convert_code(api_url: str, code: str, *, session: requests.Session | None = None) -> CreatedApp:
    """Exchange the manifest flow's ``code`` (valid one hour, once) for the App's credentials.

    Raises ``ConfigError`` with GitHub's status and message on a refusal, a network error or
    an answer that is not the documented one; never with a secret in it.
    """
    url = f"{api_url.rstrip('/')}/app-manifests/{quote(code, safe='')}/conversions"
    http = session or requests.Session()
    try:
        response = http.post(url, headers=API_HEADERS, timeout=TIMEOUT_SECONDS)
    except requests.RequestException as exc:
        raise ConfigError(f"POST {url}: {type(exc).__name__}; is {api_url} reachable?") from exc
    if response.status_code != 201:
        raise ConfigError(
            f"GitHub refused the App's code (HTTP {response.status_code}); a code is valid "
            "for one hour and once: start `looprelay app create` again"
        )
    try:
        return CreatedApp.model_validate_json(response.content)
    except ValidationError as exc:
        fields = ", ".join(str(error["loc"][0]) for error in exc.errors() if error["loc"])
        raise ConfigError(f"GitHub's answer to the App's code lacks {fields}") from exc


def save_app(data_dir: Path, app: CreatedApp, *, api_url: str) -> list[Path]:
    """Write ``app``'s credentials into ``data_dir`` (made 0700) and return the files written.

    The webhook secret becomes the data directory's ``webhook-secret``, which ``looprelay up``
    verifies deliveries with; the fragment ``github-app.yaml`` names the App and its key file.
    """
    ensure_data_dir(data_dir)
    identity = {
        "id": app.id,
        "slug": app.slug,
        "node_id": app.node_id,
        "owner": app.owner.login,
        "name": app.name,
        "client_id": app.client_id,
        "html_url": app.html_url,
    }
    fragment = {"github": {"appId": app.id, "apiUrl": api_url, "privateKeyFile": PRIVATE_KEY_FILE}}
    files = {
        PRIVATE_KEY_FILE: app.pem if app.pem.endswith("\n") else app.pem + "\n",
        WEBHOOK_SECRET_FILE: app.webhook_secret + "\n",
        CLIENT_SECRET_FILE: app.client_secret + "\n",
        APP_FILE: json.dumps(identity, indent=2) + "\n",
        APP_FRAGMENT_FILE: f"# written by `looprelay app create` for the App {app.slug}\n"
        + yaml.safe_dump(fragment, sort_keys=False),
    }
    for name, text in files.items():
        write_private_file(data_dir / name, text)
    return [data_dir / name for name in files]
