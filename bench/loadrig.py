"""The rig the load benchmarks run on: ``looprelay up`` and ONE runner agent, as an operator
runs them, for ``bench/loadrun.py``, ``bench/e2e.py`` and ``tests/load/``.

``looprelay up`` runs through ``storecount.py`` (which counts store operations at the
adapters; ``bench/e2e.py`` turns that off) on a free loopback port with a fresh data
directory; the agent (``runners token`` + ``runner register`` + ``runner run``) on a private
tmux socket with the fake ``claude`` of ``tests/fake_harness.py`` first on its PATH. Every
process started here is stopped (SIGINT, then SIGKILL) and the tmux server killed, even on
errors.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from looprelay.datadir import STORE_FILE, WEBHOOK_SECRET_FILE  # noqa: E402
from tests import fake_harness  # noqa: E402
from tests.fake_harness import FakeHarness  # noqa: E402
from tests.gitrepos import operator_checkout  # noqa: E402

LOOPRELAY = [sys.executable, "-m", "looprelay.cli"]
REPOSITORY = "codertocat/hello-world"
AUTO_EXECUTE_LABEL = "the-loop: auto-execute"
READY_SECONDS = 30.0
STOP_SECONDS = 15.0
CLI_SECONDS = 60.0
POLL_SECONDS = 0.25


class LoadError(Exception):
    """The rig could not start, or a wait ran out of time."""


def free_port() -> int:
    """A port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def peak_rss_kib(pid: int) -> int:
    """VmHWM (peak resident set) of a live process, in KiB; 0 when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(r"^VmHWM:\s+(\d+)\s+kB", status, re.MULTILINE)
    return int(found.group(1)) if found else 0


def wait_for(check: Callable[[], Any], *, seconds: float, what: str) -> Any:
    """Poll ``check`` until truthy; raises ``LoadError`` naming ``what`` at the deadline."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise LoadError(f"gave up after {seconds:.0f} s waiting for {what}")
        time.sleep(POLL_SECONDS)


class Process:
    """A child process with its output in a log file; ``stop`` is SIGINT, then SIGKILL."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check_alive(self, what: str) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise LoadError(f"{what} exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cli(*args: str) -> str:
    done = subprocess.run(
        [*LOOPRELAY, *args], capture_output=True, text=True, timeout=CLI_SECONDS, check=False
    )
    if done.returncode != 0:
        raise LoadError(f"looprelay {args[0]} {args[1]} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def install_fake_harness(bin_dir: Path) -> FakeHarness:
    """Write the fake ``claude``/``cursor-agent`` of ``tests/fake_harness.py`` into ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("claude", "cursor-agent"):
        script = bin_dir / name
        script.write_text(fake_harness._FAKE.replace("{python}", sys.executable), encoding="utf-8")
        script.chmod(0o755)
    return FakeHarness(bin=bin_dir)


@dataclass(frozen=True)
class RealCli:
    """A real coding-agent CLI for the runner to serve instead of the fake one: found on this
    process's ``PATH`` (set up to talk to a stand-in for its model API), with its
    ``--harness-arg`` flags."""

    name: str
    args: tuple[str, ...] = ()

    def runner_flags(self) -> list[str]:
        """``runner run`` flags serving only this CLI."""
        return ["--harness", self.name, *(f"--harness-arg={self.name}={a}" for a in self.args)]


@dataclass
class Rig:
    """A running ``looprelay up`` and one registered runner agent."""

    root: Path
    url: str
    secret: bytes
    up: Process
    runner: Process
    fake: FakeHarness | None
    """The fake harness the runner serves; None when it serves a :class:`RealCli`."""
    tmux_socket: str
    counts_path: Path

    @property
    def harness(self) -> FakeHarness:
        """The fake harness; raises ``LoadError`` in a rig serving a real CLI."""
        if self.fake is None:
            raise LoadError("this rig's runner serves a real CLI, not the fake harness")
        return self.fake

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def store_path(self) -> Path:
        return Path(self.data_dir, STORE_FILE)

    def check_alive(self) -> None:
        """Raise ``LoadError`` if ``up`` or the runner has died."""
        self.up.check_alive("looprelay up")
        self.runner.check_alive("looprelay runner run")

    def read_only(self) -> sqlite3.Connection:
        """A read-only connection to the store file (for cheap progress counts)."""
        return sqlite3.connect(f"file:{self.store_path}?mode=ro", uri=True, timeout=10)

    def count(self, sql: str) -> int:
        """Run a ``SELECT COUNT(*)`` on the store."""
        with self.read_only() as db:
            return int(db.execute(sql).fetchone()[0])


