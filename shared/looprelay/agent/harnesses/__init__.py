"""Every coding-agent CLI a runner can host, by name: one module each, one line here.

Adding one is a module with a :class:`~looprelay.agent.harnesses.base.Harness`, its line in
:data:`REGISTRY`, its name in the config's ``routing.harness`` and its contract-test case
(docs/architecture.md, "Adding a harness").
"""

from __future__ import annotations

from looprelay.agent.harnesses.base import Harness
from looprelay.agent.harnesses.claude import CLAUDE
from looprelay.agent.harnesses.codex import CODEX
from looprelay.agent.harnesses.copilot import COPILOT
from looprelay.agent.harnesses.cursor import CURSOR_AGENT
from looprelay.agent.harnesses.gemini import GEMINI
from looprelay.errors import RunnerError

REGISTRY: dict[str, Harness] = {h.name: h for h in (CLAUDE, CURSOR_AGENT, CODEX, GEMINI, COPILOT)}
NAMES = tuple(REGISTRY)


def get(name: str) -> Harness:
    """The harness called ``name``; raises ``RunnerError`` ``harness-unsupported`` otherwise."""
    found = REGISTRY.get(name)
    if found is None:
        raise RunnerError(
            f"harness {name[:40]!r} is not one of {', '.join(NAMES)}",
            reason="harness-unsupported",
        )
    return found


__all__ = [
    "CLAUDE",
    "CODEX",
    "COPILOT",
    "CURSOR_AGENT",
    "GEMINI",
    "NAMES",
    "REGISTRY",
    "Harness",
    "get",
]
