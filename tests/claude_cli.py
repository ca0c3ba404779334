"""Pytest plugin: the real Claude Code CLI, pinned, in a fresh HOME of its own.

The version is the one in ``tests/claude-code.version``. ``./dev test`` installs that npm
package once into ``${XDG_CACHE_HOME:-~/.cache}/looprelay/claude-code-<version>`` and exports
``LOOPRELAY_CLAUDE_BIN``; without the variable the plugin looks in that cache itself, so a plain
``.venv/bin/pytest`` works after one install. When the binary is missing the tests that need it
skip, unless ``LOOPRELAY_REQUIRE_CLAUDE=1`` (CI), where they fail.

Offline, the binary answers every prompt with "Not logged in" but records each user message,
with its ``cwd`` and ``sessionId``, in ``$HOME/.claude/projects/<project>/<session id>.jsonl``:
:func:`read_user_messages`, :func:`wait_for_message` and :func:`read_attachments` read that
transcript, and :func:`screen` shows what a session in tmux draws when a wait gives up.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from looprelay.agent.tmux import TmuxTerminal

VERSION_FILE = Path(__file__).with_name("claude-code.version")
BIN_ENV = "LOOPRELAY_CLAUDE_BIN"
REQUIRE_ENV = "LOOPRELAY_REQUIRE_CLAUDE"
DEADLINE_SECONDS = 20.0
"""How long a test waits for Claude; it starts in about 1 s, so this is for a loaded machine."""
VERSION_TIMEOUT_SECONDS = 30.0
SCREEN_TIMEOUT_SECONDS = 10.0
PACKAGE = "@anthropic-ai/claude-code"

OFFLINE_ENV = {
    "DISABLE_AUTOUPDATER": "1",
    # With these two, a start looks up no host at all (strace: no DNS query); without them it
    # asks for api.anthropic.com, github.com, raw.githubusercontent.com and downloads.claude.ai.
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
    # As root, claude refuses bypass-permissions mode unless told it runs in a sandbox, which a
    # throwaway test HOME is; it changes nothing else (the trust dialog still shows).
    "IS_SANDBOX": "1",
}
_UNSET_PREFIXES = ("ANTHROPIC_", "CLAUDE_CODE_")
_UNSET_NAMES = ("CLAUDE_CONFIG_DIR", "CLAUDECODE")  # the latter marks a nested Claude session


def pinned_version() -> str:
    """The pinned ``@anthropic-ai/claude-code`` version. Raises OSError when the file is gone."""
    return VERSION_FILE.read_text(encoding="utf-8").strip()


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where ``./dev`` installs the pinned package (its ``npm install --prefix``)."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "looprelay" / f"claude-code-{pinned_version()}"


def _platform_packages() -> list[str]:
    # The package's optionalDependencies: claude-code-<os>-<x64|arm64>[-musl]; npm installs the
    # one matching this machine, so both libc flavours are looked for.
    system = {"Linux": "linux", "Darwin": "darwin"}.get(platform.system())
    cpu = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower()
    )
    if system is None or cpu is None:
        return []
    return [f"claude-code-{system}-{cpu}", f"claude-code-{system}-{cpu}-musl"]


def cached_binary(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The native ``claude`` of the pinned package in the cache, or None when not installed."""
    modules = cache_dir(environ) / "node_modules" / "@anthropic-ai"
    for package in _platform_packages():
        binary = modules / package / "claude"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def _unavailable(what: str) -> NoReturn:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {what}; the real-Claude tests cannot run", pytrace=False)
    pytest.skip(f"real Claude Code tests skipped: {what} (set {REQUIRE_ENV}=1 to fail)")


