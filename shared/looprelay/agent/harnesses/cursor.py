"""cursor-agent: headless only (it cannot be hosted in a pane the agent pastes into).

``cursor-agent -p --output-format json [--resume <id>]``, the prompt on stdin. It picks its own
session id on a first turn and prints Claude's result shape, with an id that is not a UUID.
"""

from __future__ import annotations

from collections.abc import Sequence

from looprelay.agent.harnesses.base import Harness, check_session_id
from looprelay.agent.harnesses.claude import parse_result_object
from looprelay.agent.harnesses.output import Turn, safe_id
from looprelay.errors import RunnerError

OWNED_FLAGS = frozenset({"--resume", "-p", "--print", "--output-format"})


class CursorAgent(Harness):
    """cursor-agent; see the module docstring."""

    def headless_argv(
        self, binary: str, *, session_id: str | None, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        argv = [binary, "-p", "--output-format", "json"]
        if session_id is None:
            if resume:
                raise RunnerError("a resumed turn needs a session id", reason="invalid-session-id")
            return [*argv, *extra]
        check_session_id(session_id)
        return [*argv, *(["--resume", session_id] if resume else []), *extra]

    def parse_turn(self, *, exit_code: int, stdout: str, stderr: str) -> Turn:
        return parse_result_object(
            exit_code=exit_code, stdout=stdout, stderr=stderr, keep_id=safe_id
        )


CURSOR_AGENT = CursorAgent(
    name="cursor-agent",
    binary="cursor-agent",
    hostable=False,
    takes_session_id=False,
    skill_dir=(),
    home_paths=(".cursor", ".config/cursor"),
    config_paths=(".cursor",),
    config_names=(".cursorrules",),
    owned_flags=OWNED_FLAGS,
)
