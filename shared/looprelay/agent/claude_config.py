"""Claude Code's own files, prepared before every spawn and respawn.

A Claude session started in a directory it has not seen stops at "Quick safety check ... Yes, I
trust this folder", and one started in bypass-permissions mode stops at a disclaimer; either
dialog eats the boot prompt, and the next pasted comment plus Enter answers "No, exit". So the
runner pre-accepts both in Claude's files, and checks whether a session id already has a
transcript before it hands the id to ``--session-id`` (which refuses one in use).

What Claude Code 2.1.332 reads (found with ``strings`` in the binary, then confirmed by running
it offline in tmux):
  - the global config is ``${CLAUDE_CONFIG_DIR:-$HOME}/.claude.json``, except that a non-empty
    ``<claude dir>/.config.json`` (the legacy location) wins when it exists; ``<claude dir>`` is
    ``${CLAUDE_CONFIG_DIR:-$HOME/.claude}``;
  - folder trust is ``projects[<real path>].hasTrustDialogAccepted`` in the global config;
  - the bypass disclaimer is ``skipDangerousModePermissionPrompt`` in
    ``<claude dir>/settings.json``; a global ``bypassPermissionsModeAccepted`` (older versions)
    is moved there by Claude at start;
  - transcripts are ``<claude dir>/projects/<dir>/<session id>.jsonl``.

Writes go through ``json_merge``: merge-only and atomic, only when a value is missing, never
over a file that does not parse as a JSON object. Claude rewrites its config whenever it likes,
under its own lock: a directory ``<config file>.lock`` made with mkdir (proper-lockfile, stale
after 10 s), inside which it re-reads the file before writing. So a write here takes that lock
too, besides looprelay's own sidecar flock and the re-check right before the replace.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path

from looprelay.agent.harnesses.base import is_session_id
from looprelay.agent.json_merge import JsonObject, Merge, merge_json_file
from looprelay.errors import RunnerError

TRUST_FAILED = "trust-failed"
CONFIG_FILE_NAME = ".claude.json"
LEGACY_CONFIG_FILE_NAME = ".config.json"
SETTINGS_FILE_NAME = "settings.json"
TRUST_KEYS = ("hasTrustDialogAccepted", "hasCompletedProjectOnboarding")
BYPASS_SETTING = "skipDangerousModePermissionPrompt"
LEGACY_BYPASS_KEY = "bypassPermissionsModeAccepted"
BYPASS_MODE = "bypassPermissions"
PROJECT_MCP_OFF: dict[str, bool | list[str]] = {
    "enableAllProjectMcpServers": False,
    "enabledMcpjsonServers": [],
}
"""A project entry's keys that would start the folder's ``.mcp.json`` servers unasked; an
untrusted folder gets these values, over whatever was there."""


def claude_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Return Claude's own directory, ``${CLAUDE_CONFIG_DIR:-$HOME/.claude}``.

    Expects the harness's environment (default: this process's). An empty variable counts as
    unset, as in Claude. Never raises.
    """
    env = os.environ if environ is None else environ
    return Path(env.get("CLAUDE_CONFIG_DIR") or Path(_home(env)) / ".claude")


def claude_config_file(environ: Mapping[str, str] | None = None) -> Path:
    """Return the global config file Claude reads under ``environ``.

    ``${CLAUDE_CONFIG_DIR:-$HOME}/.claude.json``, unless ``<claude dir>/.config.json`` is a file
    that is non-empty or has no ``.claude.json`` beside it: Claude 2.1.x then uses that legacy
    file instead (its rule, less the placeholder and case-folding corners). Never raises.
    """
    env = os.environ if environ is None else environ
    main = Path(env.get("CLAUDE_CONFIG_DIR") or _home(env)) / CONFIG_FILE_NAME
    legacy = claude_dir(env) / LEGACY_CONFIG_FILE_NAME
    with suppress(OSError):
        if legacy.is_file() and (legacy.stat().st_size > 0 or not main.exists()):
            return legacy
    return main


def claude_settings_file(environ: Mapping[str, str] | None = None) -> Path:
    """Return Claude's user settings file, ``<claude dir>/settings.json``. Never raises."""
    return claude_dir(environ) / SETTINGS_FILE_NAME


def trust_directory(directory: Path, *, config_file: Path) -> list[str]:
    """Mark ``directory`` trusted and onboarded in Claude's global config ``config_file``.

    Sets ``projects[<real path>].hasTrustDialogAccepted`` and ``hasCompletedProjectOnboarding``
    to true (Claude keys projects by the real path of its working directory). Returns what
    changed, e.g. ``["projects[/x].hasTrustDialogAccepted"]``; ``[]`` when both were already
    set, and then the file is not written at all. A missing file is created (mode 0600).
    Waits up to ``json_merge.LOCK_WAIT_SECONDS`` (15 s) for the locks.
    Raises ``RunnerError`` ``trust-failed`` when the file does not parse as a JSON object, when
    ``projects`` or the directory's entry is not an object (the file is left byte-for-byte
    untouched), or when it cannot be read, locked or written.
    """
    key = str(directory.resolve())

    def merge(data: JsonObject) -> list[str]:
        projects = _child_object(data, "projects", label="projects", path=config_file)
        entry = _child_object(projects, key, label=f"projects[{key}]", path=config_file)
        changed = [name for name in TRUST_KEYS if entry.get(name) is not True]
        entry.update(dict.fromkeys(changed, True))
        return [f"projects[{key}].{name}" for name in changed]

    return _merge(config_file, merge)


