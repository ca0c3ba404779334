"""What every command shares: ``--config``/``--data``, loading, listing output."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import BaseModel

from looprelay.config.model import Config, load_config
from looprelay.datadir import default_data_dir
from looprelay.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")


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


def load(config_path: Path | None, data_dir: Path | None = None) -> Config:
    """The configuration, with the App ``looprelay app create`` saved in ``data_dir`` beneath
    it when a data directory is given."""
    try:
        return load_config(config_path, data_dir=data_dir)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def preflight(config: Config) -> str | None:
    """Check what ``config`` names in the environment as a start does (webhook secrets, the
    operator token, the GitHub credentials, which GitHub is asked about) and print, once per
    repository the App is installed on, the command creating a missing auto-execute label;
    return who the GitHub credentials act as, or None. Raises ``ConfigError``, one line, for
    the first one missing or refused."""
    import os

    from looprelay.adapters.github.identity import github_identity, missing_label_commands
    from looprelay.config.secrets import operator_token_from_env, webhook_secrets_from_env

    webhook_secrets_from_env(config.github, os.environ)
    operator_token_from_env(config.server, os.environ)
    identity = github_identity(config.github, os.environ)
    if identity is not None:
        label = config.routing.auto_execute_label
        for repository, command in missing_label_commands(config.github, os.environ, label):
            click.echo(f"{repository} has no label {label!r}; create it: {command}", err=True)
    return identity


def data_path(data_dir: Path | None) -> Path:
    return data_dir or default_data_dir()


def emit(
    rows: Iterable[BaseModel], as_json: bool, columns: tuple[str, ...], *, headers: bool = True
) -> None:
    """Print ``rows``: one JSON object per line (a JSON text held in a field, such as a
    delivery's envelope, as an object), or a table of ``columns`` (``headers``: under its
    header line; a followed listing prints it once)."""
    dumped = [row.model_dump(mode="json") for row in rows]
    if as_json:
        for data in dumped:
            click.echo(json.dumps(_json_fields(data), ensure_ascii=False))
        return
    table(dumped, columns, headers=headers)


def _json_fields(data: dict[str, Any]) -> dict[str, Any]:
    envelope = data.get("envelope")
    if isinstance(envelope, str) and envelope.startswith("{"):
        with contextlib.suppress(ValueError):  # else kept as stored
            data["envelope"] = json.loads(envelope)
    return data


def table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    *,
    now: datetime | None = None,
    headers: bool = True,
) -> None:
    """Print ``rows`` under upper-case headers in aligned columns; times as ``5m ago``, empty
    values as ``-``, free text on one line (the last column is never padded)."""
    if not rows:
        return
    now = now or datetime.now(UTC)
    cells = [[_cell(row.get(column), now) for column in columns] for row in rows]
    titles = [column.upper().replace("_", " ") for column in columns]
    widths = [max(len(text) for text in column) for column in zip(titles, *cells, strict=True)]
    for line in ([titles] if headers else []) + cells:
        padded = [text.ljust(width) for text, width in zip(line[:-1], widths, strict=False)]
        click.echo("  ".join([*padded, line[-1]]).rstrip())


def _cell(value: Any, now: datetime) -> str:
    if value is None or value in ("", {}):
        return "-"
    if isinstance(value, str) and _TIMESTAMP.match(value):
        try:
            return relative_time(datetime.fromisoformat(value), now)
        except ValueError:
            return value
    if isinstance(value, dict):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return " ".join(str(value).split())


def relative_time(at: datetime, now: datetime) -> str:
    """``12s ago``, ``5m ago``, ``3h ago``, ``2d ago`` (``in 5m`` for a time ahead)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    seconds = int((now - at).total_seconds())
    ahead, seconds = seconds < 0, abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            amount = f"{seconds // size}{unit}"
            break
    else:
        amount = f"{seconds}s"
    return f"in {amount}" if ahead else f"{amount} ago"
