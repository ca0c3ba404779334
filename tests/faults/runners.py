"""Helpers for the runner and GitHub fault suites: `looprelay up` as a real process, deliveries
signed and posted over real HTTP, `looprelay runner run` processes (optionally through the
fault wrapper ``tests.faults.agent_boot``) on a private tmux socket, and the checks every fault
ends with: each delivery settled once, each dispatch settled, each comment's text reaching a
harness at most once (exactly once when its dispatch succeeded), in per-work-item seq order.

Nothing here reads a clock to decide pass or fail: tests wait for conditions with a deadline.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from looprelay.agent.start import LEDGER_FILE
from looprelay.app.adapters import open_store, open_work_item_store
from looprelay.cli.sender import post_delivery
from looprelay.config.model import Config, load_config
from looprelay.core.model import DeliveryRecord, DispatchRecord
from looprelay.datadir import WEBHOOK_SECRET_FILE, read_secret
from looprelay.ports import Store, WorkItemStore
from tests.fake_harness import FakeHarness, wait_until
from tests.gitrepos import operator_checkout
from tests.samples import commented, labeled
from tests.test_up import LOOPRELAY, UpProcess, cli

BOOT = [sys.executable, "-m", "tests.faults.agent_boot"]
"""`looprelay` with the agent's report step patched to crash (see ``agent_boot``)."""
REPOSITORY = "Codertocat/Hello-World"
REPO = REPOSITORY.lower()
DEADLINE = 60.0
"""How long a fault test waits for the system to settle; generous for a loaded 2-core box."""
POLL_WAIT = "1"
PASTE_END = "\x1b[201~"
TOKEN = re.compile(r"tok-w(\d+)-c(\d+)-x")
"""The unique token each comment carries: work item and comment index."""
SETTLED = ("succeeded", "failed")


def ref(number: int) -> str:
    return f"github:{REPO}#{number}"


def token(number: int, index: int) -> str:
    return f"tok-w{number}-c{index}-x"


# --- payloads ----------------------------------------------------------------------------------


# --- the server ----------------------------------------------------------------------------------


@dataclass
class Stack:
    """A running `looprelay up`, the deliveries sent to it and read access to its store."""

    up: UpProcess
    config: Config
    sent: list[str] = field(default_factory=list)
    _store: Store | None = None
    _items: WorkItemStore | None = None

    @property
    def data_dir(self) -> Path:
        return self.up.data_dir

    @property
    def server(self) -> str:
        return self.up.webhook_url.removesuffix("/webhook")

    def send(self, event: str, body: dict[str, Any]) -> str:
        """Sign and POST one delivery as GitHub does; return its delivery id (202 asserted)."""
        delivery_id = str(uuid.uuid4())
        secret = read_secret(self.data_dir / WEBHOOK_SECRET_FILE).encode()
        status, text = post_delivery(
            url=self.up.webhook_url,
            event=event,
            body=json.dumps(body).encode(),
            secret=secret,
            delivery_id=delivery_id,
        )
        assert status == 202, text
        self.sent.append(delivery_id)
        return delivery_id

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.config, data_dir=self.data_dir)
        return self._store

    @property
    def items(self) -> WorkItemStore:
        if self._items is None:
            self._items = open_work_item_store(self.config, data_dir=self.data_dir)
        return self._items

    def deliveries(self, ids: Iterable[str]) -> list[DeliveryRecord | None]:
        return [self.store.get_delivery(delivery_id) for delivery_id in ids]

    def wait_settled(self, ids: Iterable[str]) -> list[DeliveryRecord]:
        """Wait until every delivery named has its one outcome; return their records."""
        wanted = list(ids)

        def settled() -> list[DeliveryRecord] | None:
            found = self.deliveries(wanted)
            done = [d for d in found if d is not None and d.settled]
            return done if len(done) == len(wanted) else None

        records: list[DeliveryRecord] = wait_until(
            settled, seconds=DEADLINE, what=f"{len(wanted)} deliveries"
        )
        return records

    def dispatches(self) -> list[DispatchRecord]:
        return self.items.list_dispatches(statuses=())

    def wait_dispatches_settled(self, count: int) -> list[DispatchRecord]:
        """Wait until ``count`` dispatches exist and all are settled; return them."""

        def done() -> list[DispatchRecord] | None:
            found = self.dispatches()
            ok = len(found) >= count and all(d.status in SETTLED for d in found)
            return found if ok else None

        def unsettled() -> list[tuple[str, int, str, str, str | None, int]]:
            return [
                (d.work_item, d.seq, d.kind, d.status, d.lease_holder, d.attempts)
                for d in self.dispatches()
                if d.status not in SETTLED
            ]

        found: list[DispatchRecord] = wait_until(
            done, seconds=DEADLINE, what=f"{count} dispatches settled", explain=unsettled
        )
        return found

    def settled_counts(self) -> Counter[str]:
        """How many ``delivery.settled`` events each delivery has."""
        events = self.store.list_events(name="delivery.settled", limit=100_000)
        return Counter(e.delivery_id for e in events if e.delivery_id)

    def close(self) -> None:
        for opened in (self._store, self._items):
            close = getattr(opened, "close", None)
            if callable(close):
                close()


