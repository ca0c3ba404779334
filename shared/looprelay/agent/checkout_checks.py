"""Start checks of where sessions run: each ``--checkout`` is a clone of the
repository it names, and the directory trees go in can be written. Each failure is one line
saying what to fix.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from looprelay.agent.git import Git, sanitise
from looprelay.errors import ConfigError, RunnerError

MAX_SHOWN_REMOTES_CHARS = 300


def names_repository(url: str, repository: str) -> bool:
    """Tell whether a remote URL's path ends in ``owner/repo`` (``.git`` optional, any case)."""
    parts = re.split(r"[/:]", url.strip().rstrip("/"))
    tail = "/".join(parts[-2:]).lower()
    return tail.removesuffix(".git") == repository.lower()


def check_checkout(git: Git, *, repository: str, path: Path) -> None:
    """Check that ``path`` is a git work tree with a remote whose URL names ``repository``.

    Remote URLs are read with ``git remote get-url``, so the operator's ``insteadOf`` applies.
    Raises ``ConfigError`` (``--checkout owner/repo=PATH: ...; <fix>``) when the path is not a
    directory, not in a work tree, has no such remote, or git fails or times out on it.
    """
    flag, fix = f"--checkout {repository}={path}", f"give the path of a clone of {repository}"
    if not path.is_dir():
        raise ConfigError(f"{flag}: no such directory; {fix}")
    try:
        if git.toplevel(path) is None:
            raise ConfigError(f"{flag}: not a git work tree; {fix}")
        urls = git.remote_urls(path)
    except RunnerError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc
    if not any(names_repository(url, repository) for url in urls.values()):
        shown = ", ".join(f"{name} {sanitise(url)}" for name, url in urls.items())
        raise ConfigError(
            f"{flag}: no remote is {repository} "
            f"({shown[:MAX_SHOWN_REMOTES_CHARS] or 'it has none'}); {fix} or fix the owner/repo"
        )


def check_writable(directory: Path, *, what: str) -> None:
    """Create ``directory`` if missing and check a file can be made in it.

    ``what`` names it for the operator (``--workspace``). Raises ``ConfigError`` when it
    cannot be created or written.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{what} {directory} cannot be created or written ({exc.strerror or exc}); "
            "choose a writable directory"
        ) from exc