def _config(root: Path, routing: Mapping[str, object]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = root / "looprelay.yaml"
    settings = {
        "routing": {"authorizedUsers": ["codertocat"], **routing},
        "runners": {"heartbeatSeconds": 5},
    }
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    return config


AGENT_WORKERS = 8
"""Dispatches the agent applies at once; the sessions it may hold are the work items."""


@contextmanager
def rig(
    root: Path,
    *,
    capacity: int,
    routing: Mapping[str, object] | None = None,
    count_store: bool = True,
    workspace: Path | None = None,
    real_cli: RealCli | None = None,
) -> Iterator[Rig]:
    """Start ``looprelay up`` and one runner agent holding ``capacity`` sessions under ``root``;
    ``up`` runs through ``storecount.py`` unless ``count_store`` is off (a latency benchmark:
    the counting traces every SQLite statement, which production does not pay for). With
    ``workspace`` the agent also gets that workspace root (``--workspace``), so pull requests
    may have trees of their own, cloned from ``https://github.com/`` (point git elsewhere
    through the environment, as ``tests/gitrepos.offline_github`` does). With ``real_cli`` the
    runner serves that CLI, found on this process's ``PATH``, instead of the fake harness.

    Raises ``LoadError`` when either does not come up within ``READY_SECONDS``."""
    config = _config(root, routing or {})
    data, port = root / "data", free_port()
    counts_path = root / "store-counts.json"
    tmux_socket = f"lr-load-{uuid.uuid4().hex[:10]}"
    state = ["--config", str(config), "--data", str(data)]
    counting = [sys.executable, str(BENCH / "storecount.py"), "--counts-out", str(counts_path)]
    with ExitStack() as stack:
        up = Process(
            [
                *([*counting, "--"] if count_store else LOOPRELAY),
                *("up", *state, "--port", str(port), "--log-level", "WARNING"),
            ],
            root / "up.log",
        )
        stack.callback(up.stop)
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(up, base + "/healthz")
        fake = None if real_cli else install_fake_harness(root / "fakebin")
        runner = _start_runner(
            root,
            base=base,
            state=state,
            tmux_socket=tmux_socket,
            capacity=capacity,
            harness_flags=real_cli.runner_flags() if real_cli else [],
            path=f"{fake.bin}:/usr/bin:/bin" if fake else os.environ["PATH"],
            stack=stack,
            workspace=workspace,
        )
        secret = (data / WEBHOOK_SECRET_FILE).read_text(encoding="ascii").strip().encode()
        yield Rig(root, base + "/webhook", secret, up, runner, fake, tmux_socket, counts_path)


def _wait_healthy(up: Process, url: str) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        up.check_alive("looprelay up")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise LoadError(f"{url} not healthy after {READY_SECONDS:.0f} s; see {up.log}")


def _start_runner(
    root: Path,
    *,
    base: str,
    state: list[str],
    tmux_socket: str,
    capacity: int,
    harness_flags: list[str],
    path: str,
    stack: ExitStack,
    workspace: Path | None,
) -> Process:
    token = cli("runners", "token", *state).strip()
    credentials = root / "runner.json"
    checkout = operator_checkout(root / "checkout", REPOSITORY)
    cli(
        "runner", "register", "--server", base, "--token", token, "--name", "load",
        "--capacity", str(capacity), "--credentials", str(credentials),
    )  # fmt: skip
    env = os.environ | {"PATH": path}
    stack.callback(subprocess.run, ["tmux", "-L", tmux_socket, "kill-server"], capture_output=True)
    runner = Process(
        [
            *LOOPRELAY, "runner", "run", "--credentials", str(credentials),
            "--checkout", f"{REPOSITORY}={checkout}", "--state", str(root / "runner-state"),
            "--tmux-socket", tmux_socket, "--capacity", str(min(capacity, AGENT_WORKERS)),
            "--poll-wait", "25",
            "--log-level", "WARNING", *harness_flags,
            *(["--workspace", str(workspace)] if workspace else []),
            # The fake harness is a script whose Python lives where the sandbox hides it (a
            # venv under $HOME); the real Claude binary runs inside (tests/agent/test_sandbox).
            *(["--sandbox", "never"] if workspace else []),
        ],
        root / "runner.log",
        env,
    )  # fmt: skip
    stack.callback(runner.stop)
    return runner


# -- deliveries ---------------------------------------------------------------------------
