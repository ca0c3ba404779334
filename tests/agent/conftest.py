"""Agent fixtures: real tmux on a throwaway socket and a fake harness first on PATH.

The fake (``claude`` and ``cursor-agent``, one Python script) appends JSON lines to
``calls.jsonl`` beside itself: its argv and cwd when it starts, ``ready`` once its terminal is raw
with bracketed paste on, then every chunk it reads. Marker files beside it change its behaviour
(``ignore-term``, ``exit-once``, ``resume-fails``, ``headless-fail``, ``headless-hang``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from looprelay.agent.apply import Applier
from looprelay.agent.checkouts import Checkouts
from looprelay.agent.ledger import Ledger
from looprelay.agent.tmux import TmuxTerminal
from looprelay.records import DispatchRecord

DEADLINE_SECONDS = 10.0
"""How long a test waits for tmux or the fake; generous for a loaded 2-core machine."""

_FAKE = r"""#!{python}
import json, os, signal, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARGV = sys.argv[1:]


def note(**fields):
    fields["pid"] = os.getpid()
    with (HERE / "calls.jsonl").open("a", encoding="utf-8") as log:
        log.write(json.dumps(fields) + "\n")


note(event="start", harness=Path(sys.argv[0]).name, argv=ARGV, cwd=os.getcwd())
if (HERE / "ignore-term").exists():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "-p" in ARGV:
    if (HERE / "headless-hang").exists():
        time.sleep(60)
    if (HERE / "headless-fail").exists():
        print("boom: not logged in", file=sys.stderr)
        sys.exit(2)
    flags = ("--session-id", "--resume")
    sid = next((ARGV[i + 1] for i, a in enumerate(ARGV) if a in flags), None)
    sid = sid or "11111111-2222-4333-8444-555555555555"
    print("noise " * 2000)
    print(json.dumps({"type": "result", "result": "ok", "session_id": sid}))
    sys.exit(0)
if "--resume" in ARGV and (HERE / "resume-fails").exists():
    print("No conversation found with that session ID")
    sys.exit(1)
if (HERE / "exit-once").exists():
    (HERE / "exit-once").unlink()
    sys.exit(3)
import tty

tty.setraw(0)
sys.stdout.write("\x1b[?2004h")  # enable bracketed paste, as claude's TUI does
sys.stdout.flush()
note(event="ready")
while True:
    data = os.read(0, 65536)
    if not data:
        break
    note(event="input", data=data.decode("utf-8", "surrogateescape"))
"""


def wait_until(check: Callable[[], Any], *, seconds: float = DEADLINE_SECONDS) -> Any:
    """Poll ``check`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"gave up after {seconds} s waiting for {check}")
        time.sleep(0.02)


@dataclass
class FakeHarness:
    """The fake harness directory: its binaries, markers and what it recorded."""

    bin: Path

    @property
    def claude(self) -> str:
        return str(self.bin / "claude")

    def mark(self, *markers: str) -> None:
        for marker in markers:
            (self.bin / marker).touch()

    def calls(self) -> list[dict[str, Any]]:
        log = self.bin / "calls.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text("utf-8").splitlines()]

    def starts(self) -> list[dict[str, Any]]:
        return [call for call in self.calls() if call["event"] == "start"]

    def wait_ready(self, count: int = 1) -> list[dict[str, Any]]:
        """Wait until ``count`` fakes have their terminal ready; return their start records."""
        wait_until(lambda: len([c for c in self.calls() if c["event"] == "ready"]) >= count)
        ready = {c["pid"] for c in self.calls() if c["event"] == "ready"}
        return [start for start in self.starts() if start["pid"] in ready]

    def received(self, pid: int) -> str:
        """Everything the fake with ``pid`` read from its terminal, in order."""
        return "".join(c["data"] for c in self.calls() if c["event"] == "input" and c["pid"] == pid)


@pytest.fixture
def fake_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHarness:
    """A fake ``claude`` and ``cursor-agent`` first on PATH (nothing else of the name there)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name in ("claude", "cursor-agent"):
        script = bin_dir / name
        script.write_text(_FAKE.replace("{python}", sys.executable), encoding="utf-8")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return FakeHarness(bin=bin_dir)


@pytest.fixture
def terminal() -> Iterator[TmuxTerminal]:
    """A TmuxTerminal on a socket of its own, whose server is killed at teardown."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    socket_name = f"looprelay-test-{uuid.uuid4().hex[:12]}"
    tmux = TmuxTerminal(socket_name)
    yield tmux
    tmux.kill_server()
    # tmux 3.3a leaves its socket file behind after kill-server.
    socket_dir = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}"
    (socket_dir / socket_name).unlink(missing_ok=True)


SESSION_ID = "0b9d6f4e-3a53-4d7c-9a55-2f0f6f4b1c11"
FRESH_ID = "9c1f0a9e-5b1e-4a52-8d0c-6c1f3b2a7e44"
WORK_ITEM = "github:octo/repo#15"
SESSION = "loop-github-octo-repo-15"


def make_dispatch(**fields: Any) -> DispatchRecord:
    """A dispatch for ``github:octo/repo#15``'s own session; ``fields`` override any part."""
    base: dict[str, Any] = {
        "dispatch_id": f"d-{uuid.uuid4().hex[:8]}",
        "delivery_id": "delivery-1",
        "work_item": WORK_ITEM,
        "endpoint": WORK_ITEM,
        "seq": 1,
        "kind": "spawn",
        "repository": "octo/repo",
        "session_name": SESSION,
        "session_id": SESSION_ID,
        "prompt": "Work on github:octo/repo#15",
        "created_at": datetime.now(UTC),
    }
    return DispatchRecord(**{**base, **fields})


@dataclass
class Rig:
    """An applier wired to real tmux, a real ledger file and two checkout kinds."""

    applier: Applier
    ledger: Ledger
    terminal: TmuxTerminal
    checkout: Path
    workspace: Path


@pytest.fixture
def rig(terminal: TmuxTerminal, tmp_path: Path) -> Iterator[Rig]:
    """Short grace and probe (0.3 s) keep the suite fast; fresh ids are always FRESH_ID."""
    checkout, workspace = tmp_path / "checkout", tmp_path / "workspace"
    checkout.mkdir()
    ledger = Ledger(tmp_path / "state" / "ledger.db")
    applier = Applier(
        terminal,
        ledger,
        Checkouts(configured={"octo/repo": checkout}, workspace_root=workspace),
        harness_args={"claude": ["--model", "opus"]},
        kill_grace_seconds=0.3,
        headless_timeout_seconds=10.0,
        resume_probe_seconds=0.3,
        new_uuid=lambda: uuid.UUID(FRESH_ID),
    )
    yield Rig(applier, ledger, terminal, checkout, workspace)
    ledger.close()
