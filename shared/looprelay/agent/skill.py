"""The loop's skill, installed into a directory sessions start in, where the harness reads it.

The artifact-iteration rule and the channel rule live in the skill, so they bind
every session, a hand-started one included; the daemon prompt only restates them in one line.
Claude Code finds a project skill at ``<cwd>/.claude/skills/<name>/SKILL.md``; Codex, Gemini
CLI and Copilot CLI read the same ``SKILL.md`` format from ``<cwd>/.agents/skills/<name>/``
(each harness module names its folder).

The skill directory carries a ``.gitignore`` holding ``*``, so it ignores itself: ``git status``
of the checkout stays clean, with no change to the repository's own ignore files or git config.
The checkout may be a stranger's repository, so nothing is written through a symlink: the path
is walked one directory at a time with ``O_NOFOLLOW`` on descriptors, and a link anywhere below
the given directory is refused.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from importlib import resources
from pathlib import Path

from looprelay.errors import RunnerError

SKILL_NAME = "looprelay"
CLAUDE_SKILLS = (".claude", "skills")
SKILL_PATH = (*CLAUDE_SKILLS, SKILL_NAME)
"""Where Claude's copy of the skill goes, below the directory a session starts in."""
SKILL_FILES = ("SKILL.md", "reference/collaboration.md")
"""The package data of ``looprelay.skill`` that make up the skill."""
GITIGNORE = ".gitignore"
SELF_IGNORE = b"*\n"
FILE_MODE = 0o644
DIRECTORY_MODE = 0o755
SKILL_FAILED = "skill-failed"


def skill_files() -> dict[str, bytes]:
    """Return the skill's files, relative path to content, ``.gitignore`` first.

    The ignore file comes first so an install cut short never leaves visible files behind.
    Raises ``RunnerError`` ``skill-failed`` when the package data is missing (a broken install).
    """
    package = resources.files("looprelay.skill")
    files = {GITIGNORE: SELF_IGNORE}
    for name in SKILL_FILES:
        try:
            files[name] = package.joinpath(name).read_bytes()
        except OSError as exc:
            raise RunnerError(
                f"the skill file {name} is missing from the looprelay package; reinstall it",
                reason=SKILL_FAILED,
            ) from exc
    return files


def install_skill(directory: Path, skills: tuple[str, ...] = CLAUDE_SKILLS) -> list[Path]:
    """Write the skill into ``<directory>/<skills>/looprelay/``; return the files written.

    Expects an existing directory (a symlink to one is fine). Files whose content is already
    right are not rewritten, so a second install returns ``[]``. Each file is replaced
    atomically (a temp file beside it, then rename). Raises ``RunnerError`` ``skill-failed``
    when ``directory`` is not a directory, when a path component below it is a symlink or not
    a directory, when a skill file is a symlink or not a regular file, or when a write fails.
    """
    root, path = directory.resolve(), (*skills, SKILL_NAME)
    written: list[Path] = []
    for name, content in skill_files().items():
        *parents, file_name = name.split("/")
        shown = root.joinpath(*path, name)
        with _walk(root, [*path, *parents]) as fd:
            if _current(fd, file_name, shown) != content:
                _replace(fd, file_name, content, shown)
                written.append(shown)
    return written


def skill_directory(directory: Path, skills: tuple[str, ...] = CLAUDE_SKILLS) -> Path:
    """Return where :func:`install_skill` puts the skill for ``directory``. Never raises."""
    return directory.resolve().joinpath(*skills, SKILL_NAME)


@contextmanager
def _walk(root: Path, parts: list[str]) -> Iterator[int]:
    """Yield a descriptor of ``root/<parts>``, creating directories, following no link."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        why = f"{root} is not a directory ({exc.strerror})"
        raise RunnerError(why, reason=SKILL_FAILED) from exc
    try:
        for index, part in enumerate(parts):
            shown = root.joinpath(*parts[: index + 1])
            try:
                os.mkdir(part, DIRECTORY_MODE, dir_fd=fd)
            except FileExistsError:
                pass  # opened below without following a link, so whatever is there is checked
            except OSError as exc:
                raise RunnerError(f"cannot create {shown}: {exc}", reason=SKILL_FAILED) from exc
            child = _open_directory(part, fd, shown)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_directory(name: str, parent: int, shown: Path) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as exc:
        raise _refusal(exc, parent, name, shown, "a directory") from exc


def _current(parent: int, name: str, shown: Path) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refusal(exc, parent, name, shown, "a regular file") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        why = f"{shown} is not a regular file: remove it, then install again"
        raise RunnerError(why, reason=SKILL_FAILED)
    with os.fdopen(fd, "rb") as stream:
        return stream.read()


def _replace(parent: int, name: str, content: bytes, shown: Path) -> None:
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        with os.fdopen(os.open(temp, flags, FILE_MODE, dir_fd=parent), "wb") as stream:
            stream.write(content)
        os.replace(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except OSError as exc:
        with suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=parent)
        raise RunnerError(f"cannot write {shown}: {exc}", reason=SKILL_FAILED) from exc


def _refusal(exc: OSError, parent: int, name: str, shown: Path, wanted: str) -> RunnerError:
    # O_NOFOLLOW reports a link as ELOOP, or as ENOTDIR together with O_DIRECTORY: ask lstat.
    try:
        is_link = stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        is_link = False
    if is_link:
        why = "is a symlink, and looprelay writes through no link in a checkout"
    elif exc.errno in (errno.ENOTDIR, errno.EISDIR, errno.ELOOP):
        why = f"is not {wanted}"
    else:
        why = f"cannot be opened ({exc.strerror})"
    return RunnerError(f"{shown} {why}: remove it, then install again", reason=SKILL_FAILED)
