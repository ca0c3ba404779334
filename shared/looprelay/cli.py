"""``looprelay``: the operator's command line. Signals are handled here and nowhere else."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import click
from pydantic import BaseModel

from looprelay.config import Config, load_config
from looprelay.datadir import WEBHOOK_SECRET_FILE, default_data_dir, read_secret
from looprelay.errors import ConfigError, LoopRelayError

F = TypeVar("F", bound=Callable[..., Any])
_FOLLOW_POLL_SECONDS = 1.0


def _state_options(func: F) -> F:
    """``--config`` and ``--data``: every command that reads state takes both."""
    func = click.option(
        "--data",
        "data_dir",
        type=click.Path(path_type=Path),
        default=None,
        help="Data directory of the embedded store and queue [default: ~/.local/state/looprelay].",
    )(func)
    return click.option(
        "--config",
        "config_path",
        type=click.Path(path_type=Path),
        default=None,
        envvar="LOOPRELAY_CONFIG",
        help="YAML config file [env: LOOPRELAY_CONFIG].",
    )(func)


def _load(config_path: Path | None) -> Config:
    try:
        return load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def _data(data_dir: Path | None) -> Path:
    return data_dir or default_data_dir()


def main() -> None:
    """Run the command line; looprelay errors become one clear line and exit code 1."""
    try:
        cli(standalone_mode=True)
    except LoopRelayError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@click.group()
def cli() -> None:
    """looprelay: GitHub issues and pull requests to AI coding-agent sessions."""


@cli.command()
@_state_options
@click.option("--host", default=None, help="Address to bind [default: 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Port to bind [default: 8484].")
@click.option(
    "--insecure-no-verify",
    is_flag=True,
    help="Accept unsigned deliveries (local experiments only; warns on every request).",
)
@click.option("--log-level", default="INFO", show_default=True)
def up(
    config_path: Path | None,
    data_dir: Path | None,
    host: str | None,
    port: int | None,
    insecure_no_verify: bool,
    log_level: str,
) -> None:
    """Run webhook, worker and runner API on one machine, with the embedded store and queue."""
    from looprelay.embedded import EmbeddedStack
    from looprelay.logs import configure_logging

    configure_logging(log_level)
    config = _load(config_path)
    server = config.server.model_copy(
        update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
    )
    config = config.model_copy(update={"server": server})
    stack = EmbeddedStack(
        config, data_dir=_data(data_dir), environ=os.environ, verify=not insecure_no_verify
    )
    stopping = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    stack.start()
    click.echo(_banner(stack, insecure_no_verify), err=True)
    stopping.wait()
    click.echo("stopping: queued tasks stay on disk and are sent on the next start", err=True)
    stack.stop()


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


@cli.command()
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
@_state_options
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
    from looprelay.sender import post_delivery

    config = _load(config_path)
    target = url or f"http://{config.server.host}:{config.server.port}/webhook"
    secret = _sending_secret(config, secret_env, _data(data_dir))
    status, body = post_delivery(
        url=target,
        event=event,
        body=payload.read_bytes(),
        secret=secret,
        delivery_id=delivery or str(uuid.uuid4()),
        form=form,
    )
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


@cli.group("config")
def config_group() -> None:
    """Validate the config file and print its schema and reference."""


@config_group.command("validate")
@click.argument("path", type=click.Path(path_type=Path))
def config_validate(path: Path) -> None:
    """Check PATH against the config models; name every wrong key."""
    _load(path)
    click.echo(f"{path}: valid")


@config_group.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of the config file."""
    from looprelay.configdocs import config_schema_text

    click.echo(config_schema_text(), nl=False)


@config_group.command("docs")
def config_docs() -> None:
    """Print the Markdown reference of every config key."""
    from looprelay.configdocs import config_docs as render

    click.echo(render(), nl=False)


def _emit(rows: Iterable[BaseModel], as_json: bool, columns: tuple[str, ...]) -> None:
    for row in rows:
        data = row.model_dump(mode="json")
        if as_json:
            click.echo(json.dumps(data, ensure_ascii=False))
        else:
            click.echo(
                "  ".join(
                    str(data.get(column) if data.get(column) is not None else "-")
                    for column in columns
                )
            )


