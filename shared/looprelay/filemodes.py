"""Private directories and files, the way ssh treats ``~/.ssh``: what holds comment bodies from
private repositories, or secrets, is reachable by its owner alone.

Files are created with an explicit mode instead of a process-wide ``umask(0o077)``: the umask
is shared by every thread of ``looprelay up``, and an explicit mode gives the same 0600 to
exactly the files meant. SQLite gives a database's ``-wal``, ``-shm`` and ``-journal`` files
the mode of the database file, so a private database file keeps its companions private too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from looprelay.errors import ConfigError

log = logging.getLogger("looprelay.files")

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_REACHABLE = 0o077
"""Group and world bits: any of them lets another user read, enter or change the path."""


def private_directory(path: Path, *, what: str) -> Path:
    """Create ``path`` with mode 0700, or make an existing directory private, and return it.

    An existing directory whose mode lets the group or others in is set to 0700 when this user
    owns it, and the change is logged. ``what`` names the directory in messages. Raises
    ``ConfigError`` when ``path`` is not a directory, belongs to another user, or cannot be
    created or tightened.
    """
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    except FileExistsError:
        pass  # something else is there: the check below names it
    except OSError as exc:
        raise ConfigError(f"cannot create the {what} {path}: {exc.strerror or exc}") from exc
    try:
        info = path.stat()
    except OSError as exc:  # a link to nowhere
        raise ConfigError(f"cannot use the {what} {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"the {what} {path} is not a directory; pass a directory")
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"the {what} {path} belongs to user id {info.st_uid}, not to this user; "
            "pass a directory of your own"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & _REACHABLE:
        try:
            path.chmod(PRIVATE_DIR_MODE)
        except OSError as exc:
            raise ConfigError(
                f"the {what} {path} is reachable by other users (mode {mode:o}) and cannot be "
                f"made private ({exc.strerror or exc}); run `chmod 700 {path}`"
            ) from exc
        log.warning(
            "the %s %s was reachable by other users (mode %o); its mode is now 700",
            what,
            path,
            mode,
        )
    return path


def private_file(path: Path, *, companions: Iterable[str] = ()) -> None:
    """Create ``path`` empty with mode 0600 unless it exists; make an existing one private.

    An existing file readable by the group or others is set to 0600, with each of its
    ``companions`` (suffixes such as ``-wal``) that exists, when this user owns it, and the
    change is logged; another user's file is left as it is, with a warning. Never raises: a
    path that cannot be opened is left for the caller's own open to report.
    """
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE))
        return
    except FileExistsError:
        pass
    except OSError:
        return
    try:
        info = path.stat()
    except OSError:
        return
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISREG(info.st_mode) or not mode & _REACHABLE:
        return
    if info.st_uid != os.geteuid():
        log.warning("%s is readable by other users (mode %o) and is not ours to change", path, mode)
        return
    try:
        path.chmod(PRIVATE_FILE_MODE)
    except OSError as exc:
        log.warning(
            "%s is readable by other users (mode %o) and cannot be made private: %s",
            path,
            mode,
            exc.strerror or exc,
        )
        return
    for suffix in companions:
        with contextlib.suppress(OSError):  # absent companions are the common case
            Path(f"{path}{suffix}").chmod(PRIVATE_FILE_MODE)
    log.warning("%s was readable by other users (mode %o); its mode is now 600", path, mode)


def write_private_file(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text`` in a file of mode 0600.

    The temporary file beside it is new and unique (``mkstemp``: 0600, ``O_EXCL``), so a
    temporary left behind by an earlier crash, or planted with a wider mode or as a link,
    is never written through. Raises ``OSError`` when the file cannot be written; the
    temporary is then removed.
    """
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
