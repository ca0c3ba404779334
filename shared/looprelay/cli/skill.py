"""``looprelay skill``: the loop's Claude Code skill, for sessions a person starts by hand."""

from __future__ import annotations

from pathlib import Path

import click

from looprelay.errors import ConfigError, RunnerError


@click.group("skill")
def skill_group() -> None:
    """The loop's Claude Code skill: where questions go, and that artifacts are reviewed on
    their pull request."""


@skill_group.command("install")
@click.argument("directory", type=click.Path(path_type=Path), default=".")
def skill_install(directory: Path) -> None:
    """Install the skill into DIRECTORY/.claude/skills/looprelay [default: here].

    The skill directory ignores itself, so the checkout's git status stays clean. Run it in
    the checkouts where you start Claude Code sessions yourself.
    """
    from looprelay.agent.skill import install_skill, skill_directory

    try:
        written = install_skill(directory)
    except RunnerError as exc:
        raise ConfigError(str(exc)) from exc
    for path in written:
        click.echo(f"wrote {path}")
    if not written:
        click.echo(f"{skill_directory(directory)} is up to date")
    click.echo(f"Claude Code picks the skill up in sessions started in {directory.resolve()}.")
