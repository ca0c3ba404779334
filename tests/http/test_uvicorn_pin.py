"""uvicorn is pinned exactly, and the pin holds only while the uvicorn state that
``app/protocol.py`` reads is still there (issue 24).

``GuardedProtocol`` subclasses uvicorn's httptools protocol: uvicorn's ``http`` setting takes a
protocol class, but what a subclass may read of it (``cycle``, ``pipeline``, the keep-alive
timer) is no public API. Each name it reads, and each hook it overrides, is found in the
module's source and looked for on a live connection of the installed uvicorn, so an upgrade
that renames or drops one fails here, not in production.
"""

from __future__ import annotations

import ast
import asyncio
import http.client
import threading
import tomllib
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from looprelay.app import protocol
from looprelay.app.asgi import Endpoint, build_asgi
from looprelay.app.messages import Request, Response, json_response
from looprelay.app.protocol import GuardedProtocol
from looprelay.app.server import LocalServer
from tests.fake_harness import wait_until

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 20.0


def _pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    functions = (ROOT / "functions/requirements.txt").read_text().splitlines()
    lines = {
        "pyproject.toml": project["dependencies"],
        "functions/requirements.txt": [x for x in functions if x and not x.startswith("#")],
    }
    pins = {}
    for source, requirements in lines.items():
        [uvicorn] = [Requirement(x) for x in requirements if Requirement(x).name == "uvicorn"]
        [spec] = list(uvicorn.specifier)
        assert spec.operator == "==", f"{source} must pin uvicorn exactly, not {spec}"
        pins[source] = spec.version
    return pins


def test_uvicorn_is_pinned_exactly_and_installed_at_the_pin() -> None:
    pins = _pins()
    assert set(pins.values()) == {version("uvicorn")}, pins


def _guarded_class() -> ast.ClassDef:
    tree = ast.parse(Path(protocol.__file__).read_text())
    [found] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GuardedProtocol"]
    return found


def _read_names() -> tuple[set[str], set[str], set[str]]:
    """uvicorn's names GuardedProtocol reads on itself and on ``self.cycle``, and the hooks
    it overrides."""
    cls = _guarded_class()
    own = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    assigned = {
        t.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Assign | ast.AnnAssign)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    on_self, on_cycle = set(), set()
    for node in ast.walk(cls):
        if not isinstance(node, ast.Attribute):
            continue
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            on_self.add(node.attr)
        elif (
            isinstance(node.value, ast.Attribute)
            and node.value.attr == "cycle"
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"
        ):
            on_cycle.add(node.attr)
    public_own = {"idle", "evict", "drop"}  # GuardedProtocol's own, for ConnectionGuard
    inherited = on_self - own - {a for a in assigned if a.startswith("_")}
    hooks = {name for name in own if not name.startswith("_")} - public_own
    return inherited, on_cycle, hooks


@pytest.fixture
def mid_request() -> Iterator[GuardedProtocol]:
    """A live connection of a real server, its request's handler still running."""
    entered, release = threading.Event(), threading.Event()

    async def hold(request: Request) -> Response:
        entered.set()
        await asyncio.to_thread(release.wait, DEADLINE)
        return json_response(200, {})

    server = LocalServer(build_asgi([Endpoint("/hold", hold, 1000)]), host="127.0.0.1", port=0)
    server.start()
    client = http.client.HTTPConnection(*server.address, timeout=DEADLINE)
    caller = threading.Thread(target=lambda: client.request("POST", "/hold", body=b"x"))
    caller.start()
    try:
        wait_until(entered.is_set, what="the request to reach its handler")
        guard = server._guard
        assert guard is not None
        [connection] = list(guard.open)
        yield connection
    finally:
        release.set()
        caller.join(DEADLINE)
        client.close()
        server.stop()


def test_every_uvicorn_name_the_protocol_reads_is_on_a_live_connection(
    mid_request: GuardedProtocol,
) -> None:
    on_self, on_cycle, _ = _read_names()
    assert {"cycle", "pipeline", "loop", "timeout_keep_alive_task"} <= on_self  # the scan works
    assert {"response_complete", "more_body", "response_started"} <= on_cycle
    missing = {name for name in on_self if not hasattr(mid_request, name)}
    assert not missing, f"uvicorn {version('uvicorn')} lacks {missing}; see app/protocol.py"
    cycle = mid_request.cycle
    missing = {name for name in on_cycle if not hasattr(cycle, name)}
    assert not missing, f"uvicorn's cycle lacks {missing}; see app/protocol.py"


def test_every_hook_the_protocol_overrides_is_one_uvicorn_calls() -> None:
    *_, hooks = _read_names()
    assert {"on_headers_complete", "on_body", "eof_received", "send_400_response"} <= hooks
    missing = {name for name in hooks if not callable(getattr(HttpToolsProtocol, name, None))}
    assert not missing, f"uvicorn {version('uvicorn')} has no {missing} to override"