def start_stack(tmp_path: Path, yaml_text: str, env: dict[str, str] | None = None) -> Stack:
    """Start `looprelay up` with ``yaml_text`` as its config (``env`` added to its environment)."""
    config_path = tmp_path / "looprelay.yaml"
    config_path.write_text(yaml_text)
    saved = os.environ.copy()
    os.environ.update(env or {})
    try:
        up = UpProcess(tmp_path / "data", "--config", str(config_path))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return Stack(up, load_config(config_path))


def start_work_items(stack: Stack, numbers: Iterable[int], **extra: Any) -> dict[int, str]:
    """Arm and start each work item (label, then an authorized `the-loop start`); returns the
    start deliveries by work item once each is settled."""
    numbers = list(numbers)
    stack.wait_settled([stack.send("issues", labeled(n, **extra)) for n in numbers])
    starts = {
        n: stack.send(
            "issue_comment",
            commented(n, f"the-loop start {token(n, 0)}", comment_id=9000 + n, **extra),
        )
        for n in numbers
    }
    stack.wait_settled(starts.values())
    return starts


def comment_plan(numbers: list[int], count: int, rng: random.Random) -> list[tuple[int, int]]:
    """``count`` comments spread over ``numbers`` in a shuffled order: (work item, index)."""
    chosen = [numbers[i % len(numbers)] for i in range(count)]
    rng.shuffle(chosen)
    seen: Counter[int] = Counter()
    plan = []
    for number in chosen:
        seen[number] += 1
        plan.append((number, seen[number]))
    return plan


# --- runners -------------------------------------------------------------------------------------


@dataclass
class Runner:
    """One registered runner and its current `looprelay runner run` process."""

    name: str
    credentials: Path
    state: Path
    checkout: Path
    socket_name: str
    capacity: int
    proc: subprocess.Popen[bytes] | None = None
    runs: int = 0

    @property
    def runner_id(self) -> str:
        return str(json.loads(self.credentials.read_text())["runner_id"])

    @property
    def log_path(self) -> Path:
        return self.state.parent / f"{self.name}.log"

    def start(self, *, exit_on_report: int | None = None) -> None:
        """Start (or restart: same credentials, ledger, state) the agent; with
        ``exit_on_report`` it runs through ``agent_boot`` and dies on that report."""
        assert self.proc is None or self.proc.poll() is not None, "still running"
        env = os.environ.copy()
        command = LOOPRELAY
        if exit_on_report is not None:
            env["LOOPRELAY_FAULT_EXIT_ON_REPORT"] = str(exit_on_report)
            command = BOOT
        self.runs += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n--- run {self.runs} (exit on report {exit_on_report})\n".encode())
            self.proc = subprocess.Popen(
                [
                    *command,
                    "runner",
                    "run",
                    *("--credentials", str(self.credentials), "--state", str(self.state)),
                    *("--checkout", f"{REPOSITORY}={self.checkout}"),
                    *("--tmux-socket", self.socket_name, "--poll-wait", POLL_WAIT),
                    *("--capacity", str(self.capacity)),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the agent (only it: the tmux server and the harnesses live on)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(DEADLINE)

    def ledger(self) -> dict[str, tuple[str, dict[str, Any] | None]]:
        """The agent's local ledger: dispatch id -> (state, result)."""
        with sqlite3.connect(self.state / LEDGER_FILE) as db:
            rows = db.execute("SELECT dispatch_id, state, result FROM dispatches").fetchall()
        return {d: (s, json.loads(r) if r else None) for d, s, r in rows}

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def register_runner(
    stack: Stack,
    tmp_path: Path,
    name: str,
    *,
    socket_name: str,
    capacity: int = 2,
    sessions: int = 8,
    labels: tuple[str, ...] = (),
) -> Runner:
    """Mint a token and register a runner named ``name`` with its own checkout, as an operator
    does with `looprelay runners token` and `looprelay runner register`."""
    minted = cli("runners", "token", "--data", str(stack.data_dir))
    assert minted.returncode == 0, minted.stderr
    credentials = tmp_path / f"{name}.json"
    label_args = [arg for label in labels for arg in ("--label", label)]
    registered = cli(
        "runner",
        "register",
        *("--server", stack.server, "--token", minted.stdout.strip(), "--name", name),
        *("--capacity", str(sessions), "--credentials", str(credentials), *label_args),
    )
    assert registered.returncode == 0, registered.stderr
    checkout = operator_checkout(tmp_path / f"checkout-{name}", REPOSITORY)
    return Runner(
        name=name,
        credentials=credentials,
        state=tmp_path / f"state-{name}",
        checkout=checkout,
        socket_name=socket_name,
        capacity=capacity,
    )


def kill_tmux(name: str) -> None:
    """Kill the tmux server on the private socket ``name`` and remove the socket file."""
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True, check=False)
    socket_dir = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}"
    (socket_dir / name).unlink(missing_ok=True)


