"""Reading state: ``deliveries`` (the ledger, replay, sweep), ``events``, ``queue``."""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click

from looprelay.cli.common import data_path, emit, load, state_options, table

if TYPE_CHECKING:
    from looprelay.core.model import DispatchRecord
    from looprelay.ports import WorkItemStore

_EVENT_COLUMNS = ("at", "name", "delivery_id", "work_item", "data")
_DISPATCH_COLUMNS = (
    "dispatch_id",
    "work_item",
    "seq",
    "kind",
    "status",
    "runner",
    "waiting",
    "created_at",
    "result",
    "resend",
    "detail",
)
DETAIL_SHOWN_CHARS = 200
"""How much of a dispatch's detail one line of `looprelay dispatches` shows (--json: all)."""


def _outcome(value: str | None) -> str | None:
    from looprelay.core.model import REASONED_OUTCOMES, is_valid_outcome

    if value is None or value in REASONED_OUTCOMES or is_valid_outcome(value):
        return value
    raise click.BadParameter(
        f"{value[:80]!r} is none of received, dispatched, ignored, ignored:REASON, pong, "
        "failed, refused or refused:REASON",
        param_hint="--outcome",
    )


def _work_item(value: str | None) -> str | None:
    """A work-item filter in the form the stores keep: GitHub treats owner, repository and
    host case-insensitively and looprelay keeps them lower case, so ``github:Octo/Repo#1``
    finds ``github:octo/repo#1`` in either store."""
    from looprelay.core.workitems import PROVIDER, parse_ref

    if value is None:
        return None
    text = value.strip()
    if text[: len(PROVIDER) + 1].lower() == f"{PROVIDER}:":
        text = f"{PROVIDER}:{text[len(PROVIDER) + 1 :]}"
    try:
        return parse_ref(text).format()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--work-item") from None


@click.group("deliveries", invoke_without_command=True)
@state_options
@click.option(
    "--outcome",
    default=None,
    callback=lambda ctx, param, value: _outcome(value),
    help="Only this outcome (received, dispatched, ignored, ignored:event, pong, refused, "
    "refused:REASON, failed).",
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
    from looprelay.app.adapters import open_store

    store = open_store(load(config_path), data_dir=data_path(data_dir))
    emit(
        store.list_deliveries(outcome=outcome, limit=limit),
        as_json,
        ("received_at", "delivery_id", "event", "action", "outcome", "attempts", "detail"),
    )


@deliveries.command("replay")
@click.argument("delivery_id")
@state_options
@click.pass_obj
def deliveries_replay(
    obj: tuple[Path | None, Path | None],
    delivery_id: str,
    config_path: Path | None,
    data_dir: Path | None,
) -> None:
    """Send a delivery through the worker again: a failed one (a dead letter), or one still
    `received` whose queue task died (GitHub shows it delivered, so the sweeper skips it)."""
    from looprelay.app.adapters import open_queue, open_store
    from looprelay.service.replay import replay_delivery

    config, data = load(config_path or obj[0]), data_path(data_dir or obj[1])
    replay_delivery(
        open_store(config, data_dir=data),
        open_queue(config, data_dir=data),
        delivery_id=delivery_id,
        attempt=secrets.token_hex(8),
    )
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
    Needs github.appId and its key (github.privateKeyEnv, or the App `looprelay app create`
    saved in the data directory)."""
    from looprelay.app.adapters import app_github, open_store, system_clock
    from looprelay.service.sweeper import sweep

    data = data_path(data_dir or obj[1])
    config = load(config_path or obj[0], data)
    store = open_store(config, data_dir=data)
    github = app_github(config.github, os.environ)
    settings = config.sweeper
    if limit is not None:
        settings = settings.model_copy(update={"redeliveries_per_run": limit})
    report = sweep(github, store, system_clock(), settings=settings, dry_run=dry_run)
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
@click.option(
    "--work-item",
    default=None,
    callback=lambda ctx, param, value: _work_item(value),
    help="Only this work item, e.g. github:o/r#1 (in any case).",
)
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

    --follow pages by each store's own sequence, so events written in the same instant, or
    by writers racing one another, are each printed once (``service.follow``).
    """
    from looprelay.app.adapters import open_store
    from looprelay.service.follow import follow as follow_log

    store = open_store(load(config_path), data_dir=data_path(data_dir))
    listing = partial(store.list_events, delivery_id=delivery, work_item=work_item, name=name)
    start = since.replace(tzinfo=UTC) if since is not None else None
    printed = False
    if follow and start is None:
        newest = listing(newest=True, limit=1)
        cursor = newest[-1].cursor if newest else None  # none yet: all to come is new
    else:
        batch = listing(since=start, newest=start is None, limit=limit)
        emit(batch, as_json, _EVENT_COLUMNS)
        cursor, printed = (batch[-1].cursor if batch else None), bool(batch)
        if not follow:
            return
    # Ctrl-C is how one stops following, not an error. It only sets a flag, looked at
    # between reads: an interrupt raised inside a store call or a lock could leave the
    # process unable to exit.
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: interrupted.set())
    try:
        batches = follow_log(
            partial(listing, since=start, limit=limit), cursor=cursor, sleep=interrupted.wait
        )
        for batch in batches:
            emit(batch, as_json, _EVENT_COLUMNS, headers=not printed)
            printed = True
            if interrupted.is_set():
                return
    finally:
        signal.signal(signal.SIGINT, previous)


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
    from looprelay.app.adapters import open_local_queue

    queue = open_local_queue(load(config_path), data_dir=data_path(data_dir))
    rows = [
        {
            "name": task.name,
            "state": task.state,
            "attempts": task.attempts,
            "last_status": task.last_status,
            "last_error": task.last_error,
        }
        for task in queue.list_tasks(state)
    ]
    if not as_json:
        table(rows, ("name", "state", "attempts", "last_status", "last_error"))
    for row in rows if as_json else ():
        click.echo(json.dumps(row))


