"""Agent config in an untrusted tree: the base's versions in, the pull request's kept aside.

A fork's head may carry files that a harness reads as its own configuration and acts on before
anyone looks: Claude's ``.claude/settings.json`` (hooks, ``env`` such as
``ANTHROPIC_BASE_URL``), ``.mcp.json`` servers, ``CLAUDE.md`` instructions, and the like for
other harnesses and tools. Before any harness starts in such a tree, every path
:func:`is_agent_config` names is made the base's version, or removed when the base has none
(the same idea as claude-code-action's ``restore-config.ts``, over a longer list).

Layout, under ``<root>/.untrusted-config/<session>/`` (outside every tree, never executable):
  - ``base/`` + ``base.json``: the base branch's agent-config files (content, and the mode
    to restore), taken once, from the clone's objects right after its first fetch, before any
    session code ran; later restores use this copy, as the tree's own object store is the
    session's to rewrite;
  - ``pr-<sha>/`` + ``pr-<sha>.json``: the pull request's versions at each approved ``sha``, as
    checked out, kept for review (files 0600; a symlink is listed in the JSON, not made).

Nothing here follows a symlink of the tree: it is walked without following links, a link on a
protected path (or on the way to one, as ``.github -> elsewhere``) is removed itself, and files
are written through directory descriptors opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from looprelay.agent import harnesses
from looprelay.agent.git import Git

OTHER_TOOLS_ROOT_PATHS = (
    # harnesses looprelay does not host (Windsurf, Cline, Roo, Continue, Aider, Amazon Q, Junie,
    # opencode), and editors' MCP config
    ".vscode/mcp.json",
    ".windsurf",
    ".windsurfrules",
    ".clinerules",
    ".roo",
    ".roomodes",
    ".continue",
    ".aider.conf.yml",
    ".amazonq",
    ".junie",
    ".opencode",
    "opencode.json",
    # tools a harness runs on the operator's behalf: git submodules, husky hooks, ripgrep, bun
    ".gitmodules",
    ".husky",
    ".ripgreprc",
    "bunfig.toml",
)
ROOT_PATHS = tuple(
    dict.fromkeys(
        [*(p for h in harnesses.REGISTRY.values() for p in h.config_paths), *OTHER_TOOLS_ROOT_PATHS]
    )
)
"""Agent-config paths at the tree's root (a directory with everything below it): each hosted
harness's own (its module lists them) and other tools'."""
ANY_DEPTH_NAMES = tuple(
    dict.fromkeys([n for h in harnesses.REGISTRY.values() for n in h.config_names])
)
"""Names that are agent config at any depth: Claude loads nested ``CLAUDE.md`` files and
nested ``.claude/`` skills, and the other harnesses do the like for their instruction files."""
QUARANTINE_DIR = ".untrusted-config"
FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
_SYMLINK_HOPS = 8


def is_agent_config(relative: str) -> bool:
    """Tell whether the tree path ``relative`` (``/``-separated) is agent config or below it."""
    parts = relative.split("/")
    if any(part in ANY_DEPTH_NAMES for part in parts):
        return True
    return any(relative == root or relative.startswith(root + "/") for root in ROOT_PATHS)


def _leads_to_agent_config(relative: str) -> bool:
    # ".github" leads to ".github/copilot-instructions.md": a link there must go too.
    return any(root.startswith(relative + "/") for root in ROOT_PATHS)


@dataclass(frozen=True)
class Restored:
    """What :func:`restore_agent_config` did to a tree: paths (``/``-separated) it made the
    base's (``replaced``), removed (the base has none) or added (only the base had them), and
    ``kept_at``, where the pull request's own versions are."""

    replaced: tuple[str, ...]
    removed: tuple[str, ...]
    added: tuple[str, ...]
    kept_at: Path

    def changed(self) -> bool:
        """Whether the tree differed from the base's agent config at all."""
        return bool(self.replaced or self.removed or self.added)


def quarantine_dir(root: Path, session_name: str) -> Path:
    """Where a session's base snapshot and the pull request's versions are kept."""
    return root / QUARANTINE_DIR / session_name


def snapshot_base(git: Git, repo: Path, *, base: str, into: Path) -> None:
    """Copy commit ``base``'s agent-config files out of ``repo`` into ``into/base`` once.

    A symlink in the base is copied as the file it names in the base (so a restored
    ``CLAUDE.md -> AGENTS.md`` cannot read the head's ``AGENTS.md``); one naming nothing in the
    base is left out. Does nothing when ``into/base.json`` exists. Raises ``RunnerError``
    ``workspace-failed`` when git fails, ``OSError`` when ``into`` cannot be written.
    """
    manifest = into / "base.json"
    if manifest.exists():
        return
    entries = _tree(git, repo, base)
    target, modes = into / "base", {}
    shutil.rmtree(target, ignore_errors=True)
    for path in sorted(entries):
        resolved = _follow(git, repo, entries, path) if is_agent_config(path) else None
        if resolved is None:
            continue
        mode, blob = entries[resolved]
        _write_new(target, path, git.out_bytes("cat-file", "blob", blob, cwd=repo))
        modes[path] = 0o755 if mode == "100755" else 0o644
    into.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    manifest.write_text(json.dumps(modes, indent=1, sort_keys=True), encoding="utf-8")