def _check_version(binary: Path, version: str) -> None:
    try:
        printed = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_SECONDS,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"{binary} --version did not answer: {exc}", pytrace=False)
    if not printed.startswith(f"{version} "):  # it prints "2.1.332 (Claude Code)"
        first_line = printed.splitlines()[0][:120] if printed else "silent"
        pytest.fail(
            f"{binary} --version says {first_line!r}, not the pinned {PACKAGE}@{version}; "
            f"unset {BIN_ENV} or point it at the pinned build (./dev test installs it)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def claude_bin() -> Path:
    """The pinned native ``claude`` binary, checked to print the pinned version.

    Taken from ``LOOPRELAY_CLAUDE_BIN`` when set (a bad value fails), else from the cache.
    Skips when it is not installed, or fails under ``LOOPRELAY_REQUIRE_CLAUDE=1``.
    """
    version = pinned_version()
    named = os.environ.get(BIN_ENV)
    if named:
        binary = Path(named)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            pytest.fail(f"{BIN_ENV}={named} is not an executable file", pytrace=False)
    else:
        found = cached_binary()
        if found is None:
            _unavailable(
                f"{PACKAGE}@{version} is not installed in {cache_dir()} "
                "(./dev test installs it with npm)"
            )
        binary = found
    _check_version(binary, version)
    return binary


@dataclass(frozen=True)
class ClaudeHome:
    """A fresh HOME where Claude's onboarding is done and no folder is trusted.

    ``bin_dir`` holds ``claude``, a link to the pinned binary. ``env`` is what to set for a
    Claude process (HOME, PATH with ``bin_dir`` first, a private TMPDIR, offline switches) and
    ``unset`` what to remove (CLAUDE_CONFIG_DIR, ANTHROPIC_*, an outer session's CLAUDE_CODE_*).
    """

    home: Path
    bin_dir: Path
    env: dict[str, str]
    unset: tuple[str, ...] = field(default=())

    @property
    def claude(self) -> Path:
        """The ``claude`` on this HOME's PATH."""
        return self.bin_dir / "claude"

    @property
    def config_path(self) -> Path:
        """``$HOME/.claude.json``, the config Claude reads (no CLAUDE_CONFIG_DIR is set)."""
        return self.home / ".claude.json"

    def environ(self, base: Mapping[str, str] = os.environ) -> dict[str, str]:
        """A whole environment for a subprocess (an agent, a headless turn) from ``base``."""
        merged = {name: value for name, value in base.items() if name not in self.unset}
        return {**merged, **self.env}

    def command(self, *args: str) -> list[str]:
        """An argv running ``claude *args`` in this HOME, through env(1), for tmux to start."""
        env = shutil.which("env") or "/usr/bin/env"
        unsets = [part for name in self.unset for part in ("-u", name)]
        assignments = [f"{name}={value}" for name, value in self.env.items()]
        return [env, *unsets, *assignments, str(self.claude), *args]

    def trust(self, folder: Path) -> None:
        """Accept the trust dialog for ``folder`` the way Claude records it: its realpath."""
        config: dict[str, Any] = json.loads(self.config_path.read_text(encoding="utf-8"))
        project = config.setdefault("projects", {}).setdefault(str(folder.resolve()), {})
        project["hasTrustDialogAccepted"] = True
        self.config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")


@contextmanager
def fresh_claude_home(binary: Path, directory: Path) -> Iterator[ClaudeHome]:
    """Make a :class:`ClaudeHome` for ``binary`` under ``directory``, with its own short TMPDIR.

    TMPDIR is short on purpose: Claude binds a unix socket at ``$TMPDIR/cc-socks/<pid>.sock``
    (at most 107 bytes) and leaves ``$TMPDIR/claude-<uid>/`` probes behind; both go on exit.
    Raises OSError when ``directory`` cannot be written.
    """
    home, bin_dir = directory / "claude-home", directory / "claude-bin"
    home.mkdir()
    bin_dir.mkdir()
    (bin_dir / "claude").symlink_to(binary)
    (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True}), "utf-8")
    private_tmp = Path(tempfile.mkdtemp(prefix="lr-claude-"))
    env = {
        "HOME": str(home),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "TMPDIR": str(private_tmp),
        **OFFLINE_ENV,
    }
    unset = sorted(
        name
        for name in {*_UNSET_NAMES, *os.environ}
        if (name in _UNSET_NAMES or name.startswith(_UNSET_PREFIXES)) and name not in env
    )
    try:
        yield ClaudeHome(home=home, bin_dir=bin_dir, env=env, unset=tuple(unset))
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


