"""Google's Gemini CLI (``gemini``, npm ``@google/gemini-cli``): hosted in tmux or headless.

Hosted: ``gemini --skip-trust (--session-id|--resume) <uuid> [extra]``, the boot prompt pasted.
Headless: ``gemini --output-format json --skip-trust (--session-id|--resume) <uuid> [extra]``
with the prompt on stdin (a piped stdin makes it non-interactive). It prints one object::

    {"session_id": "<uuid>", "response": "Noted.", "stats": {...}}
    {"session_id": "<uuid>", "error": {"type": "Error", "message": "...", "code": 41}}

Hosted, an Enter that reaches it within 40 ms of a paste is read as a newline (its guard
against pasted commands), so its pastes are watched until it took the Enter
(``confirm_submit``). ``--skip-trust`` trusts the tree for that run only, after an untrusted
tree's ``.gemini`` was made the base's. A hosted session is not given the agent's ``CI`` or
``GITHUB_ACTIONS`` (``hosted_unset``): either makes it headless. The loop's skill goes to
``.agents/skills``, which Gemini CLI reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from looprelay.agent.harnesses.base import AGENT_SKILLS, Harness, is_session_id, required_id
from looprelay.agent.harnesses.output import JsonObject, Turn, finish, last_object, text

CI_MARKERS = ("CI", "GITHUB_ACTIONS")
"""Either set to ``true`` makes Gemini CLI headless whatever its terminal; an agent run by a CI
system (a GitHub Actions job, say) has them, and its hosted sessions would exit at once."""

OWNED_FLAGS = frozenset(
    {
        *("--session-id", "--resume", "-r", "-p", "--prompt", "-i", "--prompt-interactive"),
        *("-o", "--output-format", "--skip-trust"),
    }
)


class Gemini(Harness):
    """Gemini CLI; see the module docstring."""

    def hosted_argv(
        self, binary: str, *, session_id: str, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        flag = "--resume" if resume else "--session-id"
        return [binary, "--skip-trust", flag, required_id(session_id), *extra]

    def headless_argv(
        self, binary: str, *, session_id: str | None, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        flag = "--resume" if resume else "--session-id"
        argv = [binary, "--output-format", "json", "--skip-trust"]
        return [*argv, flag, required_id(session_id), *extra]

    def parse_turn(self, *, exit_code: int, stdout: str, stderr: str) -> Turn:
        found = last_object(stdout, _is_result)
        if found is None:
            return finish(exit_code=exit_code, answer=None, stderr=stderr, stdout=stdout)
        error = found.get("error")
        failure = ""
        if error is not None:
            failure = (text(error.get("message")) if isinstance(error, dict) else "") or "error"
        printed = text(found.get("session_id"))
        return finish(
            exit_code=exit_code,
            answer=text(found.get("response")),
            failed=error is not None,
            failure=failure,
            stderr=stderr,
            stdout=stdout,
            session_id=printed if is_session_id(printed) else "",
        )


def _is_result(value: JsonObject) -> bool:
    return "response" in value or "error" in value


GEMINI = Gemini(
    name="gemini",
    binary="gemini",
    hostable=True,
    takes_session_id=True,
    skill_dir=AGENT_SKILLS,
    home_paths=(".gemini",),
    config_paths=(".gemini", ".agents"),
    config_names=("GEMINI.md", "AGENTS.md"),
    owned_flags=OWNED_FLAGS,
    confirm_submit=True,
    hosted_unset=CI_MARKERS,
)
