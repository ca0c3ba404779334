"""Where a session runs: a git working tree of its own for every session.

Layout under the workspace root (``--workspace``):
  - ``.repos/<owner>/<repo>.git``: one shared bare clone per repository (strategy ``worktree``);
  - ``<session_name>``: the session's tree, a worktree of the shared clone or of the operator's
    checkout, or a full clone (strategy ``clone``);
  - ``.partial/<session_name>``: a tree being made, moved into place only once complete, so a
    killed git or agent never leaves a half-made tree where a session would reuse it.
Without a root, worktrees of operator checkouts go under ``worktrees`` the same way.

Scenario, for ``prepare(repository, session_name, pull_request)``:
  - ``<dir>/<session_name>`` is a git work tree  -> reused as is (a respawn keeps the agent's work);
  - it is an empty directory                     -> made anew (it holds nothing);
  - it exists as anything else                   -> ``workspace-failed``, nothing touched;
  - a work item of a repository with a checkout  -> a worktree of it at its HEAD commit;
  - otherwise, given a root                      -> fetch the shared clone (``worktree``) or clone
    (``clone``), starting at origin's HEAD, or at ``refs/pull/N/head`` fetched from the base
    repository (how GitHub serves a fork's pull request too);
  - otherwise                                    -> ``checkout-missing``.
The tree is on a branch named after the session (``<name>-2``, ``-3``... when another worktree of
the same repository has that branch checked out, as another runner's tree of the session may). A
branch of that name left behind by an earlier tree is moved to the start point when that loses
nothing (its tip is an ancestor of it); else the new tree continues on it as it is, so commits the
agent made there are never orphaned.

Trust (issue 21): a work item's tree and a same-repository pull request's hold the base
repository's own content and are trusted. A fork's pull request is not: it needs the dispatch's
``head`` (the approved commit), gets a clone of its own whatever the strategy, with the base's
agent config (:mod:`looprelay.agent.fork_tree`), and is refused outright with
``fork_sessions=False``. A pull request session's dispatch without a head comes from a server
older than this agent and is refused (fail closed). The shared clones are the agent's own: their
config is rewritten to the canonical content and planted hooks removed before each use and at
cleanup (:func:`looprelay.agent.git.reset_clone`).
"""

from __future__ import annotations

import itertools
import re
import shutil
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from looprelay.agent.agent_config import Restored, quarantine_dir
from looprelay.agent.checkout_checks import check_checkout, check_writable
from looprelay.agent.fork_tree import FORK_CLONE, prepare_fork_tree, tree_trusted
from looprelay.agent.git import GIT, Git, reset_clone
from looprelay.agent.tmux import SESSION_NAME
from looprelay.errors import ConfigError, RunnerError
from looprelay.wire.runner_api import DispatchHead

STRATEGIES = ("worktree", "clone")
PROTOCOLS = ("https", "ssh")
OPERATOR_WORKTREE = "operator-worktree"
REPOS_DIR = ".repos"
PARTIAL_DIR = ".partial"
BRANCHES = "+refs/heads/*:refs/remotes/origin/*"
"""What a shared clone fetches besides a PR head: every branch, as a clone would."""

_REPOSITORY = re.compile(r"[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?")


@dataclass(frozen=True)
class Checkout:
    """A session's working tree: where it is and what was prepared.

    ``created`` says the agent made it and may remove it; ``strategy`` is ``operator-worktree``,
    ``worktree``, ``clone`` or ``fork-clone``; ``branch`` and ``commit`` are its HEAD when
    prepared; ``reused`` says it already existed. The last four are empty (False) when not
    known, as for a tree the ledger recalled. ``trusted`` is False for a fork's pull request
    (its content is not the base repository's: sandbox it); ``restored`` says what of its agent
    config was made the base's, ``kept`` which branch holds commits an earlier approval's tree
    had (both only for such a tree).
    """

    path: Path
    created: bool
    strategy: str = ""
    branch: str = ""
    commit: str = ""
    reused: bool = False
    trusted: bool = True
    restored: Restored | None = None
    kept: str = ""


def clone_url(repository: str, *, protocol: str, host: str) -> str:
    """Return the URL to clone ``owner/repo`` from: https by default, scp-style for ``ssh``.

    Raises ``RunnerError`` ``invalid-dispatch`` when ``repository`` is not ``owner/repo``, and
    ``ConfigError`` for a protocol other than ``https``/``ssh`` or a host that is not a name.
    """
    _check_repository(repository)
    if not _HOST.fullmatch(host):
        raise ConfigError(f"git host {host[:100]!r} must be a host name such as github.com")
    if protocol == "https":
        return f"https://{host}/{repository}.git"
    if protocol == "ssh":
        return f"git@{host}:{repository}.git"
    raise ConfigError(f"clone protocol {protocol[:40]!r} must be one of {', '.join(PROTOCOLS)}")


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


