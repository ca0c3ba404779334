"""``looprelay``: the operator's command line. Signals are handled here and nowhere else."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from looprelay.cli.appcmds import app_group
from looprelay.cli.configcmds import config_group
from looprelay.cli.inspect import deliveries, dispatches, events, queue_group
from looprelay.cli.runner_service import service_group
from looprelay.cli.runners import runner_group, runners_group
from looprelay.cli.serve import send, up
from looprelay.cli.session import session_group
from looprelay.cli.skill import skill_group
from looprelay.cli.status import status
from looprelay.errors import LoopRelayError

ERROR_PREFIX = "error: "
"""What every failing command's last line starts with, whichever layer refused."""


class _Cli(click.Group):
    """The root group: click's own errors and looprelay's end the same way, one line that
    starts with :data:`ERROR_PREFIX` and exit code 1 (2 for a usage mistake)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            if exc.ctx is not None:
                click.echo(exc.ctx.get_usage(), err=True)
                click.echo(f"Try '{exc.ctx.command_path} -h' for help.", err=True)
            _fail(exc.format_message(), exc.exit_code)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except LoopRelayError as exc:
            _fail(str(exc), 1)
        except click.Abort:
            _fail("interrupted", 130)
        sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(ERROR_PREFIX + message, err=True)
    sys.exit(code)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="looprelay", message="%(prog)s %(version)s")
def cli() -> None:
    """looprelay: GitHub issues and pull requests to AI coding-agent sessions."""


for _command in (
    up,
    send,
    status,
    config_group,
    app_group,
    deliveries,
    dispatches,
    events,
    queue_group,
    runners_group,
    runner_group,
    session_group,
    skill_group,
):
    cli.add_command(_command)
runner_group.add_command(service_group)


def main() -> None:
    """Run the command line; every error is one line and a non-zero exit code."""
    cli()
