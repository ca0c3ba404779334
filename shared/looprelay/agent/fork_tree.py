"""An approved fork head's tree: a clone of its own, at exactly the approved commit.

A fork's pull request is untrusted (issue 21): its tree never shares an object store or a
config with the trees of trusted sessions, whatever ``--strategy`` says. It is a fresh
repository (``git init``, origin the base repository), fetching ``refs/pull/N/head`` and the
base branch from the base repository (where GitHub keeps a fork's head too), and checked out at
the approved ``sha`` on a branch named after the session. Every preparation then rewrites its
git config to the canonical one (:func:`looprelay.agent.git.reset_clone`) before any git runs
in it, and makes its agent config the base's (:mod:`looprelay.agent.agent_config`).

Scenario, for ``prepare_fork_tree(path, sha)``:
  - no tree at ``path``                -> a new clone at ``sha``; the base's agent config is
    copied aside (a snapshot) before any of the head's content is checked out;
  - a clone at ``sha``                 -> reused as is (a respawn keeps the session's work);
  - a clone at another commit          -> a newer approval: uncommitted work is stashed, a tip
    that ``sha`` does not contain is kept on ``<session>-at-<commit>``, then the session's
    branch is moved to ``sha``;
  - ``sha`` is no longer in the base   -> asked for by id; else ``fork-head-missing``;
  - anything else at ``path``          -> ``workspace-failed``, nothing touched.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from looprelay.agent.agent_config import Restored, restore_agent_config, snapshot_base
from looprelay.agent.git import Git, reset_clone
from looprelay.errors import RunnerError
from looprelay.wire.runner_api import DispatchHead

FORK_CLONE = "fork-clone"
STASH_IDENTITY = ("-c", "user.name=looprelay runner", "-c", "user.email=looprelay@localhost")
"""The stash of a moved tree is the runner's commit, whatever identity the operator has."""
_SHA = re.compile(r"[0-9a-f]{40}")
_BAD_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|^[-/.]|[/.]$|\.lock$|/\.")


@dataclass(frozen=True)
class ForkTree:
    """What :func:`prepare_fork_tree` did: ``reused`` an existing tree, ``kept`` the branch
    that holds the session's earlier commits (empty when none needed keeping), ``restored``
    the agent config it made the base's."""

    reused: bool
    kept: str
    restored: Restored


def tree_trusted(
    *, pull_request: int | None, head: DispatchHead | None, fork_sessions: bool
) -> bool:
    """Tell whether a session's tree is trusted: True for a work item's session and a
    same-repository pull request, False for a fork's.

    Raises ``RunnerError``: ``invalid-dispatch`` for a pull request without a head (a server
    older than this agent), a work item with a fork head or a fork head without a full commit
    id and base branch (:func:`check_fork_head`); ``fork-sessions-off`` for a fork head when
    ``fork_sessions`` is False.
    """
    if pull_request is None:
        if head is not None and head.fork:
            raise RunnerError("a work item's session has a fork head", reason="invalid-dispatch")
        return True
    if head is None:
        raise RunnerError(
            "the dispatch of a pull request session carries no head (fork or not): the "
            "server is older than this runner agent; upgrade the server",
            reason="invalid-dispatch",
        )
    if not head.fork:
        return True
    if not fork_sessions:
        raise RunnerError(
            "this runner serves no fork pull requests (--no-fork-sessions)",
            reason="fork-sessions-off",
        )
    check_fork_head(head)
    return False


def check_fork_head(head: DispatchHead) -> None:
    """Check a fork head names a full commit id and a branch; raise ``RunnerError``
    ``invalid-dispatch`` when it does not (no tree is made from a guess)."""
    if not _SHA.fullmatch(head.sha):
        raise RunnerError(
            "a fork's pull request head carries no approved 40-hex commit; refusing it",
            reason="invalid-dispatch",
        )
    if not head.base_ref or len(head.base_ref) > 255 or _BAD_REF.search(head.base_ref):
        raise RunnerError(
            f"a fork's pull request base branch {head.base_ref[:80]!r} is not a branch name",
            reason="invalid-dispatch",
        )


