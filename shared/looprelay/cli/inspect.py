"""Reading state: ``deliveries`` (the ledger, replay), ``events``, ``queue``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from looprelay.cli.common import data_path, emit, load, state_options

FOLLOW_POLL_SECONDS = 1.0


@click.group("deliveries", invoke_without_command=True)
@state_options
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

    store = open_store(load(config_path), data_dir=data_path(data_dir))
    emit(
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
    replay_delivery(load(config_path), data_dir=data_path(data_dir), delivery_id=delivery_id)
    click.echo(f"{delivery_id}: queued again")


@click.command()
@state_options
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

    store = open_store(load(config_path), data_dir=data_path(data_dir))
    after = None
    while True:
        batch = store.list_events(
            delivery_id=delivery, work_item=work_item, name=name, after=after, limit=limit
        )
        emit(batch, as_json, ("at", "name", "delivery_id", "work_item", "data"))
        if batch:
            after = batch[-1].at
        if not follow:
            return
        time.sleep(FOLLOW_POLL_SECONDS)


@click.group("queue")
def queue_group() -> None:
    """Inspect the embedded queue of `looprelay up`."""


@queue_group.command("list")
@state_options
@click.option("--state", default=None, help="pending, leased, done or dead.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def queue_list(
    config_path: Path | None, data_dir: Path | None, state: str | None, as_json: bool
) -> None:
    """List the embedded queue's tasks."""
    from looprelay.adapters.embedded_queue import EmbeddedQueue
    from looprelay.datadir import QUEUE_FILE

    config = load(config_path)
    queue = EmbeddedQueue(
        data_path(data_dir) / QUEUE_FILE, retry=config.queue.retry, settings=config.queue.embedded
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
@state_options
@click.argument("name")
def queue_retry(config_path: Path | None, data_dir: Path | None, name: str) -> None:
    """Give a dead task a fresh set of attempts."""
    from looprelay.adapters.embedded_queue import EmbeddedQueue
    from looprelay.datadir import QUEUE_FILE

    config = load(config_path)
    queue = EmbeddedQueue(
        data_path(data_dir) / QUEUE_FILE, retry=config.queue.retry, settings=config.queue.embedded
    )
    if not queue.retry_dead(name):
        raise click.ClickException(f"{name} is not a dead task")
    click.echo(f"{name}: queued again")
