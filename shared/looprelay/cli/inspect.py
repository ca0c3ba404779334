"""Reading state: ``deliveries`` (the ledger, replay, sweep), ``events``, ``queue``."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import click

from looprelay.cli.common import data_path, emit, load, state_options

FOLLOW_POLL_SECONDS = 1.0
DETAIL_SHOWN_CHARS = 200
"""How much of a dispatch's detail one line of `looprelay dispatches` shows (--json: all)."""


def _outcome(value: str | None) -> str | None:
    from looprelay.records import is_valid_outcome

    if value is None or value == "refused" or is_valid_outcome(value):
        return value
    raise click.BadParameter(
        f"{value[:80]!r} is none of received, dispatched, ignored, failed, refused or "
        "refused:REASON",
        param_hint="--outcome",
    )


@click.group("deliveries", invoke_without_command=True)
@state_options
@click.option(
    "--outcome",
    default=None,
    callback=lambda ctx, param, value: _outcome(value),
    help="Only this outcome (received, dispatched, ignored, refused, refused:REASON, failed).",
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
    """Send a delivery through the worker again: a failed one (a dead letter), or one still
    `received` whose queue task died (GitHub shows it delivered, so the sweeper skips it)."""
    from looprelay.replay import replay_delivery

    config_path, data_dir = obj
    replay_delivery(load(config_path), data_dir=data_path(data_dir), delivery_id=delivery_id)
    click.echo(f"{delivery_id}: queued again")


@deliveries.command("sweep")
@state_options
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=None,
    help="Most redeliveries (default: sweeper.redeliveriesPerRun).",
)
@click.option("--dry-run", is_flag=True, help="Show what would be redelivered; ask for nothing.")
@click.pass_obj
def deliveries_sweep(
    obj: tuple[Path | None, Path | None],
    config_path: Path | None,
    data_dir: Path | None,
    limit: int | None,
    dry_run: bool,
) -> None:
    """Ask GitHub to redeliver the App's failed deliveries that the ledger lacks, back to
    where the last sweep left off (at most GitHub's 3 days; GitHub never retries them itself).
    Needs github.appId and github.privateKeyEnv."""
    from looprelay.adapters.clock import SystemClock
    from looprelay.stores import open_store
    from looprelay.sweeper import app_github, sweep

    config = load(config_path or obj[0])
    store = open_store(config, data_dir=data_path(data_dir or obj[1]))
    github = app_github(config.github, os.environ)
    settings = config.sweeper
    if limit is not None:
        settings = settings.model_copy(update={"redeliveries_per_run": limit})
    report = sweep(github, store, SystemClock(), settings=settings, dry_run=dry_run)
    for delivery, outcome in report.picked:
        stamp = delivery.delivered_at.isoformat()
        click.echo(f"{outcome}  {delivery.guid}  attempt {delivery.id}  {delivery.event}  {stamp}")
    click.echo(
        f"listed {report.listed}, failed {report.failed}, already in the ledger "
        f"{report.in_ledger}, redelivered {report.redelivered}, errors {report.errors}, "
        f"left for the next run {report.left}"
    )
    if not report.complete:
        click.echo(f"the listing stopped before {report.since.isoformat()}; run again")
    if report.errors:
        raise click.ClickException(f"{report.errors} redelivery request(s) failed; see above")


@click.command()
@state_options
@click.option("--delivery", default=None, help="Only this delivery id.")
@click.option("--work-item", default=None, help="Only this work item, e.g. github:o/r#1.")
@click.option("--name", default=None, help="Only this event name, e.g. delivery.settled.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="How many of the newest events to show.",
)
@click.option(
    "--since",
    type=click.DateTime(formats=["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"]),
    default=None,
    help="Only events at or after this UTC time (with --follow: start there, not now).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--follow", is_flag=True, help="Keep printing new events, from now on.")
