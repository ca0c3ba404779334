"""Where a session runs: the operator's configured checkout, or a directory the agent makes.

A configured ``owner/repo=PATH`` is an operator's own checkout: used as is, never removed. A
workspace root gets one directory per endpoint (``<root>/<session_name>``), created empty for now
(cloning comes later) and removed by cleanup. A pull-request endpoint prefers the workspace, so
that two sessions never share one working tree.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from looprelay.errors import ConfigError, RunnerError


@dataclass(frozen=True)
class Checkout:
    """A working directory for a session, and whether the agent created it."""

    path: Path
    created: bool


def parse_checkout_pairs(pairs: Iterable[str]) -> dict[str, Path]:
    """Parse ``owner/repo=PATH`` pairs into a map keyed by lower-case ``owner/repo``.

    Raises ``ConfigError`` for a pair without ``=``, a repository without one ``/`` or a path that
    is not absolute.
    """
    checkouts: dict[str, Path] = {}
    for pair in pairs:
        repository, sep, path = pair.partition("=")
        repository = repository.strip().lower()
        if not sep or repository.count("/") != 1 or not Path(path).is_absolute():
            raise ConfigError(
                f"checkout {pair[:200]!r} must read owner/repo=/absolute/path to a checkout"
            )
        checkouts[repository] = Path(path)
    return checkouts


class Checkouts:
    """The checkouts this runner may use: ``configured`` per repository, ``workspace_root``."""

    def __init__(
        self, *, configured: Mapping[str, Path] | None = None, workspace_root: Path | None = None
    ) -> None:
        self._configured = {key.lower(): path for key, path in (configured or {}).items()}
        self._root = workspace_root

    def can_checkout_pull_requests(self) -> bool:
        """Tell whether this runner can give a pull request a working tree of its own."""
        return self._root is not None

    def locate(self, *, repository: str, session_name: str, pull_request: bool) -> Checkout:
        """Return the directory session ``session_name`` of ``repository`` runs in.

        A pull-request endpoint uses the workspace when there is one; otherwise the configured
        checkout of ``repository`` wins, then the workspace. A workspace directory is created
        when missing. Raises ``RunnerError`` ``checkout-missing`` when neither applies, the
        configured path is not a directory or the workspace directory cannot be made.
        """
        configured = self._configured.get(repository.lower())
        if configured is not None and not (pull_request and self._root is not None):
            if not configured.is_dir():
                raise RunnerError(
                    f"the configured checkout of {repository} ({configured}) is not a directory",
                    reason="checkout-missing",
                )
            return Checkout(path=configured, created=False)
        if self._root is None:
            raise RunnerError(
                f"no checkout of {repository[:200]} on this runner; configure one or a "
                "workspace root",
                reason="checkout-missing",
            )
        path = self._root / session_name
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunnerError(f"cannot create {path}: {exc}", reason="checkout-missing") from exc
        return Checkout(path=path, created=True)

    def remove(self, path: Path) -> bool:
        """Delete a directory the agent created; return whether anything was removed.

        Only a real directory directly inside the workspace root is removed, never a symlink,
        the root itself or a configured checkout. Raises ``RunnerError`` ``cleanup-failed``
        when the directory cannot be deleted.
        """
        if self._root is None or not path.is_dir() or path.is_symlink():
            return False
        resolved = path.resolve()
        root = self._root.resolve()
        if resolved.parent != root or any(
            resolved == c.resolve() or c.resolve().is_relative_to(resolved)
            for c in self._configured.values()
        ):
            return False
        try:
            shutil.rmtree(resolved)
        except OSError as exc:
            raise RunnerError(f"cannot remove {resolved}: {exc}", reason="cleanup-failed") from exc
        return True
