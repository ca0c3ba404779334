"""The data directory of ``looprelay up``: where the embedded store, queue and secrets live.

It holds comment bodies from private repositories, so it is kept the way ssh keeps ``~/.ssh``:
the directory is 0700 (a reachable one is tightened, or refused when it is another user's),
its files are created 0600, and secret files are refused if anyone else can read them.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import IO

from looprelay.errors import ConfigError
from looprelay.filemodes import PRIVATE_FILE_MODE, private_directory

log = logging.getLogger("looprelay.datadir")

WEBHOOK_SECRET_FILE = "webhook-secret"  # noqa: S105 - a file name
WORKER_TOKEN_FILE = "worker-token"  # noqa: S105 - a file name
STORE_FILE = "looprelay.db"
QUEUE_FILE = "queue.db"
LOCK_FILE = "up.lock"
_SECRET_BYTES = 32
MIN_SECRET_BYTES = 16
"""128 bits: a shorter secret is warned about (GitHub's docs ask for a random, high-entropy one)."""


def default_data_dir() -> Path:
    """Return ``$XDG_STATE_HOME/looprelay`` (``~/.local/state/looprelay`` by default)."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "looprelay"


def ensure_data_dir(path: Path) -> Path:
    """Create the data directory (0700) if needed, or make an existing one private; return it.

    A directory the group or others can reach is set to 0700 and the change logged. Raises
    ``ConfigError`` when ``path`` is not a directory, is another user's, or cannot be made
    private.
    """
    return private_directory(path, what="data directory")


def read_or_create_secret(path: Path) -> tuple[str, bool]:
    """Return the secret stored at ``path`` and whether this call generated it.

    A new secret is 256 random bits, hex-encoded, written with mode 0600. An existing one
    under 128 bits (an operator's own) is used, with a warning. Raises ``ConfigError`` when
    the file is readable by others or empty.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        value = read_private(path)
        warn_if_weak(value.encode(), name=str(path))
        return value, False
    value = secrets.token_hex(_SECRET_BYTES)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(value + "\n")
    return value, True


def read_secret(path: Path) -> str:
    """Return the secret stored at ``path``; raises ``ConfigError`` if missing or exposed."""
    if not path.exists():
        raise ConfigError(f"{path} does not exist; start `looprelay up` once to create it")
    return read_private(path)


def warn_if_weak(secret: bytes, *, name: str) -> bool:
    """Log a warning when ``secret`` is under 128 bits (16 bytes); return whether it is.

    ``name`` says where the secret came from (a file, an environment variable), never its
    value. Never raises.
    """
    if len(secret) >= MIN_SECRET_BYTES:
        return False
    log.warning(
        "the secret in %s is %d bytes, under 128 bits; replace it with a random one of at "
        "least %d bytes (`openssl rand -hex 32`)",
        name,
        len(secret),
        MIN_SECRET_BYTES,
    )
    return True


def read_private(path: Path) -> str:
    """Return the stripped text of ``path``; raises ``ConfigError`` when others can read it or
    it is empty."""
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
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE)
    handle = os.fdopen(fd, "r+", encoding="ascii")
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
