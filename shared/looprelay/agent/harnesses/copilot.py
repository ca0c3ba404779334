"""GitHub Copilot CLI (``copilot``, npm ``@github/copilot``): hosted in tmux or headless.

Hosted: ``copilot (--session-id|--resume)=<uuid> [extra]``, the boot prompt pasted, with the
tree trusted beforehand in its config (``trustedFolders`` in ``${COPILOT_HOME:-~/.copilot}/
config.json``; else it asks "Do you trust the files in this folder?" and eats the prompt).
Headless: ``copilot --output-format json (--session-id|--resume)=<uuid> [extra]`` with the
prompt on stdin; one JSON line per event, the answer in the last ``assistant.message``::

    {"type":"assistant.message","data":{"content":"Noted.",...},...}
    {"type":"result","sessionId":"<uuid>","exitCode":0,...}

Copilot talks to GitHub's service unless the operator sets its own provider
(``COPILOT_PROVIDER_BASE_URL``, ``COPILOT_PROVIDER_TYPE``, ``COPILOT_MODEL``,
``COPILOT_OFFLINE``); tools need ``--harness-arg copilot=--allow-all-tools`` or the like,
the operator's choice. The loop's skill goes to ``.agents/skills``, which Copilot reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from looprelay.agent.harnesses.base import AGENT_SKILLS, Harness, is_session_id, required_id
from looprelay.agent.harnesses.output import Turn, event_lines, finish, text
from looprelay.agent.json_merge import JsonObject, merge_json_file
from looprelay.errors import RunnerError

CONFIG_FILE = "config.json"

OWNED_FLAGS = frozenset(
    {
        *("--session-id", "--resume", "-r", "--continue", "-p", "--prompt", "-i"),
        *("--interactive", "--output-format", "-s", "--silent"),
    }
)


class Copilot(Harness):
    """Copilot CLI; see the module docstring."""

    def hosted_argv(
        self, binary: str, *, session_id: str, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        flag = "--resume" if resume else "--session-id"
        return [binary, f"{flag}={required_id(session_id)}", *extra]

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
            return []
        folder = str(tree.resolve())
        config = self.home_config(environ)[0] / CONFIG_FILE

        def merge(data: JsonObject) -> list[str]:
            folders = data.setdefault("trustedFolders", [])
            if not isinstance(folders, list):
                raise RunnerError(
                    f"{config}: trustedFolders is not a list; looprelay left it untouched",
                    reason="trust-failed",
                )
            if folder in folders:
                return []
            folders.append(folder)
            return [f"trustedFolders[{folder}]"]

        return merge_json_file(config, merge, peer_lock=None, reason="trust-failed")

    def home_config(self, environ: Mapping[str, str]) -> list[Path]:
        home = environ.get("COPILOT_HOME")
        return [Path(home)] if home else super().home_config(environ)

    def headless_argv(
        self, binary: str, *, session_id: str | None, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        flag = "--resume" if resume else "--session-id"
        return [binary, "--output-format", "json", f"{flag}={required_id(session_id)}", *extra]

    def parse_turn(self, *, exit_code: int, stdout: str, stderr: str) -> Turn:
        answer, failure, session, ended = None, "", "", False
        for event in event_lines(stdout):
            kind, data = event.get("type"), event.get("data")
            data = data if isinstance(data, dict) else {}
            if kind == "assistant.message":
                answer = text(data.get("content")) or answer
            elif kind == "result":
                ended, session = True, text(event.get("sessionId"))
            elif isinstance(kind, str) and kind.endswith(".error"):
                failure = text(data.get("message")) or kind
        return finish(
            exit_code=exit_code,
            answer=answer if ended else None,
            failed=bool(failure),
            failure=failure,
            stderr=stderr,
            stdout=stdout,
            session_id=session if is_session_id(session) else "",
        )


COPILOT = Copilot(
    name="copilot",
    binary="copilot",
    hostable=True,
    takes_session_id=True,
    skill_dir=AGENT_SKILLS,
    home_paths=(".copilot",),
    config_paths=(
        *(".github/copilot-instructions.md", ".github/instructions", ".github/skills"),
        *(".github/agents", ".github/prompts", ".github/chatmodes", ".agents"),
    ),
    config_names=("AGENTS.md",),
    owned_flags=OWNED_FLAGS,
)
