"""Every event the agent notes while applying is one the runner API accepts.

The server refuses a result carrying an event name it does not know (the whole report, so the
dispatch stays leased); a note added to the agent without its name in ``AgentEventName`` would
make every such result bounce until the lease lapsed.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import looprelay.agent
from looprelay.wire.runner_api import AgentEventName

AGENT = Path(looprelay.agent.__file__).parent


def _noted_names() -> set[str]:
    names: set[str] = set()
    for module in AGENT.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Note"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(str(node.args[0].value))
    return names


def test_every_note_the_agent_makes_is_an_event_the_server_accepts() -> None:
    noted = _noted_names()

    assert {"workspace.prepared", "session.sandboxed"} <= noted  # the scan finds them
    assert noted <= set(typing.get_args(AgentEventName))