def restore_agent_config(tree: Path, *, into: Path, sha: str) -> Restored:
    """Make every agent-config path of ``tree`` the base's (from :func:`snapshot_base`).

    First keeps the tree's own versions in ``into/pr-<sha>`` (once per ``sha``: on a respawn
    the tree already holds the base's), then removes each agent-config file or link that is
    not byte-for-byte the base's, then writes the base's that are missing. Raises ``OSError``
    when the tree or ``into`` cannot be read or written, ``ValueError`` when ``into`` holds
    no base snapshot.
    """
    base = json.loads((into / "base.json").read_text(encoding="utf-8"))
    if not isinstance(base, dict):
        raise ValueError(f"{into / 'base.json'} is not a JSON object")
    found = dict(_agent_config_entries(tree))
    kept = into / f"pr-{sha}"
    if not (into / f"pr-{sha}.json").exists():
        _keep(tree, found, kept)
    unchanged = {
        path
        for path, kind in found.items()
        if kind == "file" and path in base and _same(tree, into / "base", path, base[path])
    }
    for path in sorted(set(found) - unchanged, reverse=True):
        _unlink(tree / path)
    for path in sorted(set(base) - unchanged):
        content = (into / "base" / path).read_bytes()
        _write_tree(tree, path, content, mode=int(base[path]))
    changed = set(found) - unchanged
    return Restored(
        replaced=tuple(sorted(p for p in changed if p in base)),
        removed=tuple(sorted(p for p in changed if p not in base)),
        added=tuple(sorted(set(base) - set(found))),
        kept_at=kept,
    )


def _tree(git: Git, repo: Path, commit: str) -> dict[str, tuple[str, str]]:
    listed = git.out_bytes("ls-tree", "-r", "-z", "--full-tree", commit, cwd=repo)
    entries: dict[str, tuple[str, str]] = {}
    for record in listed.split(b"\0"):
        if not record:
            continue
        meta, _, name = record.partition(b"\t")
        mode, kind, blob = meta.decode("ascii").split()
        if kind == "blob":
            entries[name.decode("utf-8", "surrogateescape")] = (mode, blob)
    return entries


def _follow(git: Git, repo: Path, entries: dict[str, tuple[str, str]], path: str) -> str | None:
    # A symlink's target, resolved inside the commit relative to the link's directory; None
    # for one that leaves the tree, names nothing, or loops.
    for _ in range(_SYMLINK_HOPS):
        mode, blob = entries[path]
        if mode != "120000":
            return path
        target = git.out_bytes("cat-file", "blob", blob, cwd=repo).decode("utf-8", "replace")
        path = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if target.startswith("/") or path.startswith("../") or path not in entries:
            return None
    return None


def _agent_config_entries(tree: Path) -> Iterator[tuple[str, str]]:
    # (relative path, "file" | "link" | "other") for every non-directory agent-config entry,
    # and for each link on the way to one; the walk never follows a link.
    for directory, dirs, files in os.walk(tree):
        here = Path(directory).relative_to(tree).as_posix()
        if here == ".":
            dirs[:] = [d for d in dirs if d != ".git"]
        for name in [*dirs, *files]:
            if here == "." and name == ".git":
                continue
            relative = name if here == "." else f"{here}/{name}"
            info = os.lstat(tree / relative)
            if stat.S_ISDIR(info.st_mode):
                continue
            link = stat.S_ISLNK(info.st_mode)
            if is_agent_config(relative) or (link and _leads_to_agent_config(relative)):
                kind = "link" if link else "file" if stat.S_ISREG(info.st_mode) else "other"
                yield relative, kind


def _keep(tree: Path, found: dict[str, str], kept: Path) -> None:
    # The head's versions, for review: regular files copied (0600), links only listed.
    shutil.rmtree(kept, ignore_errors=True)
    listing: dict[str, str] = {}
    for path, kind in sorted(found.items()):
        if kind == "file":
            _write_new(kept, path, _read_no_follow(tree / path))
            listing[path] = "file"
        elif kind == "link":
            listing[path] = f"symlink to {os.readlink(tree / path)}"
        else:
            listing[path] = "not a regular file; not kept"
    kept.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    manifest = kept.with_name(kept.name + ".json")
    manifest.write_text(json.dumps(listing, indent=1, sort_keys=True), encoding="utf-8")
    manifest.chmod(FILE_MODE)


def _same(tree: Path, base_dir: Path, path: str, mode: object) -> bool:
    info = os.lstat(tree / path)
    wanted_exec = mode == 0o755
    if bool(info.st_mode & stat.S_IXUSR) != wanted_exec:
        return False
    return _read_no_follow(tree / path) == (base_dir / path).read_bytes()


def _read_no_follow(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def _unlink(path: Path) -> None:
    # Found by a walk that follows no link, so every parent is a real directory of the tree.
    path.unlink(missing_ok=True)


def _write_new(root: Path, relative: str, content: bytes) -> None:
    # Into a directory of the runner's own (a snapshot or the kept versions): private, inert.
    target = root / relative
    target.parent.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    root.chmod(DIRECTORY_MODE)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)


def _write_tree(tree: Path, relative: str, content: bytes, *, mode: int) -> None:
    # Walks down with O_NOFOLLOW: a link (or file) in the way of a base path is removed, so a
    # symlinked parent can never take the write outside the tree.
    *parents, name = relative.split("/")
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parents:
            child = _child_directory(fd, part)
            os.close(fd)
            fd = child
        with suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(name, flags, mode, dir_fd=fd), "wb") as handle:
            handle.write(content)
    finally:
        os.close(fd)


def _child_directory(fd: int, name: str) -> int:
    # The child directory's descriptor; a link or a file in its place is replaced by one.
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(name, dir_fd=fd)
    os.mkdir(name, 0o755, dir_fd=fd)
    return os.open(name, flags, dir_fd=fd)
