"""``looprelay config``: validate the file, print its schema and reference."""

from __future__ import annotations

from pathlib import Path

import click

from looprelay.cli.common import data_path, load, preflight


@click.group("config")
def config_group() -> None:
    """Validate the config file and print its schema and reference."""


@config_group.command("validate")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--data",
    "data_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Data directory whose saved App counts too [default: ~/.local/state/looprelay].",
)
def config_validate(path: Path, data_dir: Path | None) -> None:
    """Check PATH as a start does: every wrong key, the authorized users, the keywords, the
    prompt templates (read and compiled), the environment variables it names and the GitHub
    credentials (asked of GitHub); warnings go to stderr."""
    import sys

    from looprelay.config.routing import check_routing
    from looprelay.logs import configure_logging

    configure_logging("warning", stream=sys.stderr, log_format="text")
    config = load(path, data_path(data_dir))
    check_routing(config.routing)
    identity = preflight(config)
    click.echo(f"{path}: valid" + (f"; GitHub credentials act as {identity}" if identity else ""))


@config_group.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of the config file."""
    from looprelay.config.docs import config_schema_text

    click.echo(config_schema_text(), nl=False)


@config_group.command("docs")
def config_docs() -> None:
    """Print the Markdown reference of every config key."""
    from looprelay.config.docs import config_docs as render

    click.echo(render(), nl=False)
