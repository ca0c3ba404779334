"""What every command shares: ``--config``/``--data``, loading, listing output."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import BaseModel

from looprelay.config import Config, load_config
from looprelay.datadir import default_data_dir
from looprelay.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def state_options(func: F) -> F:
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


def log_options(func: F) -> F:
    """``--log-level`` and ``--log-format``: every long-running command takes both."""
    from looprelay.logs import LOG_FORMATS, LOG_LEVELS

    func = click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS),
        default="auto",
        show_default=True,
        help="text: one readable line per event; json: one JSON object per line (log "
        "collectors); auto: text at a terminal, else json.",
    )(func)
    return click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="info",
        show_default=True,
        help="Least severe level logged.",
    )(func)


def load(config_path: Path | None) -> Config:
    try:
        return load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def data_path(data_dir: Path | None) -> Path:
    return data_dir or default_data_dir()


def emit(rows: Iterable[BaseModel], as_json: bool, columns: tuple[str, ...]) -> None:
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