@pytest.fixture
def claude_home(claude_bin: Path, tmp_path: Path) -> Iterator[ClaudeHome]:
    """A fresh :class:`ClaudeHome` under ``tmp_path`` (see :func:`fresh_claude_home`)."""
    with fresh_claude_home(claude_bin, tmp_path) as home:
        yield home


@dataclass(frozen=True)
class UserMessage:
    """One user message from a Claude transcript: where, in which session, and what."""

    cwd: str
    session_id: str
    text: str


def _text(content: object) -> str | None:
    # message.content is a string for a typed or pasted prompt, or a list of content blocks
    # (text, image, tool_result); a message without a text block (a tool result) has no text.
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            block["text"]
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        ]
        return "\n".join(texts) if texts else None
    return None


def _user_message(record: dict[str, Any]) -> UserMessage | None:
    if record.get("type") != "user":
        return None
    message = record.get("message")
    text = _text(message.get("content")) if isinstance(message, dict) else None
    if text is None:
        return None
    return UserMessage(
        cwd=str(record.get("cwd", "")), session_id=str(record.get("sessionId", "")), text=text
    )


def _record(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:  # the last line may be half written
        return None
    return record if isinstance(record, dict) else None


def _records(home: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for transcript in sorted((home / ".claude" / "projects").glob("*/*.jsonl")):
        try:
            lines = transcript.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            continue
        records.extend(r for r in map(_record, lines) if r is not None)
    return records


def read_user_messages(home: Path) -> list[UserMessage]:
    """Every user message Claude recorded under ``home``, file by file, in recorded order.

    Reads ``home/.claude/projects/*/*.jsonl`` (every project: a directory name is the cwd with
    each non-alphanumeric character made ``-``, cut and hashed past 200 characters, so the
    ``cwd`` field is what to match). No transcript yet is an empty list.
    """
    return [m for m in map(_user_message, _records(home)) if m is not None]


def read_attachments(home: Path, kind: str) -> list[dict[str, Any]]:
    """The ``attachment`` objects of type ``kind`` Claude recorded under ``home``, in order.

    Claude records what it adds to a turn's context as attachments: ``skill_listing`` (with
    ``names`` and ``content``) lists the skills it loaded. No transcript yet is an empty list.
    """
    attachments = (record.get("attachment") for record in _records(home))
    return [a for a in attachments if isinstance(a, dict) and a.get("type") == kind]


def wait_for_message(
    home: Path,
    predicate: Callable[[UserMessage], bool],
    deadline: float = DEADLINE_SECONDS,
    *,
    explain: Callable[[], object] = lambda: "",
) -> UserMessage:
    """Poll the transcripts under ``home`` until a user message satisfies ``predicate``.

    Returns the first such message. Fails the test after ``deadline`` seconds, listing the
    messages recorded so far and whatever ``explain`` says (a screen capture, say).
    """
    give_up = time.monotonic() + deadline
    while True:
        messages = read_user_messages(home)
        for message in messages:
            if predicate(message):
                return message
        if time.monotonic() >= give_up:
            pytest.fail(
                f"no matching user message in Claude's transcript after {deadline} s; "
                f"recorded: {messages!r}; {explain()}"
            )
        time.sleep(0.05)


def screen(terminal: TmuxTerminal, name: str) -> str:
    """What tmux session ``name`` on ``terminal``'s socket shows now, for a failure message.

    Empty when the session is gone; never raises for a tmux that fails or does not answer
    within ``SCREEN_TIMEOUT_SECONDS`` (it says so instead).
    """
    argv = ["tmux", "-L", terminal.socket_name, "capture-pane", "-p", "-t", f"={name}:"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=SCREEN_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no screen of {name}: {exc})"
    return done.stdout


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "claude: needs the real, pinned Claude Code CLI")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test that reaches the binary is marked, so `-m "not claude"` leaves them out.
    for item in items:
        if "claude_bin" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.claude)
