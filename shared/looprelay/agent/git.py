"""The operator's own git, run for the agent: argv lists, no shell, no prompt, always a timeout.

The one module that runs git (STYLE: wrap it once). :class:`Git` holds the commands the
workspaces need, each bounded by the same timeout.

git inherits the agent's environment, so the operator's config (``url.<base>.insteadOf``),
credential helpers and SSH keys apply; ``GIT_TERMINAL_PROMPT=0`` and a new session (no
controlling terminal, so ssh cannot ask either) make a missing credential a failure, not a wait.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from looprelay.agent.children import Overran, run_child
from looprelay.errors import RunnerError

GIT = "git"
TAIL_CHARS = 600
"""How much of the end of git's stderr an error message carries."""

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")
"""``scheme://user:secret@`` in a URL; the user part goes too, as it may be a token."""


class GitRun(NamedTuple):
    """What one git command left: its exit code, stdout and the tail of stderr (sanitised)."""

    code: int
    stdout: str
    stderr: str


def sanitise(text: str) -> str:
    """Return ``text`` with every ``scheme://user:pass@`` reduced to ``scheme://``."""
    return _USERINFO.sub(r"\1", text)


def run_git(args: Sequence[str], *, cwd: Path | None, timeout_seconds: float) -> GitRun:
    """Run ``git args`` in ``cwd`` with stdin empty and return its exit code and output.

    Runs as :func:`looprelay.agent.children.run_child` does (its own process group, killed
    whole at the deadline). Raises ``RunnerError`` ``workspace-failed`` when ``cwd`` is not a
    directory, git cannot be started or it runs past its timeout; a non-zero exit is returned,
    not raised.
    """
    if cwd is not None and not cwd.is_dir():  # else Popen's error would blame git itself
        raise RunnerError(f"{cwd} is not a directory", reason="workspace-failed")
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        run = run_child([GIT, *args], cwd=cwd, env=env, timeout_seconds=timeout_seconds)
    except OSError as exc:
        raise RunnerError(
            f"cannot run git ({exc.strerror}); install git or put it on PATH",
            reason="workspace-failed",
        ) from exc
    except Overran as exc:
        raise RunnerError(
            f"git {_name(args)} ran past {timeout_seconds:g} s and was killed; "
            f"stderr: {_one_line(sanitise(exc.stderr)[-TAIL_CHARS:]) or '(none)'}",
            reason="workspace-failed",
        ) from exc
    # Sanitised whole, before any tail is cut, so a cut cannot split a secret from its URL.
    return GitRun(run.exit_code, sanitise(run.stdout), sanitise(run.stderr)[-TAIL_CHARS:])


def git_output(args: Sequence[str], *, cwd: Path | None, timeout_seconds: float) -> str:
    """Run ``git args`` and return its stdout without the trailing newline.

    Raises ``RunnerError`` ``workspace-failed`` on a non-zero exit, naming the git command and
    git's own message, as well as in the cases of :func:`run_git`.
    """
    run = run_git(args, cwd=cwd, timeout_seconds=timeout_seconds)
    if run.code != 0:
        message = _one_line(run.stderr or run.stdout[-TAIL_CHARS:])
        raise RunnerError(
            f"git {_name(args)} failed (exit {run.code}): {message}",
            reason="workspace-failed",
        )
    return run.stdout.rstrip("\n")


def _name(args: Sequence[str]) -> str:
    # The subcommand is enough to name it; operands may be URLs, and callers add context.
    return " ".join(args[:2]) if args[0] in ("worktree", "remote") else args[0]


def _one_line(text: str) -> str:
    # git's messages span lines; a result's detail is read as one.
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


