"""Merging into a config file another program also rewrites: locked, atomic, merge-only.

Made for Claude Code's config (see ``claude_config``), which a running Claude rewrites whenever
it likes, and used for every harness's own config file (JSON here; Codex's TOML through
:func:`edit_config_file`). A merge:
  - reads the file as a JSON object and applies a merge function to it; a missing file is ``{}``;
  - writes nothing when the merge changed nothing;
  - never writes over a file that does not parse as a JSON object (it is left byte-for-byte);
    leading ``//`` comment lines (Copilot CLI heads its config with them) are kept as they are;
  - keeps every other key and the key order, and the file's mode (0600 for a new file);
  - replaces the file atomically: a temp file in the same directory, fsync, ``os.replace``,
    fsync of the directory; a symlinked file is replaced at its target, the link is kept.

Writers are kept apart three ways: an flock on a sidecar file (``<name>.looprelay-lock``, kept)
serialises looprelay agents; an optional peer lock, a directory made with mkdir as
proper-lockfile does (Claude's own protocol), keeps a cooperating program out; and the file is
checked again right before the replace, for writers that take neither lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from looprelay.errors import RunnerError

JsonObject = dict[str, object]
Merge = Callable[[JsonObject], list[str]]
"""Changes a parsed object in place; returns what it changed (empty: nothing to write)."""
Edit = Callable[[str | None], tuple[str, list[str]]]
"""Given a file's text (None: no file), returns its new text and what changed (empty: nothing
to write). Raises ``RunnerError`` to leave the file as it is."""

NEW_FILE_MODE = 0o600
MERGE_ROUNDS = 5
"""How often a merge is redone when another writer changed the file under it."""
LOCK_WAIT_SECONDS = 15.0
"""Longest a merge waits for its locks; above the peer lock's stale age, so an abandoned peer
lock is taken over within it."""
PEER_LOCK_STALE_SECONDS = 10.0
"""proper-lockfile's default ``stale`` (the lock holder refreshes its mtime more often)."""
POLL_SECONDS = 0.02


@dataclass(frozen=True)
class _Stamp:
    """What tells one version of a file from the next, short of reading it."""

    ino: int
    size: int
    mtime_ns: int
    mode: int


@dataclass(frozen=True)
class _Snapshot:
    """The version of a file a merge started from."""

    stamp: _Stamp
    raw: bytes


def merge_json_file(path: Path, merge: Merge, *, peer_lock: Path | None, reason: str) -> list[str]:
    """Apply ``merge`` to the JSON object in ``path`` and write it back only if it changed.

    Expects ``merge`` to change the object in place and return what it changed, and
    ``peer_lock`` to be the lock directory a cooperating writer uses (None: none). Returns the
    merge's changes; ``[]`` when there were none, and then nothing was written. A missing file
    (and its directory, mode 0700) is created. Waits up to ``LOCK_WAIT_SECONDS`` for the locks
    and redoes the merge up to ``MERGE_ROUNDS`` times when another writer changed the file
    meanwhile. Raises ``RunnerError`` with ``reason`` when the file does not parse as a JSON
    object (left untouched), when ``merge`` raises it, or when the file cannot be read,
    locked or written.
    """

    def edit(current: str | None) -> tuple[str, list[str]]:
        header, data = ("", {}) if current is None else _parse_object(current, path, reason)
        changes = merge(data)
        return header + json.dumps(data, indent=2, ensure_ascii=False), changes  # Claude's layout

    return edit_config_file(path, edit, peer_lock=peer_lock, reason=reason)


def edit_config_file(path: Path, edit: Edit, *, peer_lock: Path | None, reason: str) -> list[str]:
    """Apply ``edit`` to the UTF-8 text of ``path`` and write the result only if it changed,
    under the same locks, rounds and atomic replace as :func:`merge_json_file`, which is this
    for JSON. Returns ``edit``'s changes. Raises ``RunnerError`` with ``reason`` when the file
    is not UTF-8 text or cannot be read, locked or written, and when ``edit`` raises it."""
    # Scenario, per round, under both locks:
    #   read the text (and its snapshot) -> edit; nothing changed -> done, no write;
    #   write a temp file beside it -> the file still matches the snapshot -> replace, done;
    #   it does not (a writer that takes no lock) -> drop the temp file, edit again.
    target = path.resolve()
    _make_parent(target, reason)
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    with (
        _agent_lock(target.with_name(f"{target.name}.looprelay-lock"), deadline, reason),
        _peer_lock(peer_lock, deadline, reason),
    ):
        for _ in range(MERGE_ROUNDS):
            snapshot = _read(target, reason)
            text, changes = edit(None if snapshot is None else _decoded(snapshot, target, reason))
            if not changes:
                return []
            if _replace_if_unchanged(target, text, snapshot, reason):
                return changes
    raise RunnerError(
        f"{target} kept changing while looprelay merged into it ({MERGE_ROUNDS} rounds); "
        "try again when the programs using it are idle",
        reason=reason,
    )


