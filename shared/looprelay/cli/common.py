"""What every command shares: ``--config``/``--data``, loading, listing output."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import BaseModel

from looprelay.config.model import Config, load_config
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
