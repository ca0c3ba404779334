"""Local bare repositories that stand in for GitHub, offline, through git's own ``insteadOf``.

:func:`offline_github` lays out ``<base>/<owner>/<repo>.git`` under a test's directory and a
global git config that rewrites ``https://github.com/`` and ``git@github.com:`` to ``<base>/``, so
code under test builds real GitHub URLs and git clones from the local copies. The environment it
sets (``GIT_CONFIG_GLOBAL``, ``GIT_CONFIG_NOSYSTEM``, an author and committer) is inherited by
every git the test starts, a ``looprelay runner run`` process included.

Usage::

    repos = offline_github(tmp_path, monkeypatch)
    main = repos.create("octo/repo")                  # a commit on main, HEAD -> main
    head = repos.add_pull_request("octo/repo", 7)     # refs/pull/7/head in the base repository
    fork = repos.add_pull_request("octo/repo", 8, fork="someone/repo")
    checkout = repos.clone("octo/repo", tmp_path / "checkout")   # an operator's checkout
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

GITHUB_HTTPS = "https://github.com/"
GITHUB_SSH = "git@github.com:"
IDENTITY = {
    "GIT_AUTHOR_NAME": "Loop Tester",
    "GIT_AUTHOR_EMAIL": "tester@example.com",
    "GIT_COMMITTER_NAME": "Loop Tester",
    "GIT_COMMITTER_EMAIL": "tester@example.com",
}
GIT_TIMEOUT_SECONDS = 60.0


def git(*args: str, cwd: Path | None = None, stdin: str | None = None) -> str:
    """Run git in the current environment and return its stdout, stripped; fail loudly."""
    done = subprocess.run(
        ["git", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


@dataclass(frozen=True)
class GitRepos:
    """Bare repositories under ``base`` that ``https://github.com/`` resolves to.

    ``env`` is what :func:`offline_github` puts into the environment; the methods assume it is.
    """

    base: Path
    env: Mapping[str, str]

    def bare(self, repository: str) -> Path:
        """The bare repository that stands for ``owner/repo``."""
        return self.base / f"{repository}.git"

    def create(
        self, repository: str = "octo/repo", *, files: Mapping[str, str] | None = None
    ) -> str:
        """Make ``owner/repo`` with one commit on ``main`` (HEAD -> main); return the commit."""
        bare = self.bare(repository)
        bare.parent.mkdir(parents=True, exist_ok=True)
        git("init", "--quiet", "--bare", "--initial-branch=main", str(bare))
        content = files or {"README.md": f"# {repository}\n"}
        return self.commit(repository, files=content, message="initial commit")

    def commit(
        self,
        repository: str,
        *,
        files: Mapping[str, str],
        message: str = "a change",
        ref: str = "refs/heads/main",
    ) -> str:
        """Commit ``files`` (path -> text, top level) on top of ``ref`` and move ``ref`` there.

        The tree holds the parent's files plus ``files``. Returns the new commit.
        """
        bare = self.bare(repository)
        parent = _resolve(bare, ref)
        entries = _tree_entries(bare, parent)
        for name, text in files.items():
            blob = git("hash-object", "-w", "--stdin", cwd=bare, stdin=text)
            entries[name] = f"100644 blob {blob}\t{name}"
        tree = git("mktree", cwd=bare, stdin="\n".join(entries.values()) + "\n")
        parents = ["-p", parent] if parent else []
        commit = git("commit-tree", tree, *parents, "-m", message, cwd=bare)
        git("update-ref", ref, commit, cwd=bare)
        return commit

    def add_pull_request(
        self, repository: str, number: int, *, fork: str | None = None, branch: str = "topic"
    ) -> str:
        """Add pull request ``number`` to ``repository``; return its head commit.

        The head is a commit on top of ``main`` holding ``pr-<number>.txt``. With ``fork``, the
        commit is made in the fork's own bare repository (created from the base when missing)
        and pushed into the base as ``refs/pull/<number>/head``, as GitHub stores a fork's PR;
        the base never has the fork's branch.
        """
        origin = fork or repository
        if fork is not None and not self.bare(fork).exists():
            self.bare(fork).parent.mkdir(parents=True, exist_ok=True)
            git("clone", "--quiet", "--bare", str(self.bare(repository)), str(self.bare(fork)))
        ref = f"refs/heads/{branch}-{number}"
        git(
            "update-ref", ref, _resolve(self.bare(origin), "refs/heads/main"), cwd=self.bare(origin)
        )
        head = self.commit(origin, files={f"pr-{number}.txt": f"pull request {number}\n"}, ref=ref)
        pull = f"refs/pull/{number}/head"
        if fork is None:
            git("update-ref", pull, head, cwd=self.bare(repository))
        else:
            git(
                "push", "--quiet", str(self.bare(repository)), f"{head}:{pull}", cwd=self.bare(fork)
            )
        return head

    def tip(self, repository: str, ref: str = "refs/heads/main") -> str:
        """The commit ``ref`` names in ``repository``'s bare repository."""
        return git("rev-parse", "--verify", f"{ref}^{{commit}}", cwd=self.bare(repository))

    def clone(self, repository: str, path: Path) -> Path:
        """Clone ``repository`` by its GitHub URL to ``path``, as an operator would; return it."""
        git("clone", "--quiet", f"{GITHUB_HTTPS}{repository}.git", str(path))
        return path


