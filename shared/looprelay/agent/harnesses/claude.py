"""Claude Code (``claude``): hosted in tmux or run headless, under ids the agent chooses.

Hosted: ``claude --session-id <uuid>`` (``--resume <uuid>``), the boot prompt pasted. Headless:
``claude -p --output-format json (--session-id|--resume) <uuid>``, the prompt on stdin, one
result object printed (exit 1 when ``is_error``)::

    {"type": "result", "subtype": "success", "is_error": true, "num_turns": 1,
     "result": "Not logged in · Please run /login", "session_id": "<uuid>", ...}

Its folder trust and bypass disclaimer live in its own files (``claude_config``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from looprelay.agent import claude_config
from looprelay.agent.harnesses.base import Harness, check_session_id, is_session_id, required_id
from looprelay.agent.harnesses.output import JsonObject, Turn, finish, last_object, text
from looprelay.errors import ConfigError

PERMISSION_MODES = frozenset({"acceptEdits", "bypassPermissions", "default", "dontAsk", "plan"})
"""Values Claude's ``--permission-mode`` takes; any other makes the harness exit at spawn."""
OWNED_FLAGS = frozenset(
    {
        *("--session-id", "--resume", "-r", "--continue", "-c", "-p", "--print"),
        *("--output-format", "--input-format", "--fork-session"),
    }
)


class Claude(Harness):
    """Claude Code; see the module docstring."""

    def hosted_argv(
        self, binary: str, *, session_id: str, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        check_session_id(session_id)
        return [binary, "--resume" if resume else "--session-id", session_id, *extra]

    def headless_argv(
        self, binary: str, *, session_id: str | None, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        flag = "--resume" if resume else "--session-id"
        return [binary, "-p", "--output-format", "json", flag, required_id(session_id), *extra]

    def parse_turn(self, *, exit_code: int, stdout: str, stderr: str) -> Turn:
        return parse_result_object(
            exit_code=exit_code, stdout=stdout, stderr=stderr, keep_id=_uuid_or_empty
        )

    def prepare(
        self,
        tree: Path,
        *,
        harness_args: Sequence[str],
        environ: Mapping[str, str],
        trust: bool,
        trusted: bool,
    ) -> list[str]:
        return claude_config.prepare_claude(
            tree, harness_args=harness_args, environ=environ, trust=trust, trusted=trusted
        )

    def id_in_use(self, session_id: str, environ: Mapping[str, str]) -> bool:
        return claude_config.session_id_in_use(session_id, environ=environ)

    def check_args(self, harness_args: Sequence[str]) -> None:
        for index, arg in enumerate(harness_args):
            if arg == "--permission-mode":
                mode = harness_args[index + 1] if index + 1 < len(harness_args) else ""
            elif arg.startswith("--permission-mode="):
                mode = arg.partition("=")[2]
            else:
                continue
            if mode not in PERMISSION_MODES:
                raise ConfigError(
                    f"--harness-arg for claude: --permission-mode {mode[:40]!r} is not one of "
                    f"{', '.join(sorted(PERMISSION_MODES))}"
                )

    def home_config(self, environ: Mapping[str, str]) -> list[Path]:
        directory = claude_config.claude_dir(environ)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return [directory, claude_config.claude_config_file(environ)]


def parse_result_object(
    *, exit_code: int, stdout: str, stderr: str, keep_id: Callable[[str], str]
) -> Turn:
    """Read a turn that prints one result object (Claude's shape, which cursor-agent shares);
    ``keep_id`` returns the printed session id when it is one to keep, else empty."""
    found = last_object(stdout, _is_result)
    if found is None:
        return finish(exit_code=exit_code, answer=None, stderr=stderr, stdout=stdout)
    subtype = text(found.get("subtype"))
    answer = text(found.get("result"))
    failed = found.get("is_error") is True or subtype.startswith("error")
    failure = (answer.strip() if failed else "") or _errors(found) or (subtype if failed else "")
    return finish(
        exit_code=exit_code,
        answer=answer,
        failed=failed,
        failure=failure,
        stderr=stderr,
        stdout=stdout,
        subtype=subtype,
        session_id=keep_id(text(found.get("session_id"))),
    )


def _is_result(value: JsonObject) -> bool:
    return value.get("type") == "result" or "is_error" in value


def _errors(found: JsonObject) -> str:
    # Newer Claude versions list error texts for the error_* subtypes, which carry no result.
    errors = found.get("errors")
    if not isinstance(errors, list):
        return ""
    return "; ".join(text(e) for e in errors if text(e))


def _uuid_or_empty(printed: str) -> str:
    return printed if is_session_id(printed) else ""


CLAUDE = Claude(
    name="claude",
    binary="claude",
    hostable=True,
    takes_session_id=True,
    skill_dir=(".claude", "skills"),
    config_paths=(".claude", ".claude.json", ".mcp.json"),
    config_names=(".claude", "CLAUDE.md", "CLAUDE.local.md"),
    owned_flags=OWNED_FLAGS,
    # A Claude still drawing its first screen (seconds, sandboxed on a loaded machine) can
    # drop the Enter after a boot prompt: CI saw one left in its input box, never submitted.
    confirm_submit=True,
    paste_placeholder="[Pasted text #",
)
