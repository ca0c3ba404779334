"""``looprelay up`` and ``looprelay send``: run the embedded stack, post a signed payload."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import click

from looprelay.cli.common import data_path, load, log_options, preflight, state_options
from looprelay.config.model import AuthorizedUser, Config
from looprelay.datadir import WEBHOOK_SECRET_FILE, read_secret
from looprelay.logs import LogFormat


@click.command()
@state_options
@click.option("--host", default=None, help="Address to bind [default: 127.0.0.1].")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Port to bind, 0 for any free one [default: 8484].",
)
@click.option(
    "--insecure-no-verify",
    is_flag=True,
    help="Accept unsigned deliveries (local experiments only; warns on every request).",
)
@log_options
def up(
    config_path: Path | None,
    data_dir: Path | None,
    host: str | None,
    port: int | None,
    insecure_no_verify: bool,
    log_level: str,
    log_format: LogFormat,
) -> None:
    """Run webhook, worker and runner API on one machine, with the embedded store and queue.

    Exits 0 after Ctrl-C or SIGTERM, and 1 when the server stopped serving by itself, so a
    supervisor restarts it.
    """
    from looprelay.app.local import LocalStack
    from looprelay.logs import configure_logging

    configure_logging(log_level, log_format=log_format)
    config = load(config_path, data_path(data_dir))
    identity = preflight(config)
    server = config.server.model_copy(
        update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
    )
    config = config.model_copy(update={"server": server})
    stack = LocalStack(
        config, data_dir=data_path(data_dir), environ=os.environ, verify=not insecure_no_verify
    )
    banner = _banner(stack, insecure_no_verify, identity)
    code = stack.serve(on_started=lambda: click.echo(banner, err=True))
    if code == 0:
        click.echo("stopped: queued tasks stay on disk and are sent on the next start", err=True)
    sys.exit(code)


def shell_command() -> str:
    """How the user's shell runs this looprelay: ``looprelay`` when that name on PATH is this
    program, else its full path (``./dev up`` runs it from a venv that is not on PATH)."""
    import shlex
    import shutil

    program = Path(sys.argv[0])
    on_path = shutil.which("looprelay")
    if program.name == "looprelay":
        if on_path and Path(on_path).resolve() == program.resolve():
            return "looprelay"
        return shlex.quote(str(program.resolve()))
    return f"{shlex.quote(sys.executable)} -m looprelay.cli"


def _banner(stack: Any, insecure: bool, identity: str | None) -> str:
    command = shell_command()
    source = stack.secret_source
    lines = [
        "",
        f"looprelay is up on {stack.base_url}",
        f"  webhook URL   {stack.webhook_url}",
        f"  status page   {stack.base_url}/status",
        f"  data          {stack.data_dir}",
        f"  secret        {source.description}"
        + (" (generated now, mode 0600)" if source.generated else ""),
    ]
    lines.append(f"  GitHub        {identity or 'no credentials checked (no comments on GitHub)'}")
    poll = stack.config.github.poll
    if poll.repositories:
        lines.append(
            f"  polling       {', '.join(poll.repositories)} every {poll.interval_seconds:g} s"
        )
    if insecure:
        lines.append("  WARNING       signatures are NOT verified (--insecure-no-verify)")
    user, caveat = _try_it_user(stack.config)
    lines += [
        "",
        "Next:",
        f'  try it:   {command} send --comment "hello" --issue 1 {user}--url {stack.webhook_url}'
        + (f" --data {stack.data_dir}" if source.path else ""),
        *([f"            ({caveat})"] if caveat else []),
        "  GitHub:   `looprelay app create --webhook-url PUBLIC_URL/webhook`, or README "
        "'Connecting GitHub'" + (f"; the secret: cat {source.path}" if source.path else ""),
        f"  inspect:  {command} deliveries --data {stack.data_dir}",
        "",
    ]
    return "\n".join(lines)


def _try_it_user(config: Config) -> tuple[str, str]:
    """The ``--user`` (and ``--user-id``) options of the banner's "try it" line, naming the
    first person ``routing.authorizedUsers`` accepts, and a caveat to print with it."""
    import shlex

    users = config.routing.authorized_users
    if not users:
        return "", "routing.authorizedUsers is empty: add yourself, or the comment is refused"
    first = users[0]
    if isinstance(first, AuthorizedUser):
        return f"--user {shlex.quote(first.login)} --user-id {first.id} ", ""
    if isinstance(first, int):
        return f"--user you --user-id {first} ", ""
    return (
        f"--user {shlex.quote(first)} ",
        f"this pins {first} to a made-up user id in this data directory; list yourself as "
        "{login, id} to try it as you",
    )


@click.command()
@click.argument(
    "payload", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False
)
@click.option("--event", default=None, help="X-GitHub-Event, e.g. issue_comment.")
@click.option(
    "--comment",
    default=None,
    help="Instead of PAYLOAD: send an issue_comment with this body (with --issue, --repo, "
    "--user, --label).",
)
@click.option("--issue", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--repo", default="octo/widgets", show_default=True, help="owner/name.")
@click.option("--user", default="octocat", show_default=True, help="Login of the commenter.")
@click.option("--user-id", type=click.IntRange(min=1), default=None, help="Their user id.")
@click.option("--label", "labels", multiple=True, help="A label on the issue; repeat.")
@click.option("--url", default=None, help="Webhook URL [default: from --config, /webhook].")
@click.option(
    "--secret-env",
    default=None,
    help="Environment variable holding the secret [default: the data dir's secret].",
)
@click.option("--delivery", default=None, help="X-GitHub-Delivery [default: a new UUID].")
@click.option("--form", is_flag=True, help="Send as application/x-www-form-urlencoded.")
@state_options
def send(
    payload: Path | None,
    event: str | None,
    comment: str | None,
    issue: int,
    repo: str,
    user: str,
    user_id: int | None,
    labels: tuple[str, ...],
    url: str | None,
    secret_env: str | None,
    delivery: str | None,
    form: bool,
    config_path: Path | None,
    data_dir: Path | None,
) -> None:
    """Sign a delivery like GitHub does and post it to a running webhook: PAYLOAD (a JSON
    file, with --event), or a comment built from --comment.

    \b
    looprelay send --comment "the-loop start" --issue 1 --user octocat \\
        --label "the-loop: auto-execute"
    """
    import requests

    from looprelay.cli.sender import post_delivery

    body = _payload_bytes(payload, event, comment, issue, repo, user, user_id, labels)
    config = load(config_path)
    target = url or f"http://{config.server.host}:{config.server.port}/webhook"
    secret = _sending_secret(config, secret_env, data_path(data_dir))
    try:
        status, answer = post_delivery(
            url=target,
            event=event or "issue_comment",
            body=body,
            secret=secret,
            delivery_id=delivery or str(uuid.uuid4()),
            form=form,
        )
    except requests.ConnectionError as exc:
        raise click.ClickException(
            f"nothing answers at {target}; start `looprelay up` or pass the --url it printed"
        ) from exc
    except requests.RequestException as exc:
        raise click.ClickException(f"sending to {target} failed: {exc}") from exc
    click.echo(f"{status} {answer}")
    if not 200 <= status < 300:
        sys.exit(1)


def _payload_bytes(
    payload: Path | None,
    event: str | None,
    comment: str | None,
    issue: int,
    repo: str,
    user: str,
    user_id: int | None,
    labels: tuple[str, ...],
) -> bytes:
    """PAYLOAD's bytes as they are, or the comment payload the options describe."""
    import json

    from looprelay.cli.sender import comment_payload

    if payload is not None and comment is not None:
        raise click.UsageError("give PAYLOAD or --comment, not both")
    if payload is not None:
        if event is None:
            raise click.UsageError("PAYLOAD needs --event (e.g. --event issue_comment)")
        return payload.read_bytes()
    if comment is None:
        raise click.UsageError('give PAYLOAD --event EVENT, or --comment "TEXT"')
    if event not in (None, "issue_comment"):
        raise click.UsageError("--comment sends an issue_comment; drop --event")
    built = comment_payload(
        repository=repo, issue=issue, body=comment, login=user, user_id=user_id, labels=labels
    )
    return json.dumps(built).encode()


def _sending_secret(config: Config, secret_env: str | None, data_dir: Path) -> bytes:
    name = secret_env or next(iter(config.github.webhook_secrets), None)
    if name:
        value = os.environ.get(name, "")
        if not value:
            raise click.ClickException(f"environment variable {name} is unset or empty")
        return value.encode()
    return read_secret(data_dir / WEBHOOK_SECRET_FILE).encode()
