"""``looprelay runner service install|uninstall``: the agent as a per-user service."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from looprelay.agent.service_unit import ServiceFile, launchd_agent, systemd_unit

KINDS = ("systemd", "launchd")
DEFAULT_NAME = "looprelay-runner"


def _kind_default() -> str:
    return "launchd" if sys.platform == "darwin" else "systemd"


def _service_file(
    kind: str, name: str, directory: Path | None, run_args: tuple[str, ...]
) -> ServiceFile:
    command = [sys.executable, "-m", "looprelay.cli", "runner", "run", *run_args]
    path_env = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    home = Path.home()
    if kind == "launchd":
        return launchd_agent(
            name=name,
            command=command,
            path_env=path_env,
            directory=directory or home / "Library" / "LaunchAgents",
            log_dir=home / "Library" / "Logs",
        )
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    return systemd_unit(
        name=name,
        command=command,
        path_env=path_env,
        directory=directory or config_home / "systemd" / "user",
    )


_kind_option = click.option(
    "--kind",
    type=click.Choice(KINDS),
    default=_kind_default,
    show_default="systemd on Linux, launchd on macOS",
    help="systemd user unit or launchd agent.",
)
_name_option = click.option(
    "--name", default=DEFAULT_NAME, show_default=True, help="Service name (one per runner)."
)
_dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where the file goes [default: ~/.config/systemd/user or ~/Library/LaunchAgents].",
)


@click.group("service")
def service_group() -> None:
    """Run the agent as a per-user service (systemd user unit, launchd agent)."""


@service_group.command(
    "install", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@_kind_option
@_name_option
@_dir_option
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED)
def service_install(
    kind: str, name: str, directory: Path | None, run_args: tuple[str, ...]
) -> None:
    """Write a service that runs `looprelay runner run RUN_ARGS...` (checked as `runner run`
    checks its options) and print how to start and stop it and read its logs.

    \b
    looprelay runner service install -- --checkout owner/repo=/path/to/checkout
    """
    from looprelay.cli.runners import runner_group

    run = runner_group.get_command(click.get_current_context(), "run")
    assert run is not None
    # Parsed as `runner run` would: a mistake in RUN_ARGS is a usage error now (raised
    # here), not a service failing at boot.
    run.make_context("looprelay runner run", list(run_args)).close()
    service = _service_file(kind, name, directory, run_args)
    service.path.parent.mkdir(parents=True, exist_ok=True)
    existed = service.path.exists()
    service.path.write_text(service.text, encoding="utf-8")
    click.echo(f"{'replaced' if existed else 'wrote'} {service.path}")
    click.echo(f"  start:  {service.start}")
    click.echo(f"  stop:   {service.stop}")
    click.echo(f"  logs:   {service.logs}")
    if kind == "systemd":
        click.echo("  at boot without logging in: loginctl enable-linger $USER")


@service_group.command("uninstall")
@_kind_option
@_name_option
@_dir_option
def service_uninstall(kind: str, name: str, directory: Path | None) -> None:
    """Remove the service file `install` wrote (stop the service first: the printed command)."""
    service = _service_file(kind, name, directory, ())
    if not service.path.exists():
        raise click.ClickException(f"no service file at {service.path}; nothing removed")
    service.path.unlink()
    click.echo(f"removed {service.path}; if it still runs: {service.stop}")
