"""The one-page setup of ``looprelay app create``, served on loopback: a button that posts the
App manifest to GitHub, and the callback GitHub redirects to with the code (docs: "Registering
a GitHub App from a manifest")."""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote

import anyio.to_thread

from looprelay.adapters.github.app_registration import CreatedApp
from looprelay.app.asgi import Endpoint, build_asgi
from looprelay.app.messages import Request, Response
from looprelay.errors import ConfigError

CALLBACK_PATH = "/callback"
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>looprelay: {title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:40em;margin:3em auto;line-height:1.5}}
code{{background:#eee;padding:0 .2em}}</style></head>
<body><h1>{title}</h1>{body}</body></html>
"""


def new_apps_url(github_url: str, org: str | None) -> str:
    """Where the manifest is posted: the user's or the organization ``org``'s new-App page."""
    base = github_url.rstrip("/")
    if org:
        return f"{base}/organizations/{quote(org, safe='')}/settings/apps/new"
    return f"{base}/settings/apps/new"


@dataclass
class Outcome:
    """What the callback ended with: the App, or why there is none."""

    app: CreatedApp | None = None
    error: str | None = None


class AppSetup:
    """The setup page's state: the manifest, the ``state`` it was sent with, the outcome."""

    def __init__(
        self,
        *,
        manifest: dict[str, Any],
        post_to: str,
        convert: Callable[[str], CreatedApp],
        save: Callable[[CreatedApp], object],
    ) -> None:
        """Serve ``manifest`` for posting to ``post_to``; the callback's code goes to
        ``convert`` and the App it returns to ``save`` (both may block; they run on a thread)."""
        self.state = secrets.token_urlsafe(32)
        self._manifest = manifest
        self._post_to = post_to
        self._convert = convert
        self._save = save
        self.outcome = Outcome()
        self.done = threading.Event()
        self._lock = asyncio.Lock()
        self.app = build_asgi(
            [
                Endpoint("/", self._page, max_body_bytes=0),
                Endpoint(CALLBACK_PATH, self._callback, max_body_bytes=0),
            ]
        )

    async def _page(self, request: Request) -> Response:
        if request.method != "GET":
            return _html(405, "Not allowed", "<p>Open this page with GET.</p>")
        action = f"{self._post_to}?state={quote(self.state, safe='')}"
        body = (
            "<p>Registers a private GitHub App for looprelay: its webhook "
            f"<code>{html.escape(self._manifest['hook_attributes']['url'])}</code>, the events "
            f"{html.escape(', '.join(self._manifest['default_events']))} and the permissions "
            + html.escape(
                ", ".join(f"{k}: {v}" for k, v in self._manifest["default_permissions"].items())
            )
            + ".</p>"
            f'<form action="{html.escape(action)}" method="post">'
            '<input type="hidden" name="manifest" '
            f'value="{html.escape(json.dumps(self._manifest))}">'
            '<button type="submit" id="register">Register a GitHub App</button></form>'
        )
        return _html(200, "Create the GitHub App", body)

    async def _callback(self, request: Request) -> Response:
        query = parse_qs(request.query)
        state = (query.get("state") or [""])[0]
        code = (query.get("code") or [""])[0]
        if not hmac.compare_digest(state.encode(), self.state.encode()):
            return _html(
                400,
                "Refused",
                "<p>This callback's <code>state</code> is not the one this page sent; it did "
                "not come from the button here. Nothing was saved.</p>",
            )
        if not code:
            return _html(400, "Refused", "<p>The callback carries no code.</p>")
        async with self._lock:  # a reload of the callback page must not spend the code twice
            if self.done.is_set():
                return _html(409, "Already done", "<p>This setup has finished.</p>")
            try:
                app = await anyio.to_thread.run_sync(self._convert, code)
                await anyio.to_thread.run_sync(self._save, app)
            except ConfigError as exc:
                self.outcome = Outcome(error=str(exc))
                self.done.set()
                return _html(502, "Not created", f"<p>{html.escape(str(exc))}</p>")
            self.outcome = Outcome(app=app)
            self.done.set()
        link = html.escape(app.install_url)
        return _html(
            200,
            "App created",
            f"<p>The App <code>{html.escape(app.slug)}</code> is registered and its "
            f'credentials saved. Install it: <a href="{link}">{link}</a></p>',
        )


def _html(status: int, title: str, body: str) -> Response:
    page = _PAGE.format(title=html.escape(title), body=body)
    return Response(status=status, body=page.encode(), content_type="text/html; charset=utf-8")
