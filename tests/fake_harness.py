"""Fixture plugin: a fake ``claude``/``cursor-agent`` first on PATH that records what it gets.

The fake (one Python script) appends JSON lines to ``calls.jsonl`` beside itself: its argv,
cwd and environment when it starts, ``ready`` once its terminal is raw with bracketed paste on
and its first screen drawn, then every chunk it reads; a headless turn (``-p``) records what
it read on stdin (``stdin``), its prompt. Marker files beside it change its behaviour
(``ignore-term``, ``exit-once`` (one line, then exit 3), ``draw-late``: raw a second before
it draws, dropping what came in between, as Claude does,
``resume-fails``, ``headless-fail``: Claude's real "Not logged in" result with exit 1,
``headless-hang``, ``headless-hold``: a turn waits, after reading its stdin, until a ``release``
file appears, and ``headless-answer``, whose text is the answer a headless turn prints).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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


def wait_released(seconds=30.0):
    # Until the test marks "release", for at most ``seconds`` however loaded the machine.
    deadline = time.monotonic() + seconds
    while not (HERE / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


note(
    event="start", harness=Path(sys.argv[0]).name, argv=ARGV, cwd=os.getcwd(), env=dict(os.environ)
)
if (HERE / "ignore-term").exists():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "-p" in ARGV:
    note(event="stdin", data=sys.stdin.buffer.read().decode("utf-8", "surrogateescape"))
    if (HERE / "headless-hang").exists():
        time.sleep(60)
    if (HERE / "headless-hold").exists():
        wait_released()
    flags = ("--session-id", "--resume")
    sid = next((ARGV[i + 1] for i, a in enumerate(ARGV) if a in flags), None)
    sid = sid or "11111111-2222-4333-8444-555555555555"
    failing = (HERE / "headless-fail").exists()
    answer = HERE / "headless-answer"
    # Claude 2.x's one result object (`-p --output-format json`); is_error exits 1.
    result = {
        "type": "result",
        "subtype": "success",
        "is_error": failing,
        "duration_ms": 1234,
        "duration_api_ms": 0,
        "num_turns": 1,
        "result": "Not logged in · Please run /login" if failing
        else answer.read_text("utf-8") if answer.exists() else "ok",
        "session_id": sid,
        "total_cost_usd": 0,
        "usage": {"input_tokens": 0, "output_tokens": 0},
        "permission_denials": [],
        "uuid": "6f1c0e4a-2b8d-4c3e-9a7f-0d5b1e2c3a4f",
    }
    out = "noise " * 2000 + "\n" + json.dumps(result, ensure_ascii=False) + "\n"
    sys.stdout.buffer.write(out.encode("utf-8"))
    sys.stdout.buffer.flush()
    sys.exit(1 if failing else 0)
if "--resume" in ARGV and (HERE / "resume-fails").exists():
    print("No conversation found with that session ID")
    sys.exit(1)
if (HERE / "exit-once").exists():
    (HERE / "exit-once").unlink()
    print("fake harness: not logged in, exiting at once", flush=True)
    sys.exit(3)
import termios, tty

if (HERE / "start-hold").exists():
    # Started, but its terminal not read yet (the spawn's boot prompt waits) until released.
    wait_released()
tty.setraw(0)
sys.stdout.write("\x1b[?2004h")  # enable bracketed paste, as claude's TUI does
sys.stdout.flush()
if (HERE / "draw-late").exists():
    # Claude goes raw, then draws its first screen a moment later and drops what came before.
    time.sleep(1.0)
    termios.tcflush(0, termios.TCIFLUSH)
sys.stdout.write("> fake harness ready\r\n")  # its first screen
sys.stdout.flush()
note(event="ready")
while True:
    data = os.read(0, 65536)
    if not data:
        break
    note(event="input", data=data.decode("utf-8", "surrogateescape"))
"""


def wait_until(
    check: Callable[[], Any],
    *,
    seconds: float = DEADLINE_SECONDS,
    what: str = "",
    explain: Callable[[], object] = lambda: "",
) -> Any:
    """Poll ``check`` until it returns something truthy and return that; fail the test at the
    deadline, naming ``what`` (or the check) and whatever ``explain`` says then."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"gave up after {seconds} s waiting for {what or check}; {explain()}")
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

    def answer(self, text: str) -> None:
        """Make headless turns answer ``text`` (the ``result`` of their JSON)."""
        (self.bin / "headless-answer").write_text(text, encoding="utf-8")

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

    def stdin(self) -> list[str]:
        """What each headless turn read on stdin (its prompt), in order."""
        return [c["data"] for c in self.calls() if c["event"] == "stdin"]

    def received(self, pid: int) -> str:
        """Everything the fake with ``pid`` read from its terminal, in order."""
        chunks = [c["data"] for c in self.calls() if c["event"] == "input" and c["pid"] == pid]
        # A read may end inside a UTF-8 sequence: join the bytes, then decode.
        joined = b"".join(chunk.encode("utf-8", "surrogateescape") for chunk in chunks)
        return joined.decode("utf-8", "surrogateescape")


def cmdlines_holding(text: str) -> dict[int, str]:
    """Every process on the machine whose ``/proc/<pid>/cmdline`` (readable by any local
    user) holds ``text``, with that command line; processes ending meanwhile are skipped."""
    needle = text.encode("utf-8")
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode("utf-8", "replace")
    return found


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
