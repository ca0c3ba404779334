"""OpenAI Codex CLI (``codex``, npm ``@openai/codex``): headless turns with ``codex exec``.

``codex exec --json [extra] -`` starts a thread, ``codex exec resume <id> --json [extra] -``
continues one; ``-`` reads the prompt on stdin. Codex names its threads itself (a UUID, printed
first) and prints one JSON line per event::

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

from collections.abc import Sequence

from looprelay.agent.harnesses.base import AGENT_SKILLS, Harness, check_session_id, is_session_id
from looprelay.agent.harnesses.output import Turn, event_lines, finish, text
from looprelay.errors import RunnerError

OWNED_FLAGS = frozenset(
    {"--json", "--experimental-json", "-o", "--output-last-message", "--last", "-"}
)


class Codex(Harness):
    """Codex CLI; see the module docstring."""

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


CODEX = Codex(
    name="codex",
    binary="codex",
    hostable=False,
    takes_session_id=False,
    skill_dir=AGENT_SKILLS,
    home_paths=(".codex",),
    config_paths=(".codex", ".agents"),
    config_names=("AGENTS.md", "AGENTS.override.md"),
    owned_flags=OWNED_FLAGS,
)