def refuse_project_mcp(directory: Path, *, config_file: Path) -> list[str]:
    """Make Claude's entry for ``directory`` enable none of the folder's ``.mcp.json`` servers
    by itself (:data:`PROJECT_MCP_OFF`); return the keys changed (``[]``: no write).

    For an untrusted folder: these keys are overwritten, not merged. Raises ``RunnerError``
    ``trust-failed`` as :func:`trust_directory` does.
    """
    key = str(directory.resolve())

    def merge(data: JsonObject) -> list[str]:
        projects = _child_object(data, "projects", label="projects", path=config_file)
        entry = _child_object(projects, key, label=f"projects[{key}]", path=config_file)
        changed = [name for name, value in PROJECT_MCP_OFF.items() if entry.get(name) != value]
        for name in changed:
            value = PROJECT_MCP_OFF[name]
            entry[name] = list(value) if isinstance(value, list) else value
        return [f"projects[{key}].{name}" for name in changed]

    return _merge(config_file, merge)


def wants_bypass_permissions(harness_args: Sequence[str]) -> bool:
    """Tell whether a Claude argv starts the session in bypass-permissions mode.

    True for ``--dangerously-skip-permissions`` and for a last ``--permission-mode`` (spelled
    ``--permission-mode bypassPermissions`` or ``--permission-mode=bypassPermissions``) whose
    value is ``bypassPermissions``. Never raises.
    """
    mode = ""
    for index, arg in enumerate(harness_args):
        if arg == "--dangerously-skip-permissions":
            return True
        if arg == "--permission-mode" and index + 1 < len(harness_args):
            mode = harness_args[index + 1]
        elif arg.startswith("--permission-mode="):
            mode = arg.partition("=")[2]
    return mode == BYPASS_MODE


def accept_bypass_permissions(*, config_file: Path, settings_file: Path) -> list[str]:
    """Record that the bypass-permissions disclaimer was accepted.

    Sets ``skipDangerousModePermissionPrompt`` in ``settings_file`` (what Claude 2.1.x reads).
    Only when that key was missing is the legacy ``bypassPermissionsModeAccepted`` also set in
    ``config_file``, for older versions: 2.1.x moves it into the settings file and deletes it,
    so setting it on every spawn would rewrite the config each time. Returns the keys set;
    ``[]`` (no write) when already accepted. Raises ``RunnerError`` ``trust-failed`` as
    :func:`trust_directory` does, for either file.
    """
    changes = _merge(settings_file, _set_true(BYPASS_SETTING))
    if changes:
        changes += _merge(config_file, _set_true(LEGACY_BYPASS_KEY))
    return changes


def prepare_claude(
    directory: Path,
    *,
    harness_args: Sequence[str],
    environ: Mapping[str, str] | None = None,
    trust: bool = True,
    trusted: bool = True,
) -> list[str]:
    """Prepare Claude's files for a session in ``directory``; return every change made.

    With ``trust``, trusts ``directory`` (:func:`trust_directory`) and, only when
    ``harness_args`` ask for bypass-permissions mode, accepts its disclaimer
    (:func:`accept_bypass_permissions`); for an untrusted tree (``trusted`` False) first turns
    the folder's MCP servers off (:func:`refuse_project_mcp`). All in the files Claude reads
    under ``environ`` (default: this process's, which the harness inherits). Raises
    ``RunnerError`` ``trust-failed`` as those do.
    """
    env = os.environ if environ is None else environ
    config_file = claude_config_file(env)
    changes = [] if trusted else refuse_project_mcp(directory, config_file=config_file)
    if not trust:
        return changes
    changes += trust_directory(directory, config_file=config_file)
    if wants_bypass_permissions(harness_args):
        changes += accept_bypass_permissions(
            config_file=config_file, settings_file=claude_settings_file(env)
        )
    return changes


def session_id_in_use(session_id: str, *, environ: Mapping[str, str] | None = None) -> bool:
    """Tell whether Claude already has a transcript for ``session_id`` in any project.

    Looks for ``<claude dir>/projects/*/<session_id>.jsonl``. Claude itself refuses an id only
    when the transcript is in the new session's own project; any project counts here, so a
    swapped id can never be mistaken for another session's. Raises ``RunnerError``
    ``invalid-session-id`` for an id that is not a canonical UUID (it would be a path
    pattern), ``claude-state-unreadable`` when the projects directory cannot be listed.
    """
    if not is_session_id(session_id):
        raise RunnerError("the session id is not a canonical UUID", reason="invalid-session-id")
    projects = claude_dir(environ) / "projects"
    try:
        entries = list(projects.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise RunnerError(
            f"cannot list {projects}: {exc}", reason="claude-state-unreadable"
        ) from exc
    return any((entry / f"{session_id}.jsonl").exists() for entry in entries)


def _set_true(key: str) -> Merge:
    def merge(data: JsonObject) -> list[str]:
        if data.get(key) is True:
            return []
        data[key] = True
        return [key]

    return merge


def _child_object(parent: JsonObject, key: str, *, label: str, path: Path) -> JsonObject:
    child = parent.setdefault(key, {})
    if not isinstance(child, dict):
        raise RunnerError(
            f"{label} in {path} is a JSON {type(child).__name__}, not an object; looprelay "
            "left the file untouched: fix or remove that entry",
            reason=TRUST_FAILED,
        )
    return child


def _merge(path: Path, merge: Merge) -> list[str]:
    # Claude locks its config as proper-lockfile does, at "<file as it names it>.lock".
    return merge_json_file(path, merge, peer_lock=Path(f"{path}.lock"), reason=TRUST_FAILED)


def _home(environ: Mapping[str, str]) -> str:
    # Node's os.homedir(): $HOME, else the password database.
    return environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