@cli.group("deliveries", invoke_without_command=True)
@_state_options
@click.option(
    "--outcome",
    default=None,
    help="Only this outcome (received, dispatched, ignored, refused, failed).",
)
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def deliveries(
    ctx: click.Context,
    config_path: Path | None,
    data_dir: Path | None,
    outcome: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List the delivery ledger, newest first (failed ones are the dead letters)."""
    ctx.obj = (config_path, data_dir)
    if ctx.invoked_subcommand is not None:
        return
    from looprelay.stores import open_store

    store = open_store(_load(config_path), data_dir=_data(data_dir))
    _emit(
        store.list_deliveries(outcome=outcome, limit=limit),
        as_json,
        ("received_at", "delivery_id", "event", "action", "outcome", "attempts", "detail"),
    )


@deliveries.command("replay")
@click.argument("delivery_id")
@click.pass_obj
def deliveries_replay(obj: tuple[Path | None, Path | None], delivery_id: str) -> None:
    """Send a failed delivery (a dead letter) through the worker again."""
    from looprelay.replay import replay_delivery

    config_path, data_dir = obj
    replay_delivery(_load(config_path), data_dir=_data(data_dir), delivery_id=delivery_id)
    click.echo(f"{delivery_id}: queued again")


@cli.command()
@_state_options
@click.option("--delivery", default=None, help="Only this delivery id.")
@click.option("--work-item", default=None, help="Only this work item, e.g. github:o/r#1.")
@click.option("--name", default=None, help="Only this event name, e.g. delivery.settled.")
@click.option("--limit", type=int, default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--follow", is_flag=True, help="Keep printing new events.")
def events(
    config_path: Path | None,
    data_dir: Path | None,
    delivery: str | None,
    work_item: str | None,
    name: str | None,
    limit: int,
    as_json: bool,
    follow: bool,
) -> None:
    """List the structured event log, oldest first."""
    from looprelay.stores import open_store

    store = open_store(_load(config_path), data_dir=_data(data_dir))
    after = None
    while True:
        batch = store.list_events(
            delivery_id=delivery, work_item=work_item, name=name, after=after, limit=limit
        )
        _emit(batch, as_json, ("at", "name", "delivery_id", "work_item", "data"))
        if batch:
            after = batch[-1].at
        if not follow:
            return
        time.sleep(_FOLLOW_POLL_SECONDS)


@cli.group("queue")
def queue_group() -> None:
    """Inspect the embedded queue of `looprelay up`."""


@queue_group.command("list")
@_state_options
@click.option("--state", default=None, help="pending, leased, done or dead.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def queue_list(
    config_path: Path | None, data_dir: Path | None, state: str | None, as_json: bool
) -> None:
    """List the embedded queue's tasks."""
    from looprelay.adapters.embedded_queue import EmbeddedQueue
    from looprelay.datadir import QUEUE_FILE

    config = _load(config_path)
    queue = EmbeddedQueue(
        _data(data_dir) / QUEUE_FILE, retry=config.queue.retry, settings=config.queue.embedded
    )
    for task in queue.list_tasks(state):
        row = {
            "name": task.name,
            "state": task.state,
            "attempts": task.attempts,
            "last_status": task.last_status,
            "last_error": task.last_error,
        }
        click.echo(json.dumps(row) if as_json else "  ".join(str(v) for v in row.values()))


@queue_group.command("retry")
@_state_options
@click.argument("name")
def queue_retry(config_path: Path | None, data_dir: Path | None, name: str) -> None:
    """Give a dead task a fresh set of attempts."""
    from looprelay.adapters.embedded_queue import EmbeddedQueue
    from looprelay.datadir import QUEUE_FILE

    config = _load(config_path)
    queue = EmbeddedQueue(
        _data(data_dir) / QUEUE_FILE, retry=config.queue.retry, settings=config.queue.embedded
    )
    if not queue.retry_dead(name):
        raise click.ClickException(f"{name} is not a dead task")
    click.echo(f"{name}: queued again")


_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration_seconds(text: str) -> int:
    match = _DURATION.match(text.strip())
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration like 30m, 1h or 2d")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


@cli.group("runners")
def runners_group() -> None:
    """Operator view of runner agents: tokens, list, revoke, rotate."""


@runners_group.command("token")
@_state_options
@click.option("--ttl", default=None, help="Lifetime, e.g. 30m, 1h [default: runners config].")
def runners_token(config_path: Path | None, data_dir: Path | None, ttl: str | None) -> None:
    """Mint a single-use registration token; prints only the token."""
    from datetime import UTC, datetime, timedelta

    from looprelay.runnerapi import mint_registration_token
    from looprelay.stores import open_runner_registry

    config = _load(config_path)
    seconds = _duration_seconds(ttl) if ttl else config.runners.registration_token_ttl_seconds
    registry = open_runner_registry(config, data_dir=_data(data_dir))
    token = mint_registration_token(registry, now=datetime.now(UTC), ttl=timedelta(seconds=seconds))
    click.echo(token)


@runners_group.command("list")
@_state_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def runners_list(config_path: Path | None, data_dir: Path | None, as_json: bool) -> None:
    """List registered runners (never their secrets)."""
    from looprelay.stores import open_runner_registry

    registry = open_runner_registry(_load(config_path), data_dir=_data(data_dir))
    rows = [r.model_copy(update={"secret_hash": ""}) for r in registry.list_runners()]
    for runner in rows:
        data = runner.model_dump(mode="json", exclude={"secret_hash"})
        if as_json:
            click.echo(json.dumps(data))
        else:
            status = "revoked" if runner.revoked else "active"
            labels = ",".join(f"{k}={v}" for k, v in sorted(runner.labels.items())) or "-"
            click.echo(
                f"{runner.runner_id}  {runner.name}  {status}  {labels}  "
                f"last seen {data['last_seen_at'] or '-'}"
            )


@runners_group.command("revoke")
@_state_options
@click.argument("runner_id")
def runners_revoke(config_path: Path | None, data_dir: Path | None, runner_id: str) -> None:
    """Revoke a runner: its next call is refused and told to register again."""
    from datetime import UTC, datetime

    from looprelay.stores import open_runner_registry

    registry = open_runner_registry(_load(config_path), data_dir=_data(data_dir))
    if not registry.revoke_runner(runner_id, at=datetime.now(UTC)):
        raise click.ClickException(f"{runner_id} is unknown or already revoked")
    click.echo(f"{runner_id}: revoked")


@runners_group.command("rotate")
@_state_options
@click.argument("runner_id")
def runners_rotate(config_path: Path | None, data_dir: Path | None, runner_id: str) -> None:
    """Give a runner a new secret; prints it once, for the runner's credentials file."""
    from looprelay.runnerauth import hash_credential, new_runner_secret
    from looprelay.stores import open_runner_registry

    registry = open_runner_registry(_load(config_path), data_dir=_data(data_dir))
    secret = new_runner_secret()
    if not registry.rotate_runner_secret(runner_id, secret_hash=hash_credential(secret)):
        raise click.ClickException(f"{runner_id} is unknown or revoked")
    click.echo(secret)


@cli.group("runner")
def runner_group() -> None:
    """This machine as a runner agent."""


def _labels(values: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key or not val:
            raise click.BadParameter(f"{value!r} is not k=v", param_hint="--label")
        labels[key] = val
    return labels


@runner_group.command("register")
@click.option("--server", required=True, help="Base URL of looprelay (e.g. http://127.0.0.1:8484).")
@click.option("--token", required=True, help="Registration token from `looprelay runners token`.")
@click.option("--name", required=True, help="A name for this runner, shown to operators.")
@click.option("--label", "labels", multiple=True, help="k=v label; repeat for several.")
@click.option(
    "--capacity",
    type=int,
    default=2,
    show_default=True,
    help="Sessions this runner may hold at once.",
)
@click.option(
    "--credentials",
    "credentials_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write the credentials [default: ~/.config/looprelay/runner.json].",
)
def runner_register(
    server: str,
    token: str,
    name: str,
    labels: tuple[str, ...],
    capacity: int,
    credentials_path: Path | None,
) -> None:
    """Register this machine with a registration token; writes its credentials (0600)."""
    from importlib.metadata import version

    from looprelay.agent.credentials import default_credentials_path, write_credentials
    from looprelay.agent.register import register

    credentials = register(
        server=server,
        token=token,
        name=name,
        labels=_labels(labels),
        version=version("looprelay"),
        capacity=capacity,
    )
    path = credentials_path or default_credentials_path()
    write_credentials(path, credentials)
    click.echo(f"registered {credentials.name} as {credentials.runner_id}; credentials in {path}")


if __name__ == "__main__":
    main()
