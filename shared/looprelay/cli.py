"""``looprelay``: the operator's command line. Signals are handled here and nowhere else."""

from __future__ import annotations

import json
import os
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


if __name__ == "__main__":
    main()
