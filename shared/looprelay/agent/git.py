"""The operator's own git, run for the agent: argv lists, no shell, no prompt, always a timeout.

The one module that runs git (STYLE: wrap it once). :class:`Git` holds the commands the
workspaces need, each bounded by the same timeout.

git inherits the agent's environment, so the operator's config (``url.<base>.insteadOf``),
credential helpers and SSH keys apply; ``GIT_TERMINAL_PROMPT=0`` and a new session (no
controlling terminal, so ssh cannot ask either) make a missing credential a failure, not a wait.

The runner's own git never runs repository code (issue 21): every command carries
:data:`HARDENING` (no hooks, no fsmonitor, no ``ext::`` transport, no submodule recursion) and
``--no-replace-objects`` (a planted ``refs/replace/*`` cannot change what a commit holds). These
are command-line settings, so they win over any repository's config but leave the operator's own
(``insteadOf``, credential helpers, ``core.sshCommand``) in force. Repository config that could
still run a command (``remote.*.uploadpack``, ``core.sshCommand``, ``credential.helper``,
``filter.*``, ``include.path``...) is dealt with by :func:`reset_clone`, which rewrites the config
of a clone the agent made to the canonical content it wrote, and removes ``hooks/`` and other
planted files, before each use; an operator's ``--checkout`` is not rewritten, only protected
by the flags.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from looprelay.agent.children import Finished, Overran, run_child
from looprelay.errors import RunnerError

GIT = "git"
TAIL_CHARS = 600
"""How much of the end of git's stderr an error message carries."""

HARDENING = (
    "core.hooksPath=/dev/null",  # no hook of any repository runs, a planted one included
    "core.fsmonitor=false",  # core.fsmonitor may name a program to run on every status
    "protocol.ext.allow=never",  # ext:: URLs are commands
    "submodule.recurse=false",  # a fork's .gitmodules must not make git fetch or check out more
    "fetch.recurseSubmodules=false",
)
"""``-c`` settings every git command of the agent carries (see the module doc)."""
PLANTABLE = ("hooks", "info/attributes", "objects/info/alternates", "commondir", "config.worktree")
"""What a session could plant in a clone's git directory that git would read or run; removed by
:func:`reset_clone` (the config itself is rewritten)."""

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
    whole at the deadline), with :data:`HARDENING`. Raises ``RunnerError`` ``workspace-failed``
    when ``cwd`` is not a directory, git cannot be started or it runs past its timeout; a
    non-zero exit is returned, not raised.
    """
    run = _run(args, cwd=cwd, timeout_seconds=timeout_seconds, errors="replace")
    # Sanitised whole, before any tail is cut, so a cut cannot split a secret from its URL.
    return GitRun(run.exit_code, sanitise(run.stdout), sanitise(run.stderr)[-TAIL_CHARS:])


def git_bytes(args: Sequence[str], *, cwd: Path | None, timeout_seconds: float) -> bytes:
    """Run ``git args`` as :func:`run_git` does and return its stdout byte for byte (a blob).

    Raises ``RunnerError`` ``workspace-failed`` as :func:`git_output` does.
    """
    run = _run(args, cwd=cwd, timeout_seconds=timeout_seconds, errors="surrogateescape")
    if run.exit_code != 0:
        message = _one_line(sanitise(run.stderr)[-TAIL_CHARS:])
        raise RunnerError(
            f"git {_name(args)} failed (exit {run.exit_code}): {message}",
            reason="workspace-failed",
        )
    return run.stdout.encode("utf-8", "surrogateescape")


def _run(args: Sequence[str], *, cwd: Path | None, timeout_seconds: float, errors: str) -> Finished:
    if cwd is not None and not cwd.is_dir():  # else Popen's error would blame git itself
        raise RunnerError(f"{cwd} is not a directory", reason="workspace-failed")
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    hardening = [part for setting in HARDENING for part in ("-c", setting)]
    argv = [GIT, "--no-replace-objects", *hardening, *args]
    try:
        return run_child(argv, cwd=cwd, env=env, timeout_seconds=timeout_seconds, errors=errors)
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


def canonical_config(url: str, *, bare: bool) -> str:
    """Return the config the agent writes into a clone of its own: core settings, origin at
    ``url`` fetching every branch. Nothing in it names a program."""
    core = "\tbare = true\n" if bare else "\tbare = false\n\tlogallrefupdates = true\n"
    return (
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n"
        f"{core}"
        '[remote "origin"]\n'
        f"\turl = {url}\n"
        "\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
    )


def reset_clone(git_dir: Path, *, url: str, bare: bool) -> None:
    """Make ``git_dir`` (a clone the agent made) hold only what the agent wrote there.

    Replaces its ``config`` by :func:`canonical_config` (a symlink in its place is replaced, not
    followed) and removes :data:`PLANTABLE` and each worktree's ``config.worktree``, so
    nothing a session wrote into the git directory is read or run by the next git command.
    Objects and refs stay. Raises ``OSError`` when the directory cannot be written.
    """
    for name in PLANTABLE:
        _remove(git_dir / name)
    worktrees = git_dir / "worktrees"
    if worktrees.is_dir() and not worktrees.is_symlink():
        for admin in worktrees.iterdir():
            _remove(admin / "config.worktree")
    temporary = git_dir / f"config.looprelay-{os.getpid()}"
    temporary.write_text(canonical_config(url, bare=bare), encoding="utf-8")
    temporary.replace(git_dir / "config")


def _remove(path: Path) -> None:
    # The link itself, never its target; a directory whole (rmtree does not follow links).
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


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

    def out_bytes(self, *args: str, cwd: Path | None) -> bytes:
        """Run ``git args`` and return its stdout as bytes (see :func:`git_bytes`)."""
        return git_bytes(args, cwd=cwd, timeout_seconds=self.timeout_seconds)

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
