"""The data directory of ``looprelay up``: where the embedded store, queue and secrets live.

Secret files are created with mode 0600 and refused if anyone else can read them, the way
ssh treats private keys.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import stat
from pathlib import Path
from typing import IO

from looprelay.errors import ConfigError

WEBHOOK_SECRET_FILE = "webhook-secret"  # noqa: S105 - a file name
WORKER_TOKEN_FILE = "worker-token"  # noqa: S105 - a file name
STORE_FILE = "looprelay.db"
QUEUE_FILE = "queue.db"
LOCK_FILE = "up.lock"
_SECRET_BYTES = 32


def default_data_dir() -> Path:
    """Return ``$XDG_STATE_HOME/looprelay`` (``~/.local/state/looprelay`` by default)."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "looprelay"


def ensure_data_dir(path: Path) -> Path:
    """Create the data directory (0700) if needed and return it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def read_or_create_secret(path: Path) -> tuple[str, bool]:
    """Return the secret stored at ``path`` and whether this call generated it.

    A new secret is 256 random bits, hex-encoded, written with mode 0600. Raises
    ``ConfigError`` when the file is readable by others or empty.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_private(path), False
    value = secrets.token_hex(_SECRET_BYTES)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(value + "\n")
    return value, True


def read_secret(path: Path) -> str:
    """Return the secret stored at ``path``; raises ``ConfigError`` if missing or exposed."""
    if not path.exists():
        raise ConfigError(f"{path} does not exist; start `looprelay up` once to create it")
    return _read_private(path)


def _read_private(path: Path) -> str:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"{path} is readable by other users (mode {mode:o}); run `chmod 600 {path}`"
        )
    value = path.read_text(encoding="ascii").strip()
    if not value:
        raise ConfigError(f"{path} is empty; delete it and start `looprelay up` again")
    return value


def lock_data_dir(path: Path) -> IO[str]:
    """Take the data directory's exclusive lock, so only one ``looprelay up`` owns it.

    Keep the returned file open for as long as the lock is needed. Raises ``ConfigError`` when
    another process holds it.
    """
    handle = (path / LOCK_FILE).open("a+", encoding="ascii")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.close()
        raise ConfigError(
            f"another `looprelay up` is using {path}; stop it or pass a different --data"
        ) from exc
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