def _read(path: Path, reason: str) -> _Snapshot | None:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read
            raise RunnerError(f"{path} is not a regular file", reason=reason)
        with open(path, "rb") as handle:
            stamp = _stamp_of(os.fstat(handle.fileno()))
            return _Snapshot(stamp, handle.read())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunnerError(f"cannot read {path}: {exc}", reason=reason) from exc


def _decoded(snapshot: _Snapshot, path: Path, reason: str) -> str:
    try:
        return snapshot.raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise RunnerError(
            f"{path} is not UTF-8 text ({exc}); looprelay left it untouched: fix or remove it",
            reason=reason,
        ) from exc


def _parse_object(text: str, path: Path, reason: str) -> tuple[str, JsonObject]:
    """The leading ``//`` comment lines of ``text`` and the JSON object after them."""
    header, body = _comment_header(text)
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise RunnerError(
            f"{path} is not valid JSON ({exc}); looprelay left it untouched: fix or remove it",
            reason=reason,
        ) from exc
    if not isinstance(data, dict):
        raise RunnerError(
            f"{path} holds a JSON {type(data).__name__}, not an object; looprelay left it "
            "untouched: fix or remove it",
            reason=reason,
        )
    return header, data


def _comment_header(text: str) -> tuple[str, str]:
    """Split ``text`` into its leading ``//`` comment lines and the rest."""
    lines = text.splitlines(keepends=True)
    count = 0
    while count < len(lines) and lines[count].lstrip().startswith("//"):
        count += 1
    return "".join(lines[:count]), "".join(lines[count:])


def _replace_if_unchanged(path: Path, text: str, snapshot: _Snapshot | None, reason: str) -> bool:
    mode = NEW_FILE_MODE if snapshot is None else snapshot.stamp.mode
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise RunnerError(f"cannot write beside {path}: {exc}", reason=reason) from exc
    replaced = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        if not _unchanged(path, snapshot):
            return False
        # Residual window: a writer that takes neither lock and lands between the check above
        # and this replace loses its write. It is microseconds wide; Claude writes under the
        # peer lock held here.
        os.replace(temp, path)
        replaced = True
        _fsync_directory(path.parent)
    except OSError as exc:
        raise RunnerError(f"cannot write {path}: {exc}", reason=reason) from exc
    finally:
        if not replaced:
            with suppress(FileNotFoundError):
                os.unlink(temp)
    return True


def _unchanged(path: Path, snapshot: _Snapshot | None) -> bool:
    try:
        if snapshot is None:
            return not path.exists()
        # The bytes too: an in-place rewrite of the same size within one clock tick keeps the
        # inode, the size and the mtime.
        return _stamp_of(os.stat(path)) == snapshot.stamp and path.read_bytes() == snapshot.raw
    except FileNotFoundError:
        return False


@contextmanager
def _agent_lock(lock_file: Path, deadline: float, reason: str) -> Iterator[None]:
    # flock, not lockf: an flock belongs to the open file, so threads of one process serialise
    # too. The file stays: unlinking a lock file races with the next opener.
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, NEW_FILE_MODE)
    except OSError as exc:
        raise RunnerError(f"cannot open {lock_file}: {exc}", reason=reason) from exc
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                _wait_or_fail(deadline, f"another looprelay agent holds {lock_file}", reason)
        yield
    finally:
        os.close(fd)  # releases the flock


@contextmanager
def _peer_lock(lock_dir: Path | None, deadline: float, reason: str) -> Iterator[None]:
    # proper-lockfile's protocol: the lock is a directory made with mkdir, and one whose mtime
    # is older than the stale age was abandoned and may be taken over.
    while lock_dir is not None:
        try:
            os.mkdir(lock_dir, 0o700)
            break
        except FileExistsError:
            age = _age(lock_dir)
            if age is None:
                continue  # released meanwhile: take it, never remove what may be a new holder's
            if age > PEER_LOCK_STALE_SECONDS and _removed(lock_dir):
                continue
            why = f"{lock_dir} stays held; if no program is using it, remove it"
            _wait_or_fail(deadline, why, reason)
        except OSError as exc:
            raise RunnerError(f"cannot create {lock_dir}: {exc}", reason=reason) from exc
    try:
        yield
    finally:
        if lock_dir is not None:
            with suppress(OSError):
                os.rmdir(lock_dir)


def _age(lock_dir: Path) -> float | None:
    """Seconds since the lock was made or refreshed; None when it is gone."""
    try:
        return time.time() - os.stat(lock_dir).st_mtime
    except FileNotFoundError:
        return None


def _removed(lock_dir: Path) -> bool:
    try:
        os.rmdir(lock_dir)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # not ours to force (not empty, no permission): wait, then give up
    return True


def _wait_or_fail(deadline: float, why: str, reason: str) -> None:
    if time.monotonic() >= deadline:
        raise RunnerError(f"gave up after {LOCK_WAIT_SECONDS:g} s: {why}", reason=reason)
    time.sleep(POLL_SECONDS)


def _make_parent(path: Path, reason: str) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise RunnerError(f"cannot create {path.parent}: {exc}", reason=reason) from exc


def _stamp_of(status: os.stat_result) -> _Stamp:
    return _Stamp(status.st_ino, status.st_size, status.st_mtime_ns, stat.S_IMODE(status.st_mode))


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