@pytest.fixture
def socket_name() -> Iterator[str]:
    """A private tmux socket name; its server is killed (and its socket removed) afterwards."""
    name = f"lr-faults-{uuid.uuid4().hex[:10]}"
    yield name
    kill_tmux(name)


# --- what the harnesses saw ------------------------------------------------------------------


@dataclass(frozen=True)
class Sighting:
    """One comment token seen by one harness process: in its boot prompt (its first paste)
    or pasted later."""

    number: int
    index: int
    pid: int
    cwd: str
    spawned: bool


def sightings(fake: FakeHarness) -> list[Sighting]:
    """Every token each fake harness got, in the order it got them (harnesses by start)."""
    calls = fake.calls()
    starts = [c for c in calls if c["event"] == "start"]
    seen: list[Sighting] = []
    for start in starts:
        pid, cwd = int(start["pid"]), str(start["cwd"])
        # The first paste a harness gets is its boot prompt (never in argv); the rest came later.
        assert not TOKEN.findall(" ".join(start["argv"])), f"a prompt in argv: {start['argv']}"
        boot, _, pasted = fake.received(pid).partition(PASTE_END)
        seen += [Sighting(int(n), int(i), pid, cwd, True) for n, i in TOKEN.findall(boot)]
        seen += [Sighting(int(n), int(i), pid, cwd, False) for n, i in TOKEN.findall(pasted)]
    return seen


def dispatch_token(dispatch: DispatchRecord) -> tuple[int, int]:
    """The (work item, comment index) token a dispatch's prompt carries."""
    found = TOKEN.findall(dispatch.prompt)
    assert len(set(found)) == 1, f"{dispatch.dispatch_id} carries {found}"
    number, index = found[0]
    return int(number), int(index)


def assert_applied_once_in_order(
    dispatches: list[DispatchRecord], fake: FakeHarness
) -> dict[str, Any]:
    """The invariants every runner fault ends with; returns a summary for the report.

    Each dispatch reached a harness at most once, exactly once when it succeeded; what one
    work item's harness got arrived in that work item's seq order; a failed one says why.
    """
    seen = sightings(fake)
    counts = Counter((s.number, s.index) for s in seen)
    by_token = {dispatch_token(d): d for d in dispatches}
    duplicated = {t: n for t, n in counts.items() if n > 1}
    assert not duplicated, f"applied more than once: {duplicated}"
    missing = [
        d.dispatch_id for t, d in by_token.items() if d.status == "succeeded" and not counts[t]
    ]
    assert not missing, f"succeeded but never reached a harness: {missing}"
    failed = {d.dispatch_id: d.result for d in dispatches if d.status == "failed"}
    assert set(failed.values()) <= {"interrupted"}, failed
    order: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for s in seen:
        order[s.number].append((by_token[(s.number, s.index)].seq, s.pid))
    for number, seqs in order.items():
        assert seqs == sorted(seqs), f"#{number} applied out of seq order: {seqs} (seq, pid)"
    return {"dispatches": len(dispatches), "failed": failed, "sightings": len(seen)}
