"""Pull request heads with arbitrary trees (nested paths, symlinks) in an offline GitHub.

:func:`push_tree` commits files and links on top of a ref of the base repository through a
scratch clone and pushes the commit where GitHub would keep it, e.g. ``refs/pull/N/head``.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from tests.gitrepos import GITHUB_HTTPS, GitRepos, git

BASE_SETTINGS = '{"permissions": {"allow": ["Bash(ls)"]}}\n'
BASE_CLAUDE_MD = "# Base instructions\n"


def push_tree(
    repos: GitRepos,
    scratch: Path,
    *,
    to: str,
    on: str = "refs/heads/main",
    files: Mapping[str, str] | None = None,
    links: Mapping[str, str] | None = None,
    delete: tuple[str, ...] = (),
    repository: str = "octo/repo",
) -> str:
    """Commit ``files`` (path -> text), ``links`` (path -> target) and the removal of
    ``delete`` on top of ``on`` and push the commit to ``to`` in ``repository``; return it."""
    shutil.rmtree(scratch, ignore_errors=True)
    git("clone", "--quiet", "--no-checkout", f"{GITHUB_HTTPS}{repository}.git", str(scratch))
    git("fetch", "--quiet", "origin", f"+{on}:refs/scratch/on", cwd=scratch)
    git("checkout", "--quiet", "--force", "refs/scratch/on", cwd=scratch)
    for path in delete:
        git("rm", "-r", "--quiet", path, cwd=scratch)
    for path, text in (files or {}).items():
        (scratch / path).parent.mkdir(parents=True, exist_ok=True)
        (scratch / path).write_text(text, encoding="utf-8")
    for path, target in (links or {}).items():
        (scratch / path).parent.mkdir(parents=True, exist_ok=True)
        (scratch / path).symlink_to(target)
    git("add", "-A", cwd=scratch)
    git("commit", "--quiet", "--allow-empty", "-m", f"commit for {to}", cwd=scratch)
    git("push", "--quiet", "--force", str(repos.bare(repository)), f"HEAD:{to}", cwd=scratch)
    return git("rev-parse", "HEAD", cwd=scratch)


def base_with_config(repos: GitRepos, scratch: Path) -> str:
    """Give ``octo/repo``'s main a ``.claude/settings.json`` and a ``CLAUDE.md``; return it."""
    files = {".claude/settings.json": BASE_SETTINGS, "CLAUDE.md": BASE_CLAUDE_MD}
    return push_tree(repos, scratch, to="refs/heads/main", files=files)
