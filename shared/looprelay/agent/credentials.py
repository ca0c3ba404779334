"""The runner's credentials file: server URL, runner id and secret, mode 0600."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from looprelay.errors import ConfigError
from looprelay.filemodes import write_private_file


class Credentials(BaseModel):
    """What a registered runner needs to call the runner API."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: str
    runner_id: str
    secret: str
    name: str


def default_credentials_path() -> Path:
    """Return ``$XDG_CONFIG_HOME/looprelay/runner.json`` (``~/.config/...`` by default)."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "looprelay" / "runner.json"


def write_credentials(path: Path, credentials: Credentials) -> None:
    """Write ``credentials`` to ``path`` with mode 0600, replacing any previous file atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private_file(path, credentials.model_dump_json(indent=2) + "\n")


@contextmanager
def credentials_lock(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold the lock beside the credentials at ``path`` (``runner.json.lock``).

    ``runner rotate`` holds it exclusively from asking the server for a new secret until the
    file holds it; a running agent refused meanwhile takes it shared before it reads the file
    again, so it waits for the new secret instead of reading the retired one and stopping.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def lock_path(path: Path) -> Path:
    """The lock file beside the credentials at ``path``."""
    return path.with_name(path.name + ".lock")


def read_credentials(path: Path) -> Credentials:
    """Read the credentials at ``path``.

    Raises ``ConfigError`` when the file is missing, readable by others, or malformed.
    """
    if not path.exists():
        raise ConfigError(f"{path} does not exist; register first with `looprelay runner register`")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(f"{path} is readable by other users (mode {mode:o}); chmod 600 it")
    try:
        return Credentials.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except ValidationError as exc:
        fields = ", ".join(sorted({".".join(map(str, e["loc"])) or "?" for e in exc.errors()}))
        raise ConfigError(
            f"{path} is not a looprelay credentials file (bad or missing: {fields}); "
            "register again with `looprelay runner register`"
        ) from None
    except ValueError:
        raise ConfigError(
            f"{path} is not JSON; register again with `looprelay runner register`"
        ) from None
