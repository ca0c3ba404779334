"""``looprelay status``: the status page's view in the terminal."""

from __future__ import annotations

from pathlib import Path

import click

from looprelay.cli.common import data_path, load, state_options


@click.command("status")
@state_options
@click.option("--json", "as_json", is_flag=True, help="The view as one JSON object.")
def status(config_path: Path | None, data_dir: Path | None, as_json: bool) -> None:
    """Show runners, sessions with their attach commands, open dispatches and why they wait,
    recent deliveries, what to replay and how far behind polling is: what `GET /status`
    shows."""
    from datetime import timedelta

    from looprelay.adapters.clock import SystemClock
    from looprelay.app.adapters import (
        open_poll_cursors,
        open_runner_registry,
        open_store,
        open_work_item_store,
    )
    from looprelay.service.status import StatusReader, render_text

    config = load(config_path)
    data = data_path(data_dir)
    given = [("--config", config_path), ("--data", data_dir)]
    reader = StatusReader(
        store=open_store(config, data_dir=data),
        work_items=open_work_item_store(config, data_dir=data),
        runners=open_runner_registry(config, data_dir=data),
        clock=SystemClock(),
        lost_after=timedelta(seconds=config.runners.lost_after_seconds),
        command_args=[part for flag, path in given if path for part in (flag, str(path))],
        poll_cursors=open_poll_cursors(config, data_dir=data)
        if config.github.poll.repositories
        else None,
    )
    view = reader.read()
    click.echo(view.model_dump_json() if as_json else render_text(view), nl=as_json)
