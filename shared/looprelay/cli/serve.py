"""``looprelay up`` and ``looprelay send``: run the embedded stack, post a signed payload."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import click

from looprelay.cli.common import data_path, load, log_options, state_options
from looprelay.config import Config
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
    from looprelay.embedded import EmbeddedStack
    from looprelay.logs import configure_logging

    configure_logging(log_level, log_format=log_format)
    config = load(config_path)
    server = config.server.model_copy(
        update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
    )
    config = config.model_copy(update={"server": server})
    stack = EmbeddedStack(
        config, data_dir=data_path(data_dir), environ=os.environ, verify=not insecure_no_verify
    )
    code = stack.serve(on_started=lambda: click.echo(_banner(stack, insecure_no_verify), err=True))
    if code == 0:
        click.echo("stopped: queued tasks stay on disk and are sent on the next start", err=True)
    sys.exit(code)


def _banner(stack: Any, insecure: bool) -> str:
    source = stack.secret_source
    lines = [
        "",
        f"looprelay is up on {stack.base_url}",
        f"  webhook URL   {stack.webhook_url}",
        f"  data          {stack.data_dir}",
        f"  secret        {source.description}"
        + (" (generated now, mode 0600)" if source.generated else ""),
    ]
    if insecure:
        lines.append("  WARNING       signatures are NOT verified (--insecure-no-verify)")
    lines += [
        "",
        "Next:",
        f"  try it:   looprelay send tests/fixtures/github/issue_comment.created.json "
        f"--event issue_comment --url {stack.webhook_url}"
        + (f" --data {stack.data_dir}" if source.path else ""),
        "  GitHub:   point your App's webhook (through a tunnel) at the webhook URL and paste "
        "the secret" + (f": cat {source.path}" if source.path else ""),
        f"  inspect:  looprelay deliveries --data {stack.data_dir}",
        "",
    ]
    return "\n".join(lines)


@click.command()
@click.argument("payload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--event", required=True, help="X-GitHub-Event, e.g. issue_comment.")
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
    payload: Path,
    event: str,
    url: str | None,
    secret_env: str | None,
    delivery: str | None,
    form: bool,
    config_path: Path | None,
    data_dir: Path | None,
) -> None:
    """Sign PAYLOAD like GitHub does and post it to a running webhook."""
    import requests

    from looprelay.sender import post_delivery

    config = load(config_path)
    target = url or f"http://{config.server.host}:{config.server.port}/webhook"
    secret = _sending_secret(config, secret_env, data_path(data_dir))
    try:
        status, body = post_delivery(
            url=target,
            event=event,
            body=payload.read_bytes(),
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
    click.echo(f"{status} {body}")
    if not 200 <= status < 300:
        sys.exit(1)


def _sending_secret(config: Config, secret_env: str | None, data_dir: Path) -> bytes:
    name = secret_env or next(iter(config.github.webhook_secrets), None)
    if name:
        value = os.environ.get(name, "")
        if not value:
            raise click.ClickException(f"environment variable {name} is unset or empty")
        return value.encode()
    return read_secret(data_dir / WEBHOOK_SECRET_FILE).encode()