def prepare_fork_tree(
    git: Git,
    *,
    path: Path,
    partial: Path,
    url: str,
    pull_request: int,
    head: DispatchHead,
    quarantine: Path,
) -> ForkTree:
    """Return ``path`` as the fork tree of the scenario above, its agent config the base's.

    Expects a checked head (:func:`check_fork_head`) and the caller to hold the path's lock.
    ``partial`` is where a new tree is made before it is moved into place; ``quarantine`` holds
    the base snapshot and the head's own versions. Raises ``RunnerError``: ``fork-head-missing``
    when the approved commit cannot be fetched, ``workspace-failed`` when git fails or ``path``
    is not such a tree; ``OSError`` when files cannot be written.
    """
    reused = path.exists()
    kept = ""
    if reused:
        git_dir = path / ".git"
        if git_dir.is_symlink() or not git_dir.is_dir():
            raise RunnerError(
                f"{path} is not a fork tree of its own (made by an older agent?); clean the "
                "session up to remove it",
                reason="workspace-failed",
            )
        if not (quarantine / "base.json").exists():
            raise RunnerError(
                f"{path} has no base snapshot in {quarantine}; clean the session up to remove it",
                reason="workspace-failed",
            )
        reset_clone(git_dir, url=url, bare=False)
        _fetch(git, path, pull_request=pull_request, head=head)
        kept = _move(git, path, sha=head.sha, branch=path.name)
    else:
        _make(git, partial, url=url, pull_request=pull_request, head=head, quarantine=quarantine)
        partial.rename(path)
    return ForkTree(reused, kept, restore_agent_config(path, into=quarantine, sha=head.sha))


def _make(
    git: Git, partial: Path, *, url: str, pull_request: int, head: DispatchHead, quarantine: Path
) -> None:
    shutil.rmtree(partial, ignore_errors=True)  # a leftover of a killed attempt
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        git.out("init", "--quiet", str(partial), cwd=None)
        reset_clone(partial / ".git", url=url, bare=False)  # no template hooks, no extras
        _fetch(git, partial, pull_request=pull_request, head=head)
        shutil.rmtree(quarantine / "base", ignore_errors=True)  # an earlier tree's snapshot
        (quarantine / "base.json").unlink(missing_ok=True)
        # Before the head's content is on disk, from objects just fetched from the base.
        base = f"refs/remotes/origin/{head.base_ref}"
        snapshot_base(git, partial, base=base, into=quarantine)
        git.out("checkout", "--quiet", "--no-track", "-b", partial.name, head.sha, cwd=partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _fetch(git: Git, repo: Path, *, pull_request: int, head: DispatchHead) -> None:
    # Forced refspecs: the base branch is what origin has now, whatever the session set.
    refspecs = (
        f"+refs/pull/{pull_request}/head:refs/pull/{pull_request}/head",
        f"+refs/heads/{head.base_ref}:refs/remotes/origin/{head.base_ref}",
    )
    git.out("fetch", "--quiet", "--no-tags", "origin", *refspecs, cwd=repo)
    if _has_commit(git, repo, head.sha):
        return
    # The head moved past the approved commit; GitHub serves a reachable commit by its id.
    fetched = git.run("fetch", "--quiet", "--no-tags", "origin", head.sha, cwd=repo)
    if fetched.code != 0 or not _has_commit(git, repo, head.sha):
        raise RunnerError(
            f"the approved head {head.sha} of pull request {pull_request} is no longer in the "
            "base repository (force-pushed away?); approve the pull request's current head",
            reason="fork-head-missing",
        )


def _has_commit(git: Git, repo: Path, sha: str) -> bool:
    return git.run("cat-file", "-e", f"{sha}^{{commit}}", cwd=repo).code == 0


def _move(git: Git, tree: Path, *, sha: str, branch: str) -> str:
    # Scenario "a clone at another commit": nothing the session made becomes unreachable.
    _, commit = git.head(tree)
    if commit == sha:
        return ""
    if git.out("status", "--porcelain", "--untracked-files=all", cwd=tree):
        message = f"looprelay: the session's work before moving to {sha}"
        git.out(*STASH_IDENTITY, "stash", "push", "--quiet", "--include-untracked", "-m",
                message, cwd=tree)  # fmt: skip
    kept = []
    listed = git.run("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", cwd=tree)
    for tip in dict.fromkeys([commit, listed.stdout.strip() if listed.code == 0 else ""]):
        if tip and git.run("merge-base", "--is-ancestor", tip, sha, cwd=tree).code != 0:
            kept.append(f"{branch}-at-{tip[:12]}")
            git.out("branch", "--force", "--no-track", kept[-1], tip, cwd=tree)
    git.out("checkout", "--quiet", "--force", "--no-track", "-B", branch, sha, cwd=tree)
    return ", ".join(kept)
