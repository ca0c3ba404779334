"""OpenAI Codex CLI (``codex``, npm ``@openai/codex``): hosted in tmux or headless.

Hosted: ``codex [extra]`` in the session's tree, the boot prompt pasted; a respawn is
``codex resume --last [extra]``, which takes the newest interactive conversation recorded for
the working directory (Codex filters by it unless ``--all``; a tree is one session's) and starts
afresh when there is none. The tree is trusted beforehand in Codex's config
(``[projects."<tree>"] trust_level = "trusted"`` in ``${CODEX_HOME:-~/.codex}/config.toml``;
else it asks "Trust this folder?" and eats the prompt), after an untrusted tree's ``.codex``
was made the base's.

Headless: ``codex exec --json [extra] -`` starts a thread, ``codex exec resume <id> --json
[extra] -`` continues one; ``-`` reads the prompt on stdin. Codex names its threads itself (a
UUID, printed first) and prints one JSON line per event::

    {"type":"thread.started","thread_id":"01a23706-..."}
    {"type":"turn.started"}
    {"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"Noted."}}
    {"type":"turn.completed","usage":{...}}

A failed turn ends ``{"type":"turn.failed","error":{"message":...}}``; top-level ``error``
events are its own retries (reconnecting) and count only when no turn completes. An operator
points it at a model provider with ``--harness-arg codex=-c`` and ``model_providers.<id>``.
The loop's skill goes to ``.agents/skills``, which Codex reads below its working tree.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

from looprelay.agent.harnesses.base import AGENT_SKILLS, Harness, check_session_id, is_session_id
from looprelay.agent.harnesses.output import Turn, event_lines, finish, text
from looprelay.agent.json_merge import edit_config_file
from looprelay.errors import RunnerError

CONFIG_FILE = "config.toml"
TRUSTED = "trusted"

OWNED_FLAGS = frozenset(
    {"--json", "--experimental-json", "-o", "--output-last-message", "--last", "--all", "-"}
)


class Codex(Harness):
    """Codex CLI; see the module docstring."""

    def hosted_argv(
        self, binary: str, *, session_id: str, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        # Codex names its conversations itself; ``session_id`` is the agent's and stays out.
        return [binary, "resume", "--last", *extra] if resume else [binary, *extra]

    def prepare(
        self,
        tree: Path,
        *,
        harness_args: Sequence[str],
        environ: Mapping[str, str],
        trust: bool,
        trusted: bool,
    ) -> list[str]:
        if not trust:
            return []  # ``codex exec`` asks nothing
        config = self.home_config(environ)[0] / CONFIG_FILE
        return trust_project(config, str(tree.resolve()))

    def home_config(self, environ: Mapping[str, str]) -> list[Path]:
        home = environ.get("CODEX_HOME")
        return [Path(home)] if home else super().home_config(environ)

    def headless_argv(
        self, binary: str, *, session_id: str | None, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        if session_id is None:
            if resume:
                raise RunnerError("a resumed turn needs a session id", reason="invalid-session-id")
            return [binary, "exec", "--json", *extra, "-"]
        check_session_id(session_id)
        if not resume:
            raise RunnerError(
                "codex names its own threads; a first turn takes no id", reason="invalid-session-id"
            )
        return [binary, "exec", "resume", session_id, "--json", *extra, "-"]

    def parse_turn(self, *, exit_code: int, stdout: str, stderr: str) -> Turn:
        thread, answer, failure, completed, retries = "", None, "", False, ""
        for event in event_lines(stdout):
            kind = event.get("type")
            if kind == "thread.started":
                thread = text(event.get("thread_id"))
            elif kind == "item.completed":
                item = event.get("item")
                if isinstance(item, dict) and item.get("type") == "agent_message":
                    answer = text(item.get("text"))
            elif kind == "turn.completed":
                completed = True
            elif kind == "turn.failed":
                error = event.get("error")
                failure = text(error.get("message")) if isinstance(error, dict) else ""
                failure = failure or "the turn failed"
            elif kind == "error":
                retries = text(event.get("message"))
        failed = bool(failure) or (not completed and bool(retries))
        return finish(
            exit_code=exit_code,
            answer=answer if completed else None,
            failed=failed,
            failure=failure or retries,
            stderr=stderr,
            stdout=stdout,
            session_id=thread if is_session_id(thread) else "",
        )


def trust_project(config: Path, folder: str) -> list[str]:
    """Mark ``folder`` trusted in Codex's ``config``, appending its table and leaving every other
    byte as it is; return what changed (empty when it was trusted already). Raises
    ``RunnerError`` ``trust-failed``, the file untouched, when it is not TOML or already says
    something else of the folder."""

    def edit(current: str | None) -> tuple[str, list[str]]:
        text = current or ""
        projects = _parsed(text, config).get("projects", {})
        entry = projects.get(folder) if isinstance(projects, dict) else None
        if isinstance(entry, dict) and entry.get("trust_level") == TRUSTED:
            return text, []
        if not isinstance(projects, dict) or entry is not None:
            what = (
                "its projects are not a table"
                if entry is None
                else (f"projects.{_toml_string(folder)} is set and not trusted")
            )
            raise RunnerError(
                f"{config}: {what}; looprelay left it untouched: trust the folder there or "
                "remove the entry",
                reason="trust-failed",
            )
        gap = "\n" if text and not text.endswith("\n") else ""
        table = f'\n[projects.{_toml_string(folder)}]\ntrust_level = "{TRUSTED}"\n'
        added = text + gap + table
        _parsed(added, config)  # an inline ``projects = {...}`` cannot take a table after it
        return added, [f"projects[{folder}].trust_level"]

    return edit_config_file(config, edit, peer_lock=None, reason="trust-failed")


def _parsed(text: str, config: Path) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RunnerError(
            f"{config} is not TOML looprelay can add a project to ({exc}); left untouched",
            reason="trust-failed",
        ) from exc


def _toml_string(value: str) -> str:
    """``value`` as a TOML basic string: quote and backslash escaped, control characters as
    ``\\uXXXX``."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return (
        '"'
        + "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in escaped)
        + '"'
    )


CODEX = Codex(
    name="codex",
    binary="codex",
    hostable=True,
    takes_session_id=False,
    skill_dir=AGENT_SKILLS,
    home_paths=(".codex",),
    config_paths=(".codex", ".agents"),
    config_names=("AGENTS.md", "AGENTS.override.md"),
    owned_flags=OWNED_FLAGS,
)