@queue_group.command("retry")
@state_options
@click.argument("name")
def queue_retry(config_path: Path | None, data_dir: Path | None, name: str) -> None:
    """Give a dead task a fresh set of attempts."""
    from looprelay.app.adapters import open_local_queue

    queue = open_local_queue(load(config_path), data_dir=data_path(data_dir))
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
    its runner reported (result, and the detail: a failed turn's message first). Interrupted
    ones (an agent stopped while applying them) are listed too, with the command that sends
    them again until it is run: nothing is ever pasted twice on its own."""
    ctx.obj = (config_path, data_dir)
    if ctx.invoked_subcommand is not None:
        return
    from datetime import UTC, datetime, timedelta

    from looprelay.app.adapters import open_runner_registry, open_work_item_store
    from looprelay.core.model import DISPATCH_OPEN
    from looprelay.core.resend import is_interrupted, resend_id
    from looprelay.core.scheduling import is_live
    from looprelay.core.status import explain_waits
    from looprelay.service.lease_desk import leasable_heads

    config = load(config_path)
    items = open_work_item_store(config, data_dir=data_path(data_dir))
    runners = open_runner_registry(config, data_dir=data_path(data_dir)).list_runners()
    now = datetime.now(UTC)
    lost_after = timedelta(seconds=config.runners.lost_after_seconds)
    live = [r.runner_id for r in runners if is_live(r, now=now, lost_after=lost_after)]
    if show_all:
        rows = items.list_dispatches(statuses=())
    else:
        # Interrupted and not sent again yet: waiting for an operator's decision.
        interrupted = [
            d
            for d in items.list_dispatches(statuses=("failed",))
            if is_interrupted(d) and items.get_dispatch(resend_id(d.dispatch_id)) is None
        ]
        rows = sorted(
            [*items.list_dispatches(statuses=DISPATCH_OPEN), *interrupted],
            key=lambda d: (d.created_at, d.seq),
        )
    open_rows = [d for d in rows if d.status in DISPATCH_OPEN]
    holding = {runner_id: items.held_sessions(runner_id) for runner_id in live}
    heads = leasable_heads(items, now=now)
    waiting = explain_waits(open_rows, heads, runners, live=live, holding=holding)
    state = _state_args(config_path, data_dir)
    shown = []
    for dispatch in rows:
        why = waiting.get(dispatch.dispatch_id)
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
            "resend": _resend_hint(items, dispatch, state),
            "detail": dispatch.detail or None,
        }
        if as_json:
            click.echo(json.dumps(row, ensure_ascii=False))
        else:
            # The detail goes last and on the row's one line: it is the runner's free text.
            row["detail"] = " ".join((dispatch.detail or "").split())[:DETAIL_SHOWN_CHARS] or None
            shown.append(row)
    if not as_json:
        table(shown, tuple(_DISPATCH_COLUMNS))


@dispatches.command("replay")
@click.argument("dispatch_id")
@click.pass_obj
def dispatches_replay(obj: tuple[Path | None, Path | None], dispatch_id: str) -> None:
    """Offer an expired dispatch (no live runner served its repository in time) again."""
    from datetime import UTC, datetime

    from looprelay.app.adapters import open_stores
    from looprelay.service.expiry import replay_dispatch

    config_path, data_dir = obj
    stores = open_stores(load(config_path), data_dir=data_path(data_dir))
    if replay_dispatch(stores.work_items, stores.store, dispatch_id, now=datetime.now(UTC)) is None:
        raise click.ClickException(
            f"dispatch {dispatch_id} is not expired; only expired ones replay "
            "(`looprelay dispatches --all` shows each one's status and result)"
        )
    click.echo(f"{dispatch_id}: offered to runners again")


def _state_args(config_path: Path | None, data_dir: Path | None) -> str:
    """The ``--config``/``--data`` a printed command needs to act on the same state."""
    import shlex

    parts = [("--config", config_path), ("--data", data_dir)]
    return "".join(f" {flag} {shlex.quote(str(path))}" for flag, path in parts if path)


def _resend_hint(items: WorkItemStore, dispatch: DispatchRecord, state: str) -> str | None:
    """For an interrupted dispatch: the command that sends it again, or which dispatch
    already did. None for every other dispatch."""
    from looprelay.core.resend import RESEND_COMMAND, is_interrupted, resend_id

    if not is_interrupted(dispatch):
        return None
    sent = items.get_dispatch(resend_id(dispatch.dispatch_id))
    if sent is not None:
        return f"sent again as {sent.dispatch_id}"
    return f"{RESEND_COMMAND} {dispatch.dispatch_id}{state}"


@dispatches.command("resend")
@state_options
@click.argument("dispatch_id")
@click.pass_obj
def dispatches_resend(
    obj: tuple[Path | None, Path | None],
    config_path: Path | None,
    data_dir: Path | None,
    dispatch_id: str,
) -> None:
    """Send an interrupted dispatch again: its prompt goes to its session once more, after
    whatever its work item has queued. The agent may have pasted it before it stopped; only
    an operator can tell, so this is never done on its own."""
    from looprelay.app.adapters import open_stores
    from looprelay.service.replay import resend_dispatch

    stores = open_stores(load(config_path or obj[0]), data_dir=data_path(data_dir or obj[1]))
    again = resend_dispatch(
        stores.work_items, stores.store, dispatch_id=dispatch_id, now=datetime.now(UTC)
    )
    click.echo(f"{dispatch_id}: sent again as {again.dispatch_id} (seq {again.seq})")
