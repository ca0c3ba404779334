"""``looprelay``: the operator's command line. Signals are handled here and nowhere else."""

from __future__ import annotations

import sys

import click

from looprelay.cli.configcmds import config_group
from looprelay.cli.inspect import deliveries, dispatches, events, queue_group
from looprelay.cli.runners import runner_group, runners_group
from looprelay.cli.serve import send, up
from looprelay.cli.skill import skill_group
from looprelay.cli.status import status
from looprelay.errors import LoopRelayError


@click.group()
def cli() -> None:
    """looprelay: GitHub issues and pull requests to AI coding-agent sessions."""


for _command in (
    up,
    send,
    status,
    config_group,
    deliveries,
    dispatches,
    events,
    queue_group,
    runners_group,
    runner_group,
    skill_group,
):
    cli.add_command(_command)


def main() -> None:
    """Run the command line; looprelay errors become one clear line and exit code 1."""
    try:
        cli(standalone_mode=True)
    except LoopRelayError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
