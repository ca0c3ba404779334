"""``looprelay session``: what a harness runs, inside the session's tree, to speak on GitHub.

The runner agent started the harness with its session's identity in the environment
(``wire.runner_api.SESSION_ENV``); the comment goes through the runner API, which posts it as the
App with the loop-prevention marker. The operator's own GitHub account is never used.
"""

from __future__ import annotations

import os
import uuid
from typing import IO, Any

import click
import requests

from looprelay.core.replies import reply_body
from looprelay.errors import ConfigError, Transient, Unauthorized
from looprelay.wire.runner_api import API_PREFIX, SESSION_ENV, SessionPosted

CALL_TIMEOUT_SECONDS = 30.0
"""A post looks for an earlier copy of itself on GitHub first: a few GitHub calls."""


@click.group("session")
def session_group() -> None:
    """Speak for the looprelay session this runs in: post on its work item or pull request,
    as the App, marked so the comment never comes back to the session."""


@session_group.command("comment")
@click.option(
    "--body-file",
    type=click.File("r", encoding="utf-8"),
    required=True,
    help="The comment's Markdown; '-' reads stdin.",
)
def session_comment(body_file: IO[str]) -> None:
    """Post a comment on the session's work item (or its pull request, for a pull request's
    session)."""
    posted = _say(body_file.read(), ask=False)
    click.echo(f"commented on {posted.on} (comment {posted.comment_id})")


@session_group.command("ask")
@click.option("--question", help="The question's text.")
@click.option(
    "--question-file",
    type=click.File("r", encoding="utf-8"),
    help="A file holding the question; '-' reads stdin.",
)
def session_ask(question: str | None, question_file: IO[str] | None) -> None:
    """Ask the people on the work item: posts the question and marks the session awaiting
    input until a human answers. Stop and wait then: the answer arrives as a new message."""
    if (question is None) == (question_file is None):
        raise click.UsageError("give exactly one of --question and --question-file")
    posted = _say(question if question is not None else _read(question_file), ask=True)
    click.echo(
        f"asked on {posted.on} (comment {posted.comment_id}); awaiting input: stop here, the "
        "answer arrives in this session as a new message"
    )


def _read(handle: IO[str] | None) -> str:
    return handle.read() if handle is not None else ""


def _say(text: str, *, ask: bool) -> SessionPosted:
    """Send ``text`` as the session the environment names; raises ``ConfigError`` outside a
    session, ``Unauthorized`` when the server refuses the token, ``Transient`` when it cannot
    be reached or fails."""
    env = {name: os.environ.get(variable, "") for name, variable in SESSION_ENV.items()}
    missing = [SESSION_ENV[name] for name, value in env.items() if not value]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not set: run this inside a session looprelay started (its "
            "runner gives the harness these), not in your own shell"
        )
    body = reply_body(text)  # cut here too, so a huge file is not sent only to be cut
    if not body:
        raise click.UsageError("the comment is empty")
    endpoint = "session-ask" if ask else "session-comment"
    answer = _post(
        env["api_url"].rstrip("/") + API_PREFIX + endpoint,
        token=env["token"],
        body={
            "work_item": env["work_item"],
            "endpoint": env["endpoint"],
            "body": body,
            "key": uuid.uuid4().hex,
        },
    )
    posted = SessionPosted.model_validate(answer)
    if body != text.strip():
        click.echo(f"note: cut to GitHub's comment limit ({len(text)} characters given)", err=True)
    return posted


def _post(url: str, *, token: str, body: dict[str, Any]) -> Any:
    try:
        response = requests.post(
            url,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=CALL_TIMEOUT_SECONDS,
        )
    except requests.RequestException as exc:
        raise Transient(
            f"the looprelay server at {url} could not be reached ({type(exc).__name__}); "
            "nothing was posted, try again"
        ) from exc
    try:
        said = response.json()
    except ValueError:
        said = {"error": response.text[:200]}
    error = str(said.get("error", "")) if isinstance(said, dict) else ""
    if response.status_code == 401:
        raise Unauthorized(f"the server refused this session's token: {error}")
    if response.status_code != 201:
        raise Transient(f"the server answered {response.status_code}: {error}")
    return said