class Workspaces:
    """Prepares and removes the working trees of this runner's sessions (see the module doc).

    ``configured`` maps ``owner/repo`` to the operator's checkout; ``root`` is ``--workspace``
    (needed for pull requests and repositories without a checkout); ``worktrees`` holds worktrees
    of operator checkouts when there is no root. Every git command is bounded by
    ``git_timeout_seconds``. ``keep_on_close`` is the operator's choice to keep trees on close;
    ``fork_sessions`` False refuses every fork pull request session (``fork-sessions-off``).
    Thread-safe: operations on one shared clone or operator checkout are serialised.
    """

    def __init__(
        self,
        *,
        configured: Mapping[str, Path],
        root: Path | None,
        worktrees: Path,
        strategy: str = "worktree",
        protocol: str = "https",
        host: str = "github.com",
        git_timeout_seconds: float = 300.0,
        keep_on_close: bool = False,
        fork_sessions: bool = True,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ConfigError(f"workspace strategy {strategy[:40]!r} must be worktree or clone")
        clone_url("owner/repo", protocol=protocol, host=host)  # raises for a bad protocol/host
        if not git_timeout_seconds > 0:
            raise ConfigError("the git timeout must be a positive number of seconds")
        self._configured = {key.lower(): path for key, path in configured.items()}
        self._root, self._worktrees = root, worktrees
        self._strategy, self._protocol, self._host = strategy, protocol, host
        self._git = Git(git_timeout_seconds)
        self.keep_on_close = keep_on_close
        self.fork_sessions = fork_sessions
        self._locks: dict[Path, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def can_checkout_pull_requests(self) -> bool:
        """Tell whether this runner can give a pull request a working tree of its own."""
        return self._root is not None

    def trusted(self, *, pull_request: int | None, head: DispatchHead | None) -> bool:
        """Tell whether a session's tree is trusted (see :func:`fork_tree.tree_trusted`, with
        this runner's ``fork_sessions``)."""
        return tree_trusted(pull_request=pull_request, head=head, fork_sessions=self.fork_sessions)

    def prepare(
        self,
        *,
        repository: str,
        session_name: str,
        pull_request: int | None,
        head: DispatchHead | None = None,
    ) -> Checkout:
        """Return session ``session_name``'s working tree of ``repository``, made if missing.

        ``pull_request`` is the PR number of a PR session, else None; ``head`` its dispatch's
        head (required for a PR). A fork head's tree is made as :mod:`fork_tree` says, with its
        agent config restored on every call. Blocks for git: each command at most
        ``git_timeout_seconds``. Raises ``RunnerError``: ``invalid-dispatch`` for a bad
        repository, session name, number or head; ``fork-sessions-off`` (see :meth:`trusted`);
        ``checkout-missing`` when this runner has no way to make the tree; ``fork-head-missing``
        when the approved commit is gone; ``workspace-failed`` when git fails or times out, or
        the session's directory exists and is not a work tree.
        """
        _check_repository(repository)
        if not SESSION_NAME.fullmatch(session_name):
            raise RunnerError(
                "the session name is not loop-[A-Za-z0-9_-]+", reason="invalid-dispatch"
            )
        if pull_request is not None and pull_request < 1:
            raise RunnerError(
                f"{pull_request} is not a pull request number", reason="invalid-dispatch"
            )
        trusted = self.trusted(pull_request=pull_request, head=head)
        operator = None if pull_request else self._configured.get(repository.lower())
        if operator is None and self._root is None:
            raise RunnerError(_no_tree(repository, pull_request), reason="checkout-missing")
        path = (self._root or self._worktrees) / session_name
        source = operator or self._shared_path(repository)
        own_clone = operator is None and (self._strategy == "clone" or not trusted)
        try:
            with self._lock(path if own_clone else source):
                if pull_request and head is not None and not trusted:
                    return self._fork_tree(repository, path, pull_request=pull_request, head=head)
                return self._existing(path) or self._make(
                    repository, path, operator=operator, pull_request=pull_request
                )
        except RunnerError as exc:
            raise RunnerError(
                f"cannot prepare {repository} for {session_name}: {exc}", reason=exc.reason
            ) from exc
        except OSError as exc:
            raise RunnerError(
                f"cannot prepare {repository} for {session_name}: {exc}", reason="workspace-failed"
            ) from exc

    def remove(self, path: Path) -> bool:
        """Remove a session's tree the agent made; return whether anything was removed.

        Only a real directory named like a session directly inside the root or the worktrees
        directory is touched, never a symlink, either directory itself, a shared clone or an
        operator checkout. A worktree goes by ``git worktree remove --force`` from the repository
        it belongs to (its branch stays: it may hold commits), anything else by ``rm -rf``.
        Raises ``RunnerError`` ``cleanup-failed`` when git or the file system refuses.
        """
        if not self._removable(path):
            return False
        try:
            if (path / ".git").is_file():
                self._remove_worktree(path)
            if path.exists():  # a clone, or what git left (files it did not track)
                shutil.rmtree(path)
            if self._root is not None:  # a fork tree's base snapshot and kept versions
                shutil.rmtree(quarantine_dir(self._root, path.name), ignore_errors=True)
        except (RunnerError, OSError) as exc:
            raise RunnerError(f"cannot remove {path}: {exc}", reason="cleanup-failed") from exc
        return True

    def check(self) -> None:
        """Check the configuration at start: every checkout, git and the root.

        Raises ``ConfigError`` with a one-line message naming the fix when git is not on PATH, a
        ``--checkout`` path does not exist, is not a git work tree or has no remote of its
        repository, or the directory trees go in cannot be created or written.
        """
        if (self._configured or self._root is not None) and shutil.which(GIT) is None:
            raise ConfigError("git is not on PATH; install git to use --checkout or --workspace")
        for repository, path in sorted(self._configured.items()):
            check_checkout(self._git, repository=repository, path=path)
        if self._root is not None:
            check_writable(self._root, what="--workspace")
        elif self._configured:
            check_writable(self._worktrees, what="the worktrees directory")

    def _make(
        self, repository: str, path: Path, *, operator: Path | None, pull_request: int | None
    ) -> Checkout:
        partial = path.parent / PARTIAL_DIR / path.name
        if operator is None and self._strategy == "clone":
            shutil.rmtree(partial, ignore_errors=True)  # a leftover of a killed attempt
            try:
                self._clone(repository, partial, pull_request=pull_request)
                partial.rename(path)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
            return self._describe(path, strategy="clone")
        if operator is not None:
            source, strategy = operator, OPERATOR_WORKTREE
            start = self._git.commit_of(operator, "HEAD")
        else:
            source, strategy = self._fetch_shared(repository, pull_request), "worktree"
            start = self._start(source, pull_request)
        self._git.unregister(source, [partial, path])
        branch = _free_branch(path.name, self._git.checked_out(source))
        try:
            partial.parent.mkdir(parents=True, exist_ok=True)
            self._git.add_worktree(source, partial, branch=branch, start=start)
            self._git.out("worktree", "move", str(partial), str(path), cwd=source)
        except (RunnerError, OSError):
            try:
                self._git.unregister(source, [partial])
            finally:
                shutil.rmtree(partial, ignore_errors=True)
            raise
        return self._describe(path, strategy=strategy)

    def _fork_tree(
        self, repository: str, path: Path, *, pull_request: int, head: DispatchHead
    ) -> Checkout:
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise RunnerError(
                f"{path} exists and is not a directory; move it away", reason="workspace-failed"
            )
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()
        assert self._root is not None  # a pull request is refused earlier without a root
        made = prepare_fork_tree(
            self._git,
            path=path,
            partial=path.parent / PARTIAL_DIR / path.name,
            url=self._url(repository),
            pull_request=pull_request,
            head=head,
            quarantine=quarantine_dir(self._root, path.name),
        )
        branch, commit = self._git.head(path)
        return Checkout(
            path,
            True,
            FORK_CLONE,
            branch=branch,
            commit=commit,
            reused=made.reused,
            trusted=False,
            restored=made.restored,
            kept=made.kept,
        )

    def _existing(self, path: Path) -> Checkout | None:
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise RunnerError(
                f"{path} exists and is not a directory; move it away", reason="workspace-failed"
            )
        if not path.exists():
            return None
        if not any(path.iterdir()):
            path.rmdir()  # an empty directory (an earlier agent's placeholder) holds nothing
            return None
        if self._git.toplevel(path) != path.resolve():
            raise RunnerError(
                f"{path} exists but is not a git work tree; move it away", reason="workspace-failed"
            )
        return self._describe(path, strategy=self._strategy_of(path), reused=True)

    def _fetch_shared(self, repository: str, pull_request: int | None) -> Path:
        shared = self._shared_path(repository)
        refspecs = [BRANCHES, *_pull_refspec(pull_request)]
        if shared.exists():
            reset_clone(shared, url=self._url(repository), bare=True)  # what a session planted
            self._git.out("fetch", "--quiet", "--prune", "origin", *refspecs, cwd=shared)
            return shared
        # Made aside and moved into place whole, so a killed fetch leaves no clone without refs.
        partial = shared.with_name(shared.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._git.out("init", "--quiet", "--bare", str(partial), cwd=None)
            reset_clone(partial, url=self._url(repository), bare=True)  # no template hooks
            self._git.out("fetch", "--quiet", "origin", *refspecs, cwd=partial)
            partial.rename(shared)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return shared

    def _clone(self, repository: str, partial: Path, *, pull_request: int | None) -> None:
        partial.parent.mkdir(parents=True, exist_ok=True)
        url = self._url(repository)
        self._git.out("clone", "--quiet", "--no-checkout", "--", url, str(partial), cwd=None)
        if pull_request:
            self._git.out("fetch", "--quiet", "origin", *_pull_refspec(pull_request), cwd=partial)
        start = self._start(partial, pull_request)
        self._git.out("checkout", "--quiet", "--no-track", "-b", partial.name, start, cwd=partial)

    def _start(self, repo: Path, pull_request: int | None) -> str:
        if pull_request:
            return self._git.commit_of(repo, f"refs/pull/{pull_request}/head")
        return self._git.default_tip(repo)

    def _remove_worktree(self, path: Path) -> None:
        gitdir = Path((path / ".git").read_text(encoding="utf-8").removeprefix("gitdir:").strip())
        if not (path / gitdir).exists():
            return  # its repository is gone (deleted by hand): rm -rf is all that is left
        common = self._git.common_dir(path)
        shared = self._in_repos(common)
        with self._lock(common if shared else path):
            self._git.out("worktree", "remove", "--force", str(path), cwd=common)
            if shared:  # never in an operator checkout: its other worktrees are not ours
                self._git.out("worktree", "prune", cwd=common)
                # What the session could have planted in the shared git directory goes too.
                reset_clone(common, url=self._url(f"{common.parent.name}/{common.stem}"), bare=True)

    def _removable(self, path: Path) -> bool:
        if path.is_symlink() or not path.is_dir() or not SESSION_NAME.fullmatch(path.name):
            return False
        bases = {base.resolve() for base in (self._root, self._worktrees) if base is not None}
        resolved = path.resolve()
        if resolved.parent not in bases:
            return False
        return not any(
            resolved == c.resolve() or c.resolve().is_relative_to(resolved)
            for c in self._configured.values()
        )

    def _describe(self, path: Path, *, strategy: str, reused: bool = False) -> Checkout:
        branch, commit = self._git.head(path)
        return Checkout(path, True, strategy, branch=branch, commit=commit, reused=reused)

    def _strategy_of(self, path: Path) -> str:
        if (path / ".git").is_dir():
            return "clone"
        return "worktree" if self._in_repos(self._git.common_dir(path)) else OPERATOR_WORKTREE

    def _in_repos(self, repo: Path) -> bool:
        return self._root is not None and repo.is_relative_to((self._root / REPOS_DIR).resolve())

    def _url(self, repository: str) -> str:
        return clone_url(repository, protocol=self._protocol, host=self._host)

    def _shared_path(self, repository: str) -> Path:
        owner, name = repository.lower().split("/")
        return (self._root or self._worktrees) / REPOS_DIR / owner / f"{name}.git"

    def _lock(self, key: Path) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key.resolve(), threading.Lock())


def _check_repository(repository: str) -> None:
    if not _REPOSITORY.fullmatch(repository) or any(
        part in (".", "..") for part in repository.split("/")
    ):
        raise RunnerError(
            f"repository {repository[:200]!r} is not owner/repo", reason="invalid-dispatch"
        )


def _pull_refspec(pull_request: int | None) -> list[str]:
    # GitHub keeps every PR's head, a fork's too, in the base repository under refs/pull/N/head.
    if not pull_request:
        return []
    return [f"+refs/pull/{pull_request}/head:refs/pull/{pull_request}/head"]


def _free_branch(name: str, taken: set[str]) -> str:
    # Another runner's tree of the same session (one operator checkout, two state directories)
    # may hold the name; git lets a branch be checked out in one worktree only.
    suffixed = (f"{name}-{n}" for n in itertools.count(2))
    return name if name not in taken else next(b for b in suffixed if b not in taken)


def _no_tree(repository: str, pull_request: int | None) -> str:
    if pull_request:
        return "a pull-request session needs a tree of its own; start the runner with --workspace"
    return f"no checkout of {repository} here; add --checkout {repository}=PATH or --workspace"