def offline_github(directory: Path, monkeypatch: pytest.MonkeyPatch) -> GitRepos:
    """Make an offline GitHub under ``directory`` and point git at it through the environment.

    Writes ``directory/gitconfig`` (``insteadOf`` for https and ssh GitHub URLs, ``main`` as the
    default branch) and sets ``GIT_CONFIG_GLOBAL`` to it, ``GIT_CONFIG_NOSYSTEM=1`` and an
    author and committer with ``monkeypatch``, so the developer's own git config never leaks in.
    """
    base = directory / "github"
    base.mkdir(parents=True, exist_ok=True)
    config = directory / "gitconfig"
    config.write_text(
        f'[url "{base}/"]\n'
        f"\tinsteadOf = {GITHUB_HTTPS}\n"
        f"\tinsteadOf = {GITHUB_SSH}\n"
        "[init]\n\tdefaultBranch = main\n"
        "[advice]\n\tdetachedHead = false\n",
        encoding="utf-8",
    )
    env = {"GIT_CONFIG_GLOBAL": str(config), "GIT_CONFIG_NOSYSTEM": "1", **IDENTITY}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return GitRepos(base=base, env=env)


def snapshot(checkout: Path) -> dict[str, object]:
    """What an operator would notice of a checkout: HEAD, its branch, status, index, config and
    refs (but the ``loop-*`` branches that ``git worktree add`` makes for sessions)."""
    git_dir = Path(git("rev-parse", "--absolute-git-dir", cwd=checkout))
    refs = git("for-each-ref", "--format=%(refname) %(objectname)", cwd=checkout).splitlines()
    return {
        "head": git("rev-parse", "HEAD", cwd=checkout),
        "branch": git("symbolic-ref", "--quiet", "HEAD", cwd=checkout),
        "status": git("status", "--porcelain=v1", "--untracked-files=all", cwd=checkout),
        "index": git("ls-files", "--stage", cwd=checkout),
        "config": (git_dir / "config").read_text(encoding="utf-8"),
        "refs": [ref for ref in refs if not ref.startswith("refs/heads/loop-")],
    }


def _resolve(bare: Path, ref: str) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        cwd=bare,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_SECONDS,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def _tree_entries(bare: Path, commit: str) -> dict[str, str]:
    if not commit:
        return {}
    listed = git("ls-tree", commit, cwd=bare).splitlines()
    return {line.split("\t", 1)[1]: line for line in listed}


def operator_checkout(path: Path, repository: str) -> Path:
    """Make ``path`` an operator's checkout of ``repository`` without any network or bare
    copy: one commit on ``main`` and ``origin`` naming the GitHub URL. Enough for a runner whose
    sessions get worktrees of it (``git worktree add`` needs no fetch)."""
    path.mkdir(parents=True, exist_ok=True)
    identity = ["-c", "user.name=Loop Tester", "-c", "user.email=tester@example.com"]
    git("init", "--quiet", "--initial-branch=main", str(path))
    (path / "README.md").write_text(f"# {repository}\n", encoding="utf-8")
    git("add", "README.md", cwd=path)
    git(*identity, "commit", "--quiet", "-m", "initial commit", cwd=path)
    git("remote", "add", "origin", f"{GITHUB_HTTPS}{repository}.git", cwd=path)
    return path