def events(
    config_path: Path | None,
    data_dir: Path | None,
    delivery: str | None,
    work_item: str | None,
    name: str | None,
    limit: int,
    since: datetime | None,
    as_json: bool,
    follow: bool,
) -> None:
    """List the structured event log: the newest --limit events, oldest first.

    --follow pages by each store's own sequence, so events written in the same instant are
    each printed once.
    """
    from looprelay.stores import open_store

    store = open_store(load(config_path), data_dir=data_path(data_dir))
    listing = partial(store.list_events, delivery_id=delivery, work_item=work_item, name=name)
    start = since.replace(tzinfo=UTC) if since is not None else None
    if follow and start is None:
        newest = listing(newest=True, limit=1)
        cursor = newest[-1].cursor if newest else None  # none yet: all to come is new
    else:
        batch = listing(since=start, newest=start is None, limit=limit)
        emit(batch, as_json, ("at", "name", "delivery_id", "work_item", "data"))
        cursor = batch[-1].cursor if batch else None
        if not follow:
            return
    while True:
        batch = listing(after=cursor, since=start, limit=limit)
        emit(batch, as_json, ("at", "name", "delivery_id", "work_item", "data"))
        if batch:
            cursor = batch[-1].cursor
        else:
            time.sleep(FOLLOW_POLL_SECONDS)


@click.group("queue")
def queue_group() -> None:
    """Inspect the embedded queue of `looprelay up`."""


@queue_group.command("list")
@state_options
@click.option("--state", type=click.Choice(["pending", "leased", "done", "dead"]), default=None)
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


@click.group("dispatches", invoke_without_command=True)
@state_options
@click.option("--all", "show_all", is_flag=True, help="Settled ones too, not only open ones.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def dispatches(
    ctx: click.Context,
    config_path: Path | None,
    data_dir: Path | None,
    show_all: bool,
    as_json: bool,
) -> None:
    """List dispatches; an open one no runner may take says why it waits, a settled one what
    its runner reported (result, and the detail: a failed turn's message first)."""
    ctx.obj = (config_path, data_dir)
    if ctx.invoked_subcommand is not None:
        return
    from datetime import UTC, datetime, timedelta

    from looprelay.core.scheduling import is_live, waiting_reasons
    from looprelay.leases import leasable_heads
    from looprelay.records import DISPATCH_OPEN
    from looprelay.stores import open_runner_registry, open_work_item_store

    config = load(config_path)
    items = open_work_item_store(config, data_dir=data_path(data_dir))
    runners = open_runner_registry(config, data_dir=data_path(data_dir)).list_runners()
    now = datetime.now(UTC)
    lost_after = timedelta(seconds=config.runners.lost_after_seconds)
    live = [r.runner_id for r in runners if is_live(r, now=now, lost_after=lost_after)]
    rows = items.list_dispatches(statuses=() if show_all else DISPATCH_OPEN)
    heads = leasable_heads(items, now=now)
    waiting = {w.dispatch_id: w.reason for w in waiting_reasons(heads, runners, live=live)}
    head_ids = {d.dispatch_id for d in heads}
    for dispatch in rows:
        why = waiting.get(dispatch.dispatch_id)
        if why is None and dispatch.status == "pending" and dispatch.dispatch_id not in head_ids:
            why = "after-earlier-dispatch-of-its-work-item"
        row = {
            "dispatch_id": dispatch.dispatch_id,
            "work_item": dispatch.work_item,
            "seq": dispatch.seq,
            "kind": dispatch.kind,
            "status": dispatch.status,
            "runner": dispatch.lease_holder or dispatch.runner_id,
            "waiting": why,
            "created_at": dispatch.created_at.isoformat(),
            "result": dispatch.result or None,
            "detail": dispatch.detail or None,
        }
        if as_json:
            click.echo(json.dumps(row, ensure_ascii=False))
        else:
            # The detail goes last and on the row's one line: it is the runner's free text.
            row["detail"] = " ".join((dispatch.detail or "").split())[:DETAIL_SHOWN_CHARS] or None
            click.echo("  ".join(str(v) if v is not None else "-" for v in row.values()))


@dispatches.command("replay")
@click.argument("dispatch_id")
@click.pass_obj
def dispatches_replay(obj: tuple[Path | None, Path | None], dispatch_id: str) -> None:
    """Offer an expired dispatch (no live runner served its repository in time) again."""
    from datetime import UTC, datetime

    from looprelay.expiry import replay_dispatch
    from looprelay.stores import open_stores

    config_path, data_dir = obj
    stores = open_stores(load(config_path), data_dir=data_path(data_dir))
    if replay_dispatch(stores.work_items, stores.store, dispatch_id, now=datetime.now(UTC)) is None:
        raise click.ClickException(
            f"dispatch {dispatch_id} is not expired; only expired ones replay "
            "(`looprelay dispatches --all` shows each one's status and result)"
        )
    click.echo(f"{dispatch_id}: offered to runners again")