class Git:
    """The git commands of working trees, each bounded by ``timeout_seconds``.

    Every method raises ``RunnerError`` ``workspace-failed`` when its git command fails (naming
    the command and git's message) or runs past the timeout.
    """

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds

    def run(self, *args: str, cwd: Path | None) -> GitRun:
        """Run ``git args`` (see :func:`run_git`); a non-zero exit is returned, not raised."""
        return run_git(args, cwd=cwd, timeout_seconds=self.timeout_seconds)

    def out(self, *args: str, cwd: Path | None) -> str:
        """Run ``git args`` and return its stdout (see :func:`git_output`)."""
        return git_output(args, cwd=cwd, timeout_seconds=self.timeout_seconds)

    def toplevel(self, path: Path) -> Path | None:
        """Return the top of the work tree ``path`` is in, or None when it is in none."""
        run = self.run("rev-parse", "--show-toplevel", cwd=path)
        return Path(run.stdout.strip()).resolve() if run.code == 0 else None

    def head(self, tree: Path) -> tuple[str, str]:
        """Return the branch (empty when detached) and the commit ``tree`` has checked out."""
        branch = self.run("symbolic-ref", "--quiet", "--short", "HEAD", cwd=tree)
        commit = self.out("rev-parse", "--verify", "HEAD^{commit}", cwd=tree)
        return (branch.stdout.strip() if branch.code == 0 else ""), commit

    def common_dir(self, tree: Path) -> Path:
        """Return the repository directory that ``tree`` (a clone or a worktree) belongs to."""
        return (tree / self.out("rev-parse", "--git-common-dir", cwd=tree)).resolve()

    def remote_urls(self, tree: Path) -> dict[str, str]:
        """Return each remote's URL as git uses it (``insteadOf`` applied), by remote name."""
        names = self.out("remote", cwd=tree).split()
        return {name: self.out("remote", "get-url", name, cwd=tree) for name in names}

    def commit_of(self, repo: Path, ref: str) -> str:
        """Return the commit ``ref`` names in ``repo``."""
        return self.out("rev-parse", "--verify", f"{ref}^{{commit}}", cwd=repo)

    def default_tip(self, repo: Path) -> str:
        """Return the commit of origin's default branch (``refs/remotes/origin/HEAD``).

        When origin/HEAD is unset (a repository made by ``init``) or dangles (the default branch
        was renamed and pruned) it is asked of origin first (``remote set-head --auto``).
        """
        head = "refs/remotes/origin/HEAD^{commit}"
        found = self.run("rev-parse", "--verify", "--quiet", head, cwd=repo)
        if found.code == 0:
            return found.stdout.strip()
        self.out("remote", "set-head", "origin", "--auto", cwd=repo)
        return self.out("rev-parse", "--verify", head, cwd=repo)

    def add_worktree(self, source: Path, path: Path, *, branch: str, start: str) -> None:
        """Add a worktree of ``source`` at ``path`` on ``branch``, made at commit ``start``.

        A ``branch`` that exists already is moved to ``start`` when its tip is an ancestor of
        it (nothing is lost); otherwise it holds commits of its own and the worktree continues
        on it as it is, rather than orphan them. No upstream is configured (``--no-track``).
        """
        tip = self.run("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", cwd=source)
        if tip.code != 0:
            args = ["--no-track", "-b", branch, str(path), start]
        elif self.run("merge-base", "--is-ancestor", tip.stdout.strip(), start, cwd=source).code:
            args = [str(path), branch]
        else:
            args = ["--no-track", "-B", branch, str(path), start]
        self.out("worktree", "add", "--quiet", *args, cwd=source)

    def checked_out(self, source: Path) -> set[str]:
        """Return the branches the worktrees of ``source`` (its own included) have checked out."""
        listed = self.out("worktree", "list", "--porcelain", cwd=source).splitlines()
        return {line[18:] for line in listed if line.startswith("branch refs/heads/")}

    def unregister(self, source: Path, paths: Iterable[Path]) -> None:
        """Remove those of ``paths`` that are registered worktrees of ``source``, present or not.

        A tree deleted by hand stays registered, and blocks ``worktree add`` at its path.
        """
        listed = self.out("worktree", "list", "--porcelain", cwd=source).splitlines()
        registered = {Path(line[9:]).resolve() for line in listed if line.startswith("worktree ")}
        for path in paths:
            if path.resolve() in registered:
                self.out("worktree", "remove", "--force", str(path), cwd=source)
