"""The runner agent under faults: real agents, a real runner API over real HTTP, real tmux.

Each test serves ``/runner/v1/...`` from looprelay's ASGI stack (``tests.app_server``) on
127.0.0.1 (the lease desk as ``looprelay.app.services.build_runner_api`` builds it, on stores
of each backend) and runs agents either in threads or as ``looprelay runner run`` processes, when a
real SIGKILL or SIGTERM is the point, on a private tmux socket with the fake ``claude`` first on
PATH.

Time on the server is a clock the test moves, so a lease lapses when the test says so, not after
a real wait. Where a fault must land at one exact point (a runner killed while its lease is on
the wire, or between applying and reporting), a test-side wrapper around the runner API holds
that one call at the server until the test lets it go; the agent itself is never patched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from looprelay.adapters.github.auth import TokenAuth
from looprelay.adapters.github.rest import GitHubRest
from looprelay.agent.apply import Applier
from looprelay.agent.client import RunnerClient
from looprelay.agent.credentials import Credentials, read_credentials, write_credentials
from looprelay.agent.ledger import Ledger
from looprelay.agent.prepare import SessionPreparer
from looprelay.agent.register import register
from looprelay.agent.run import BACKOFF_JITTER, MAX_BACKOFF_SECONDS, Agent, AgentState
from looprelay.agent.start import LEDGER_FILE, STATUS_FILE
from looprelay.agent.statedir import StateLock
from looprelay.agent.tmux import COMMAND_TIMEOUT_SECONDS, TmuxTerminal
from looprelay.agent.workspaces import Workspaces
from looprelay.app.asgi import AsyncHandler, Blocking
from looprelay.app.longpoll import runner_api_handler
from looprelay.app.messages import Request, Response, json_response
from looprelay.config.model import RunnersConfig
from looprelay.core.model import DispatchRecord, RunnerRecord
from looprelay.service.lease_desk import LeaseDesk
from looprelay.service.results import Progress
from looprelay.service.runners import RunnerApi, mint_registration_token
from looprelay.service.session_comments import SessionComments
from looprelay.service.waker import DispatchWaker
from looprelay.wire.runner_api import API_PREFIX
from tests.app_server import AppServer
from tests.dispatches import make_dispatch, save_with_own_session
from tests.fake_github import APP_LOGIN, FakeGitHub
from tests.fake_harness import FakeHarness, wait_until
from tests.gitrepos import GitRepos
from tests.rigs import SteppingClock, Stores, status_json

REPOSITORY = "octo/repo"
CONFIG = RunnersConfig(lease_seconds=10, poll_wait_seconds=1, heartbeat_seconds=5)
GITHUB_TOKEN = "ghp_looprelay_agent_faults"
POLL_WAIT_SECONDS = 1.0
DEADLINE = 20.0
"""How long a test waits for the agent, the server or the fake: generous for a loaded machine."""
LOOPRELAY = [sys.executable, "-m", "looprelay.cli"]
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
SETTLED = ("succeeded", "failed")


def _ref(number: int) -> str:
    return f"github:{REPOSITORY}#{number}"


def _bracketed(text: str) -> str:
    """What the fake reads for one paste of ``text`` and its Enter (raw mode: LF arrives as CR)."""
    return PASTE_START + text.replace("\n", "\r") + PASTE_END + "\r"


def _eventually_equal(read: Callable[[], object], expected: object) -> None:
    """Wait until ``read()`` equals ``expected``; at the deadline assert it, showing the diff."""
    deadline = time.monotonic() + DEADLINE
    while read() != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert read() == expected


class Stall:
    """Holds the first call to one runner API endpoint at the server until the test decides.

    ``after_lease``: the call is served (a poll leases its dispatch) and only its answer is held,
    as when a runner dies while its lease is on the wire. Otherwise the call is held before it
    is served; released with ``deliver=False`` it is answered 503 and never served, as when the
    runner that made it died.
    """

    def __init__(self, endpoint: str, *, after_lease: bool = False) -> None:
        self.endpoint = endpoint
        self.after_lease = after_lease
        self.caught = threading.Event()
        self._released = threading.Event()
        self._deliver = True
        self._lock = threading.Lock()
        self._taken = False

    def take(self) -> bool:
        """Tell whether this call is the one to hold (the first only)."""
        with self._lock:
            first, self._taken = not self._taken, True
            return first

    def hold(self) -> bool:
        """Block the calling server thread until released; whether to serve the call."""
        self.caught.set()
        self._released.wait(2 * DEADLINE)
        return self._deliver

    def release(self, *, deliver: bool) -> None:
        self._deliver = deliver
        self._released.set()


@dataclass
class Relay:
    """The runner API on a loopback port, its stores, its clock and its waker."""

    stores: Stores
    clock: SteppingClock
    waker: DispatchWaker
    api: RunnerApi
    github: FakeGitHub
    port: int = 0
    stall: Stall | None = None
    older: bool = False
    """Answer as a server that predates the heartbeat's failover fields: 400 for them."""
    _server: AppServer | None = None
    _in_flight: int = 0
    heartbeats: int = 0
    """Heartbeats answered so far."""
    held_said: list[dict[str, str]] = field(default_factory=list)
    """What each heartbeat answered said its runner hosts: endpoint -> harness state."""
    _calls: threading.Condition = field(default_factory=threading.Condition)
    _blocking: Blocking = field(default_factory=Blocking)
    _served: AsyncHandler = field(init=False)

    def __post_init__(self) -> None:
        # Served as `looprelay up` and the cloud serve it: polls wait on the event loop.
        self._served = runner_api_handler(self.api, self._blocking)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serve(self) -> None:
        """Start serving; after :meth:`shut_down`, on the same port again."""
        self._server = AppServer(served={"/runner/": self._handle}, port=self.port)
        self.port = self._server.address[1]
        self._server.start()

    def shut_down(self) -> None:
        """Stop listening: calls are refused until :meth:`serve` runs again."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def quiesce(self) -> None:
        """Wait for calls still being served (a stopped agent's last long poll) to end."""
        with self._calls:
            self._calls.wait_for(lambda: self._in_flight == 0, DEADLINE)

    async def _handle(self, request: Request) -> Response:
        with self._calls:
            self._in_flight += 1
        try:
            return await self._serve(request)
        finally:
            with self._calls:
                self._in_flight -= 1
                self._calls.notify_all()

    async def _serve(self, request: Request) -> Response:
        named = "agent_id" in json.loads(request.body or b"{}")
        if self.older and request.path == API_PREFIX + "poll" and named:
            error = "invalid request body: agent_id: Extra inputs are not permitted"
            return json_response(400, {"error": error})
        if self.older and request.path == API_PREFIX + "heartbeat":
            sent = set(json.loads(request.body or b"{}"))
            unknown = {"restarted", "held", "released", "agent_id", "replaces", "hostname"} & sent
            if unknown:
                error = f"invalid request body: {min(unknown)}: Extra inputs are not permitted"
                return json_response(400, {"error": error})
        stall = self.stall
        if stall is None or request.path != API_PREFIX + stall.endpoint:
            response = await self._served(request)
            if request.path == API_PREFIX + "heartbeat" and response.status == 200:
                held = json.loads(request.body or b"{}").get("held", [])
                self.held_said.append({h["endpoint"]: h.get("harness", "") for h in held})
                self.heartbeats += 1
            return response
        # A stall holds a pool thread, not the loop: other calls go on meanwhile.
        if not stall.after_lease and stall.take() and not await self._blocking.run(stall.hold):
            return json_response(503, {"error": "dropped by the test"})
        response = await self._served(request)
        if stall.after_lease and response.status == 200 and stall.take():
            await self._blocking.run(stall.hold)
        return response

    def wait_heartbeats(self, count: int) -> None:
        """Wait until ``count`` more heartbeats are answered: the last begins after the answer
        to the one before was acted on."""
        seen = self.heartbeats
        wait_until(
            lambda: self.heartbeats >= seen + count,
            seconds=DEADLINE,
            what=f"{count} heartbeats",
        )

    def register(self, name: str, *, capacity: int = 1) -> Credentials:
        """Register a runner over HTTP with a freshly minted token, as `runner register` does;
        ``capacity`` is the sessions it may hold."""
        token = mint_registration_token(
            self.stores.registry, now=self.clock.now(), ttl=timedelta(hours=1)
        )
        return register(
            server=self.url, token=token, name=name, labels={}, version="test", capacity=capacity
        )

    def runner(self, runner_id: str) -> RunnerRecord:
        found = self.stores.registry.get_runner(runner_id)
        assert found is not None
        return found

    def dispatch(self, number: int, seq: int = 1, **changes: Any) -> DispatchRecord:
        """A pending spawn for work item ``number``'s own session; ``changes`` override."""
        return make_dispatch(
            repository=REPOSITORY,
            number=number,
            seq=seq,
            created_at=self.clock.now() + timedelta(milliseconds=seq),
            **{"prompt": f"event {seq} of #{number}", **changes},
        )

    def seed(
        self,
        number: int,
        *dispatches: DispatchRecord,
        session_status: str = "pending",
        session_runner: str | None = None,
    ) -> None:
        """Save work item ``number`` with ``dispatches`` and ring the waker, as the router does."""

        def save() -> bool:
            # The desk may be recording a result on the same work item: read again and retry.
            saved = save_with_own_session(
                self.stores.work_items,
                repository=REPOSITORY,
                number=number,
                dispatches=dispatches,
                now=self.clock.now(),
                session_status=session_status,
                session_runner=session_runner,
            )
            return saved is not None

        wait_until(save, seconds=DEADLINE)
        self.waker.notify()

    def stored(self, dispatch_id: str) -> DispatchRecord:
        found = self.stores.work_items.get_dispatch(dispatch_id)
        assert found is not None
        return found

    def settled(self, dispatch_id: str) -> DispatchRecord | None:
        found = self.stored(dispatch_id)
        return found if found.status in SETTLED else None

    def wait_settled(self, *dispatch_ids: str, seconds: float = DEADLINE) -> list[DispatchRecord]:
        """Wait until every dispatch named has its final status; return them."""
        wait_until(
            lambda: all(self.settled(d) for d in dispatch_ids),
            seconds=seconds,
            what=f"{', '.join(dispatch_ids)} settled",
            explain=lambda: [
                (d.dispatch_id, d.status, d.lease_holder, d.result, d.attempts)
                for d in map(self.stored, dispatch_ids)
            ],
        )
        return [self.stored(d) for d in dispatch_ids]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e.data for e in self.stores.events.list_events(name=name)]

    def attach_comments(self, number: int) -> list[str]:
        """What the server posted on work item ``number`` (attach comments, in order)."""
        return [c.body for c in self.github.on(number, REPOSITORY) if c.author == APP_LOGIN]

    def reactions_on_dispatch(self, dispatch_id: str) -> list[str]:
        """The reactions the server left on the comment that made ``dispatch_id``."""
        comment_id = self.stored(dispatch_id).comment_id
        assert comment_id is not None
        return [content for _, content in self.github.comments[comment_id].reactions]


@pytest.fixture
def relay(stores: Stores, fake_github: FakeGitHub) -> Iterator[Relay]:
    """The runner API with its lease desk, as ``build_runner_api`` wires it, serving; its
    progress comments go to the fake GitHub."""
    clock, waker = SteppingClock(), DispatchWaker()
    fake_github.tokens[GITHUB_TOKEN] = APP_LOGIN
    fake_github.repositories.add(REPOSITORY)
    # Two attempts, as production retries too (four there): CI once saw a call to the fake end
    # in a dropped connection (RemoteDisconnected; its cause was not found).
    github = GitHubRest(api_url=fake_github.url, auth=TokenAuth(GITHUB_TOKEN), max_attempts=2)
    progress = Progress(
        work_items=stores.work_items,
        store=stores.events,
        github=github,
        clock=clock,
        bot_logins=(APP_LOGIN,),
    )
    desk = LeaseDesk(
        registry=stores.registry,
        work_items=stores.work_items,
        store=stores.events,
        clock=clock,
        config=CONFIG,
        progress=progress,
        waker=waker,
    )
    sessions = SessionComments(
        work_items=stores.work_items,
        store=stores.events,
        github=github,
        clock=clock,
        bot_logins=(APP_LOGIN,),
    )
    api = RunnerApi(
        registry=stores.registry,
        store=stores.events,
        clock=clock,
        config=CONFIG,
        desk=desk,
        sessions=sessions,
    )
    served = Relay(stores, clock, waker, api, fake_github)
    served.serve()
    yield served
    if served.stall is not None:
        served.stall.release(deliver=False)
    served.quiesce()  # nothing may touch the stores once they are closed
    served.shut_down()


@pytest.fixture
def checkout(git_repos: GitRepos, tmp_path: Path) -> Path:
    """The operator's clone of octo/repo; sessions get worktrees of it."""
    return git_repos.clone(REPOSITORY, tmp_path / "checkout")


@dataclass
class LocalAgent:
    """An agent running in a thread of the test process."""

    agent: Agent
    ledger: Ledger
    thread: threading.Thread

    @property
    def runner_id(self) -> str:
        return self.agent.client.runner_id

    def stop(self) -> None:
        self.agent.stop.set()
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "the agent did not stop"
        self.ledger.close()


@pytest.fixture
def start_agent(
    relay: Relay, terminal: TmuxTerminal, checkout: Path, tmp_path: Path
) -> Iterator[Callable[..., LocalAgent]]:
    """Start in-process agents on the test's tmux socket; all are stopped at teardown."""
    started: list[LocalAgent] = []

    def start(name: str, *, capacity: int = 1, harnesses: tuple[str, ...] = ()) -> LocalAgent:
        state = tmp_path / f"agent-{name}"
        state.mkdir()
        ledger = Ledger(state / LEDGER_FILE)
        applier = Applier(
            terminal,
            ledger,
            SessionPreparer(
                Workspaces(
                    configured={REPOSITORY: checkout}, root=None, worktrees=state / "worktrees"
                ),
                ledger,
                {},
            ),
            kill_grace_seconds=0.3,
            resume_probe_seconds=0.3,
        )

        def describe() -> dict[str, Any]:
            return {
                "version": "test",
                "capacity": capacity,
                "repositories": [REPOSITORY],
                "sessions": ledger.session_count(),
            }

        agent = Agent(
            client=RunnerClient(relay.register(name)),
            applier=applier,
            state=AgentState(state / STATUS_FILE),
            describe=describe,
            tmux_socket=terminal.socket_name,
            capacity=capacity,
            poll_wait_seconds=POLL_WAIT_SECONDS,
            lease_renew_seconds=2.0,
            agent_id=uuid.uuid4().hex,
            hostname="test-box",
            harnesses=harnesses,
        )
        local = LocalAgent(
            agent, ledger, threading.Thread(target=agent.run, name=f"agent-{name}", daemon=True)
        )
        local.thread.start()
        started.append(local)
        return local

    yield start
    for local in started:
        local.stop()


class RunnerProcess:
    """A `looprelay runner run` process; the same credentials and state make a restart."""

    def __init__(
        self,
        *,
        credentials: Path,
        state: Path,
        socket_name: str,
        checkout: Path,
        capacity: int,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.state = state
        self.credentials = credentials
        self.runner_id = json.loads(credentials.read_text())["runner_id"]
        self.log_path = state.parent / f"{state.name}-{uuid.uuid4().hex[:6]}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    *LOOPRELAY,
                    "runner",
                    "run",
                    *("--credentials", str(credentials), "--state", str(state)),
                    *("--checkout", f"{REPOSITORY}={checkout}", "--tmux-socket", socket_name),
                    *("--capacity", str(capacity), "--poll-wait", str(POLL_WAIT_SECONDS)),
                    *extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def wait(self) -> int:
        """Wait for the agent to exit (at most the deadline); its exit code."""
        try:
            return self.proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the agent did not exit in {DEADLINE} s:\n{self.output()}")

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is reported, the lease stays behind."""
        self.signal(signal.SIGKILL)
        self.proc.wait(DEADLINE)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def status(self) -> dict[str, Any]:
        """What `looprelay runner status` reads: the note and the dispatches held."""
        path = self.state / STATUS_FILE
        return json.loads(path.read_text()) if path.exists() else {}

    def session_states(self) -> dict[str, str]:
        """What `looprelay runner status --json` shows of each session's state, by work item."""
        shown = subprocess.run(
            [
                *LOOPRELAY,
                *("runner", "status", "--credentials", str(self.credentials)),
                *("--state", str(self.state), "--json"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return {s["work_item"]: s["state"] for s in json.loads(shown.stdout)["sessions"]}

    def ledger_state(self, dispatch_id: str) -> str | None:
        with sqlite3.connect(self.state / LEDGER_FILE) as db:
            row = db.execute(
                "SELECT state FROM dispatches WHERE dispatch_id = ?", (dispatch_id,)
            ).fetchone()
        return None if row is None else str(row[0])


@pytest.fixture
def launch(
    relay: Relay, terminal: TmuxTerminal, checkout: Path, tmp_path: Path
) -> Iterator[Callable[..., RunnerProcess]]:
    """Start `looprelay runner run` processes; a name seen before restarts that runner (same
    credentials, ledger and state). All are SIGKILLed at teardown."""
    launched: list[RunnerProcess] = []

    def start(
        name: str,
        *,
        capacity: int = 1,
        extra: tuple[str, ...] = (),
        socket_name: str = "",
        state: str = "",
        env: dict[str, str] | None = None,
    ) -> RunnerProcess:
        """``socket_name``: a tmux socket of the runner's own (default: the test's);
        ``state``: a state directory of its own (default: the runner's, by name); ``env``:
        variables added to the agent's environment."""
        credentials = tmp_path / f"{name}.json"
        if not credentials.exists():
            write_credentials(credentials, relay.register(name, capacity=capacity))
        runner = RunnerProcess(
            credentials=credentials,
            state=tmp_path / f"runner-{state or name}",
            socket_name=socket_name or terminal.socket_name,
            checkout=checkout,
            capacity=capacity,
            extra=extra,
            env=env,
        )
        launched.append(runner)
        return runner

    yield start
    for runner in launched:
        if runner.proc.poll() is None:
            runner.kill()


def _pid_of_first_start(fake: FakeHarness) -> int:
    start = wait_until(fake.starts, seconds=DEADLINE)[0]
    return int(start["pid"])


class TestOrder:
    def test_three_quick_events_of_one_work_item_are_applied_in_seq_order(
        self, relay: Relay, start_agent: Callable[..., LocalAgent], fake_harness: FakeHarness
    ) -> None:
        # Two workers poll, so only the server's per-work-item order keeps seq 2 and 3 back
        # until the event before them is settled.
        texts = ["Start on #1", "Second comment:\nplease also", "Third comment;\nand docs"]
        relay.seed(
            1,
            relay.dispatch(1, 1, prompt=texts[0]),
            relay.dispatch(1, 2, kind="deliver", prompt=texts[1]),
            relay.dispatch(1, 3, kind="deliver", prompt=texts[2]),
        )
        start_agent("laptop", capacity=2)

        spawn, first, second = relay.wait_settled("dp-1-1", "dp-1-2", "dp-1-3")
        assert [d.status for d in (spawn, first, second)] == ["succeeded"] * 3
        assert relay.runner(spawn.lease_holder or "").hostname == "test-box"
        assert [d.result for d in (spawn, first, second)] == ["spawned", "delivered", "delivered"]
        [start] = fake_harness.starts()
        assert texts[0] not in start["argv"]  # the boot prompt is pasted, never in argv
        # One paste after the other, each whole: the next began after the one before's Enter.
        _eventually_equal(
            lambda: fake_harness.received(start["pid"]), "".join(map(_bracketed, texts))
        )
        _eventually_equal(lambda: len(fake_harness.starts()), 1)


class TestParallelism:
    def test_one_agent_applies_two_work_items_spawns_at_once(
        self, relay: Relay, start_agent: Callable[..., LocalAgent], fake_harness: FakeHarness
    ) -> None:
        # The server holds the first result it gets until both harnesses have started. An agent
        # applying one dispatch at a time could never start the second while the first is not
        # reported, so it fails at the deadline; no timing guess is involved.
        relay.stall = Stall("results")
        relay.seed(1, relay.dispatch(1))
        relay.seed(2, relay.dispatch(2))
        agent = start_agent("laptop", capacity=2)

        assert relay.stall.caught.wait(DEADLINE), "no result was reported"
        wait_until(lambda: len(fake_harness.starts()) == 2, seconds=DEADLINE)
        relay.stall.release(deliver=True)

        one, two = relay.wait_settled("dp-1-1", "dp-2-1")
        assert (one.status, two.status) == ("succeeded", "succeeded")
        assert {one.lease_holder, two.lease_holder} == {agent.runner_id}
        _eventually_equal(
            lambda: sorted(fake_harness.received(s["pid"]) for s in fake_harness.starts()),
            [_bracketed("event 1 of #1"), _bracketed("event 1 of #2")],
        )

    def test_an_idle_agent_holds_one_poll_open_whatever_its_capacity(
        self,
        relay: Relay,
        start_agent: Callable[..., LocalAgent],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        # The runner API's instances are counted by the polls held open: one an agent, not
        # one a slot. A dispatch still goes to a free worker at once (the test above).
        lock, open_now, most_open, answered = threading.Lock(), [0], [0], [0]
        polling = RunnerClient.poll

        def counted(client: RunnerClient, wait: float, *, agent_id: str = "") -> Any:
            with lock:
                open_now[0] += 1
                most_open[0] = max(most_open[0], open_now[0])
            try:
                return polling(client, wait, agent_id=agent_id)
            finally:
                with lock:
                    open_now[0] -= 1
                    answered[0] += 1

        monkeypatch.setattr(RunnerClient, "poll", counted)
        start_agent("laptop", capacity=3)
        wait_until(lambda: answered[0] >= 4, seconds=DEADLINE)  # each waits POLL_WAIT_SECONDS
        assert most_open[0] == 1


class TestKilledRunner:
    def test_a_runner_killed_with_its_lease_on_the_wire_leaves_the_dispatch_to_a_survivor(
        self,
        relay: Relay,
        launch: Callable[..., RunnerProcess],
        start_agent: Callable[..., LocalAgent],
        fake_harness: FakeHarness,
    ) -> None:
        relay.stall = Stall("poll", after_lease=True)
        doomed = launch("doomed")
        relay.seed(1, relay.dispatch(1))
        assert relay.stall.caught.wait(DEADLINE), "the runner leased nothing"
        leased = relay.stored("dp-1-1")
        assert (leased.status, leased.lease_holder) == ("leased", doomed.runner_id)
        doomed.kill()
        relay.stall.release(deliver=True)  # to a dead socket

        relay.clock.advance(CONFIG.lease_seconds + 1)
        survivor = start_agent("survivor")
        [done] = relay.wait_settled("dp-1-1")
        assert (done.status, done.result, done.attempts) == ("succeeded", "spawned", 2)
        _eventually_equal(lambda: len(fake_harness.starts()), 1)
        assert relay.events("lease.expired") == [
            {"dispatch_id": "dp-1-1", "from": doomed.runner_id, "to": survivor.runner_id}
        ]

    def test_a_runner_killed_mid_apply_and_restarted_at_once_reports_it_without_waiting(
        self, relay: Relay, launch: Callable[..., RunnerProcess], fake_harness: FakeHarness
    ) -> None:
        # A respawn stays in hand for the resume probe (3 s in `runner run`) after the harness
        # started: the kill lands after the side effect and before the ledger has a result.
        relay.seed(1, relay.dispatch(1, resume=True))
        box = launch("box")
        _pid_of_first_start(fake_harness)
        box.kill()
        assert box.ledger_state("dp-1-1") == "applying", "the kill came after the apply ended"
        assert relay.stored("dp-1-1").status == "leased"

        # The server's clock stands still: a lease that had to lapse would never be offered
        # again. The restarted agent says it restarted, and takes its own work back at once.
        launch("box")
        [done] = relay.wait_settled("dp-1-1")
        # At most once: the half-done apply is reported, not redone.
        assert (done.status, done.result, done.attempts) == ("failed", "interrupted", 2)
        assert (done.lease_holder, relay.events("lease.expired")) == (box.runner_id, [])
        assert relay.events("lease.released") == [
            {"runner_id": box.runner_id, "dispatch_id": "dp-1-1", "reason": "runner-restarted"}
        ]
        _eventually_equal(lambda: len(fake_harness.starts()), 1)


@pytest.fixture
def own_terminal() -> Iterator[TmuxTerminal]:
    """A second tmux socket, for a runner that must not share the test's (each runner has
    its own by default); its server is killed at teardown."""
    tmux = TmuxTerminal(f"looprelay-test-{uuid.uuid4().hex[:12]}")
    yield tmux
    tmux.kill_server()
    socket_dir = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}"
    (socket_dir / tmux.socket_name).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie (exited, its parent gone before reaping it, as
    when the tmux server exits with its last session) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()[:300]
    except FileNotFoundError:
        return "gone"


def _view(relay: Relay) -> dict[str, Any]:
    """What ``looprelay status --json`` prints, from the relay's stores."""
    return status_json(relay.stores, relay.clock, lost_after_seconds=CONFIG.lost_after_seconds)


def _state(relay: Relay, number: int) -> str:
    """The state ``status --json`` shows for work item ``number``'s own session."""
    rows = {row["endpoint"]: row for row in _view(relay)["sessions"]}
    return str(rows[_ref(number)]["state"])


def _live_harnesses(fake: FakeHarness) -> list[int]:
    return [start["pid"] for start in fake.starts() if _alive(start["pid"])]


def _assert_slots_are_live_harnesses(relay: Relay, fake: FakeHarness, *runner_ids: str) -> None:
    """The slots the server counts on ``runner_ids`` are as many as the harnesses running."""
    held = {r: relay.stores.work_items.held_sessions(r) for r in runner_ids}
    live = _live_harnesses(fake)
    assert sum(len(h) for h in held.values()) == len(live), (held, live)
    counted = {r["runner_id"]: r["sessions"] for r in _view(relay)["runners"]}
    assert sum(counted[r] for r in runner_ids) == len(live), counted


class TestFailover:
    def test_a_runner_back_after_its_session_moved_stops_its_harness_and_the_new_one_is_named(
        self,
        relay: Relay,
        launch: Callable[..., RunnerProcess],
        fake_harness: FakeHarness,
        terminal: TmuxTerminal,
        own_terminal: TmuxTerminal,
    ) -> None:
        old = launch("old-box", socket_name=own_terminal.socket_name)
        relay.seed(1, relay.dispatch(1))
        relay.wait_settled("dp-1-1")
        old_pid = _pid_of_first_start(fake_harness)
        session = relay.stored("dp-1-1").session_name
        old.kill()  # its harness lives on in its tmux
        relay.quiesce()  # its last long poll, still waiting at the server, ends empty

        # Silent past lostAfterSeconds; a comment comes, routed to the session's runner.
        relay.clock.advance(CONFIG.lost_after_seconds + 1)
        new = launch("new-box")
        relay.seed(
            1,
            relay.dispatch(1, 2, kind="deliver", prompt="after failover", runner_id=old.runner_id),
            session_status="live",
            session_runner=old.runner_id,
        )
        [moved] = relay.wait_settled("dp-1-2")
        assert (moved.status, moved.result, moved.lease_holder) == (
            "succeeded",
            "spawned",
            new.runner_id,
        )
        new_pid = int(wait_until(lambda: fake_harness.starts()[1:], seconds=DEADLINE)[0]["pid"])

        launch("old-box", socket_name=own_terminal.socket_name)  # it comes back
        wait_until(lambda: relay.events("session.released"), seconds=DEADLINE)
        wait_until(
            lambda: not _alive(old_pid),
            seconds=DEADLINE,
            what="the old harness to end",
            explain=lambda: (relay.events("session.released"), _proc_state(old_pid)),
        )
        assert own_terminal.pane_dead(session) is None  # its tmux session is gone too
        assert terminal.pane_dead(session) is False and _alive(new_pid)
        assert [s["pid"] for s in fake_harness.starts() if _alive(s["pid"])] == [new_pid]
        [released] = relay.events("session.released")
        assert (released["runner_id"], released["session_name"]) == (old.runner_id, session)
        assert released["outcome"].startswith("harness terminated; tmux session killed")
        first, second = relay.attach_comments(1)
        assert "**old-box**" in first and "**new-box**" in second
        assert f"attach -t {session}" in second
        # Capacity 1 on both: each counts what it runs, and the old one takes the next issue.
        _assert_slots_are_live_harnesses(relay, fake_harness, old.runner_id, new.runner_id)
        assert _state(relay, 1) == "live"
        relay.seed(2, relay.dispatch(2))
        [taken] = relay.wait_settled("dp-2-1")
        assert (taken.status, taken.lease_holder) == ("succeeded", old.runner_id)
        _assert_slots_are_live_harnesses(relay, fake_harness, old.runner_id, new.runner_id)

    def test_a_heartbeat_while_it_takes_over_a_session_does_not_stop_it(
        self,
        relay: Relay,
        start_agent: Callable[..., LocalAgent],
        fake_harness: FakeHarness,
        terminal: TmuxTerminal,
    ) -> None:
        away = relay.register("old-box")  # hosts #1's session, then is never heard from
        relay.clock.advance(CONFIG.lost_after_seconds + 1)
        fake_harness.mark("start-hold")  # the new harness starts; its boot prompt waits
        new = start_agent("new-box")
        relay.seed(
            1,
            relay.dispatch(1, 2, kind="deliver", prompt="after failover", runner_id=away.runner_id),
            session_status="live",
            session_runner=away.runner_id,
        )
        [start] = wait_until(fake_harness.starts, seconds=DEADLINE)
        # Heartbeats while the spawn is in hand name the session, which the server still
        # records on old-box: the second begins after the first's answer was acted on.
        relay.wait_heartbeats(2)
        fake_harness.mark("release")
        [taken] = relay.wait_settled("dp-1-2")
        assert (taken.status, taken.result, taken.lease_holder) == (
            "succeeded",
            "spawned",
            new.runner_id,
        )
        relay.wait_heartbeats(2)
        assert terminal.pane_dead(taken.session_name) is False and _alive(start["pid"])
        assert relay.events("session.released") == []
        assert _state(relay, 1) == "live"


class TestWedgedTmux:
    def test_a_tmux_server_that_stops_answering_fails_the_dispatch_and_the_agent_goes_on(
        self,
        relay: Relay,
        start_agent: Callable[..., LocalAgent],
        fake_harness: FakeHarness,
        terminal: TmuxTerminal,
    ) -> None:
        agent = start_agent("laptop", capacity=2)
        relay.seed(1, relay.dispatch(1))
        relay.wait_settled("dp-1-1")  # the tmux server runs now
        server_pid = int(
            subprocess.run(
                ["tmux", "-L", terminal.socket_name, "display-message", "-p", "#{pid}"],
                capture_output=True,
                text=True,
                check=True,
                timeout=DEADLINE,
            ).stdout
        )
        os.kill(server_pid, signal.SIGSTOP)
        try:
            relay.seed(2, relay.dispatch(2))
            # The first tmux call of the apply waits out its deadline, then the result goes.
            [stuck] = relay.wait_settled("dp-2-1", seconds=COMMAND_TIMEOUT_SECONDS + DEADLINE)
        finally:
            os.kill(server_pid, signal.SIGCONT)
        assert (stuck.status, stuck.result) == ("failed", "tmux-timeout")
        assert f"check it with `tmux -L {terminal.socket_name} ls`" in stuck.detail

        # Not wedged: the next comment for #1 is pasted into its harness.
        relay.seed(
            1,
            relay.dispatch(1, 2, kind="deliver", prompt="still there?", runner_id=agent.runner_id),
            session_status="live",
            session_runner=agent.runner_id,
        )
        [done] = relay.wait_settled("dp-1-2")
        assert (done.status, done.result) == ("succeeded", "delivered")
        [start] = fake_harness.starts()
        _eventually_equal(
            lambda: fake_harness.received(start["pid"]),
            _bracketed("event 1 of #1") + _bracketed("still there?"),
        )


class TestCrashBetweenApplyAndReport:
    def test_the_restarted_agent_reports_the_recorded_result_without_pasting_again(
        self, relay: Relay, launch: Callable[..., RunnerProcess], fake_harness: FakeHarness
    ) -> None:
        box = launch("box")
        relay.seed(1, relay.dispatch(1))
        relay.wait_settled("dp-1-1")
        pid = _pid_of_first_start(fake_harness)
        fake_harness.wait_ready()

        relay.stall = Stall("results")
        text = "New comment:\nship it"
        relay.seed(
            1,
            relay.dispatch(1, 2, kind="deliver", prompt=text, runner_id=box.runner_id),
            session_status="live",
            session_runner=box.runner_id,
        )
        boot = _bracketed("event 1 of #1")
        _eventually_equal(lambda: fake_harness.received(pid), boot + _bracketed(text))
        assert relay.stall.caught.wait(DEADLINE), "the result was not reported"
        box.kill()
        relay.stall.release(deliver=False)  # the result never reaches the desk
        assert relay.stored("dp-1-2").status == "leased"
        assert box.ledger_state("dp-1-2") == "recorded"

        relay.clock.advance(CONFIG.lease_seconds + 1)
        launch("box")
        [done] = relay.wait_settled("dp-1-2")
        assert (done.status, done.result) == ("succeeded", "delivered")
        # Pasted once: a later paste arrives after anything pasted before it.
        relay.seed(1, relay.dispatch(1, 3, kind="deliver", prompt="sentinel"))
        _eventually_equal(
            lambda: fake_harness.received(pid), boot + _bracketed(text) + _bracketed("sentinel")
        )
        relay.wait_settled("dp-1-3")
        _eventually_equal(lambda: len(fake_harness.starts()), 1)
        _eventually_equal(  # each counted once; the event follows the settled status
            lambda: [e["dispatch_id"] for e in relay.events("dispatch.succeeded")],
            ["dp-1-1", "dp-1-2", "dp-1-3"],
        )


class TestDrain:
    def test_the_first_sigterm_finishes_and_reports_what_is_in_hand_and_takes_nothing_new(
        self, relay: Relay, launch: Callable[..., RunnerProcess], fake_harness: FakeHarness
    ) -> None:
        # Capacity 2: while one worker applies a respawn (held for the 3 s resume probe), the
        # other is polling, so a dispatch that arrives during the drain reaches the agent.
        box = launch("box", capacity=2)
        relay.seed(1, relay.dispatch(1, resume=True))
        _pid_of_first_start(fake_harness)
        box.signal(signal.SIGTERM)
        wait_until(
            lambda: box.status().get("note") == "draining" and "dp-1-1" in box.status()["holding"],
            seconds=DEADLINE,
        )
        relay.seed(2, relay.dispatch(2))

        assert box.wait() == 0, box.output()
        assert relay.stored("dp-1-1").status == "succeeded"
        # Never taken, or handed back untouched by the worker whose poll was in flight.
        assert relay.stored("dp-2-1").status == "pending"
        assert {e["reason"] for e in relay.events("dispatch.failed")} <= {"draining"}
        _eventually_equal(lambda: len(fake_harness.starts()), 1)
        assert box.status()["note"] == "stopped" and box.status()["holding"] == {}
        # Not a terminal: JSON lines, one of them telling the operator what the signal did.
        lines = box.output().splitlines()
        messages = [json.loads(line)["message"] for line in lines if line.startswith("{")]
        assert "draining, 1 held; send again to stop now" in messages

    def test_a_second_sigterm_stops_at_once(
        self, relay: Relay, launch: Callable[..., RunnerProcess], fake_harness: FakeHarness
    ) -> None:
        # A headless turn that hangs for 60 s: only the second signal can end the agent soon.
        fake_harness.mark("headless-hang")
        relay.seed(1, relay.dispatch(1, runner_kind="process"))
        box = launch("box")
        harness_pid = _pid_of_first_start(fake_harness)
        try:
            box.signal(signal.SIGTERM)
            wait_until(lambda: box.status().get("note") == "draining", seconds=DEADLINE)
            assert box.proc.poll() is None
            box.signal(signal.SIGTERM)
            started = time.monotonic()
            assert box.wait() == 0, box.output()
            assert time.monotonic() - started < DEADLINE / 2
            # Left as it was: the lease lapses, and the ledger reports it on the next start.
            assert relay.stored("dp-1-1").status == "leased"
            assert box.ledger_state("dp-1-1") == "applying"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(harness_pid, signal.SIGKILL)


class TestTalkingAgent:
    def test_each_lease_spawn_paste_and_failure_is_one_readable_line(
        self, relay: Relay, launch: Callable[..., RunnerProcess], fake_harness: FakeHarness
    ) -> None:
        relay.seed(
            1, relay.dispatch(1), relay.dispatch(1, 2, kind="deliver", prompt="and the docs")
        )
        fake_harness.mark("headless-fail")
        relay.seed(2, relay.dispatch(2, runner_kind="process"))
        box = launch("box", capacity=2, extra=("--log-format", "text"))
        relay.wait_settled("dp-1-1", "dp-1-2", "dp-2-1")
        box.signal(signal.SIGTERM)
        assert box.wait() == 0, box.output()

        lines = box.output().splitlines()
        session = relay.stored("dp-1-1").session_name

        def line(pattern: str) -> None:
            assert any(re.search(pattern, text) for text in lines), f"{pattern!r} in\n{lines}"

        line(r"^\d\d:\d\d:\d\d INFO +leased spawn for github:octo/repo#1 \(dp-1-1\)")
        line(rf"INFO +spawned session {session}\S* for github:octo/repo#1; attach: tmux -L \S+")
        line(rf"INFO +pasted the event into session {session}\S* for github:octo/repo#1")
        line(r"WARNING +spawn for github:octo/repo#2 failed: harness-failed \(.+\)")
        # The last result may still be on its way out when the signal lands: 0 or 1 held.
        line(r"INFO +draining, [01] held; send again to stop now")
        assert not any(text.startswith("{") for text in lines)


class TestTruthfulAgent:
    def test_runner_status_answers_from_the_first_second(
        self, relay: Relay, launch: Callable[..., RunnerProcess], fake_harness: FakeHarness
    ) -> None:
        box = launch("box")
        credentials = box.state.parent / "box.json"

        def status() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    *LOOPRELAY,
                    *("runner", "status", "--credentials", str(credentials)),
                    *("--state", str(box.state), "--json"),
                ],
                capture_output=True,
                text=True,
                check=False,
            )

        shown = wait_until(lambda: status().returncode == 0 and status(), seconds=DEADLINE)
        assert json.loads(shown.stdout)["sessions"] == []
        assert relay.stores.work_items.get_dispatch("dp-1-1") is None  # nothing dispatched

    def test_a_spawn_whose_harness_dies_at_once_is_failed_with_its_last_lines_never_announced(
        self, relay: Relay, start_agent: Callable[..., LocalAgent], fake_harness: FakeHarness
    ) -> None:
        fake_harness.mark("exit-once")
        agent = start_agent("laptop")
        comment = relay.github.add_comment("go", number=1, repository=REPOSITORY)
        relay.seed(1, relay.dispatch(1, comment_id=comment))
        [failed] = relay.wait_settled("dp-1-1")
        assert (failed.status, failed.result) == ("failed", "harness-failed")
        # Recorded just after the dispatch settles (and its slot is freed).
        [event] = wait_until(lambda: relay.events("dispatch.failed"), seconds=DEADLINE)
        # tmux 3.3a does not always learn the status of a child that exits before it is
        # read (about 1 run in 3 here): when shown, it is the harness's own.
        assert re.search(r"exited( \(status 3\))? (before|right after)", event["detail"]), event
        assert "fake harness: not logged in" in event["detail"], event
        # Never announced as running: the one comment is a short note in the harness's words
        # (posted just after the dispatch settles, with the 😕).
        wait_until(lambda: relay.reactions_on_dispatch("dp-1-1"), seconds=DEADLINE)
        [note] = wait_until(lambda: relay.attach_comments(1), seconds=DEADLINE)
        assert note.startswith(
            "😕 claude session did not start: `fake harness: not logged in, exiting at once`"
        )
        assert "kind=reply id=dp-1-1" in note
        assert _state(relay, 1).startswith("exited (since ")
        assert relay.reactions_on_dispatch("dp-1-1") == ["confused"]
        _assert_slots_are_live_harnesses(relay, fake_harness, agent.runner_id)

    def test_a_comment_that_respawned_its_session_is_logged_as_respawned(
        self,
        relay: Relay,
        start_agent: Callable[..., LocalAgent],
        fake_harness: FakeHarness,
        terminal: TmuxTerminal,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level(logging.INFO, logger="looprelay.agent")
        start_agent("laptop")
        relay.seed(1, relay.dispatch(1))
        relay.wait_settled("dp-1-1")
        session = relay.stored("dp-1-1").session_name
        os.kill(_pid_of_first_start(fake_harness), signal.SIGKILL)
        wait_until(lambda: terminal.pane_dead(session), seconds=DEADLINE)
        relay.seed(1, relay.dispatch(1, 2, kind="deliver", prompt="again"), session_status="live")
        [again] = relay.wait_settled("dp-1-2")
        assert (again.status, again.result) == ("succeeded", "spawned")
        said = [r.getMessage() for r in caplog.records]
        assert any(m.startswith(f"respawned session {session} for ") for m in said), said
        assert not any(m.startswith("pasted the event into") for m in said), said


class TestHarnessLiveness:
    """Issue 23: every heartbeat says what each hosted harness does; the server follows."""

    def test_a_harness_killed_later_is_shown_exited_and_its_slot_goes_to_the_next_issue(
        self, relay: Relay, launch: Callable[..., RunnerProcess], fake_harness: FakeHarness
    ) -> None:
        box = launch("box", capacity=1)
        relay.seed(1, relay.dispatch(1))
        relay.wait_settled("dp-1-1")
        pid = _pid_of_first_start(fake_harness)
        relay.seed(2, relay.dispatch(2))
        assert _state(relay, 1) == "live"
        _assert_slots_are_live_harnesses(relay, fake_harness, box.runner_id)
        os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda: _state(relay, 1).startswith("exited"),
            seconds=DEADLINE,
            what="the session shown exited",
            explain=lambda: (_state(relay, 1), box.output()[-2000:]),
        )
        [exited] = relay.events("session.exited")
        assert exited["runner_id"] == box.runner_id
        # Its slot is free: #2, waiting for capacity 1, runs now.
        [taken] = relay.wait_settled("dp-2-1")
        assert (taken.status, taken.lease_holder) == ("succeeded", box.runner_id)
        wait_until(lambda: len(_live_harnesses(fake_harness)) == 1, seconds=DEADLINE)
        _assert_slots_are_live_harnesses(relay, fake_harness, box.runner_id)
        # `runner status` says the same, in the same words.
        states = wait_until(
            lambda: (shown := box.session_states()).get(_ref(2)) == "running" and shown,
            seconds=DEADLINE,
            what="runner status showing #2 running",
            explain=box.session_states,
        )
        assert states[_ref(1)].startswith("exited (since ")
        # The exit is told, then no more: later heartbeats name only what runs. (Twice at
        # most: tmux may learn when the pane died only after the first, which is news.)
        relay.wait_heartbeats(3)
        assert relay.held_said[-2:] == [{_ref(2): "running"}] * 2
        assert 1 <= sum(said.get(_ref(1)) == "exited" for said in relay.held_said) <= 2
        assert _state(relay, 1).startswith("exited")

    def test_a_killed_tmux_server_shows_the_session_exited_and_a_respawn_brings_it_back(
        self,
        relay: Relay,
        start_agent: Callable[..., LocalAgent],
        fake_harness: FakeHarness,
        terminal: TmuxTerminal,
    ) -> None:
        agent = start_agent("laptop")
        relay.seed(1, relay.dispatch(1))
        relay.wait_settled("dp-1-1")
        terminal.kill_server()
        # One heartbeat records the exit, then frees the slot: two writes, waited on together.
        wait_until(
            lambda: (
                _state(relay, 1).startswith("exited")
                and relay.stores.work_items.held_sessions(agent.runner_id) == {}
            ),
            seconds=DEADLINE,
            what="the session shown exited and its slot freed",
        )
        wait_until(lambda: not _live_harnesses(fake_harness), seconds=DEADLINE)
        _assert_slots_are_live_harnesses(relay, fake_harness, agent.runner_id)
        # What the router writes for the next event on an exited session: a resuming spawn.
        respawn = relay.dispatch(1, 2, resume=True, runner_id=agent.runner_id)
        relay.seed(1, respawn, session_status="exited", session_runner=agent.runner_id)
        [again] = relay.wait_settled("dp-1-2")
        assert (again.status, again.result) == ("succeeded", "spawned")
        assert _state(relay, 1) == "live"
        _assert_slots_are_live_harnesses(relay, fake_harness, agent.runner_id)


class TestHarnessChoice:
    def test_a_runner_serving_only_codex_never_leases_claude_work_and_status_says_why(
        self, relay: Relay, start_agent: Callable[..., LocalAgent], fake_harness: FakeHarness
    ) -> None:
        box = start_agent("codex-box", harnesses=("codex",))
        wait_until(lambda: relay.runner(box.runner_id).harnesses == ["codex"], seconds=DEADLINE)
        relay.seed(1, relay.dispatch(1))  # a Claude session's spawn
        # It polls through two heartbeats and is never given it.
        relay.wait_heartbeats(2)
        assert relay.stored("dp-1-1").status == "pending"
        assert fake_harness.starts() == []
        [row] = [d for d in _view(relay)["dispatches"] if d["dispatch_id"] == "dp-1-1"]
        assert row["waiting"] == "harness-missing:claude"
        [runner] = _view(relay)["runners"]
        assert runner["harnesses"] == ["codex"]


class TestRevokedRunner:
    def test_a_revoked_runner_stops_with_exit_code_1_and_says_to_register_again(
        self, relay: Relay, launch: Callable[..., RunnerProcess], fake_harness: FakeHarness
    ) -> None:
        box = launch("old-box")
        wait_until(lambda: relay.runner(box.runner_id).repositories, seconds=DEADLINE)
        relay.stores.registry.revoke_runner(box.runner_id, at=relay.clock.now())
        assert box.wait() == 1
        assert "old-box was revoked; register it again with `looprelay runner register`" in (
            box.output()
        )


class TestOneAgentPerRunner:
    def test_a_second_agent_on_the_same_credentials_is_refused_and_says_why(
        self, relay: Relay, launch: Callable[..., RunnerProcess], fake_harness: FakeHarness
    ) -> None:
        first = launch("box")
        serving = wait_until(lambda: relay.runner(first.runner_id).agent_id, seconds=DEADLINE)
        second = launch("box", state="box-elsewhere")
        assert second.wait() == 1, second.output()
        refused = [line for line in second.output().splitlines() if "another agent" in line]
        assert len(refused) == 1, second.output()
        assert (
            "stopping: another agent serves this runner: runner box is served by another live "
            f"agent (id {serving}"
        ) in refused[0]
        assert "`looprelay runner register`" in refused[0]
        # The first goes on serving, named as before.
        relay.seed(1, relay.dispatch(1))
        [done] = relay.wait_settled("dp-1-1")
        assert (done.status, done.lease_holder) == ("succeeded", first.runner_id)
        assert first.proc.poll() is None
        assert relay.runner(first.runner_id).agent_id == serving
        assert {e["agent_id"] for e in relay.events("runner.second_agent_refused")} == {
            (first.state.parent / "runner-box-elsewhere" / "agent.id").read_text().strip()
        }

    @pytest.mark.parametrize(
        ("died_between", "refusals"), [(None, 0), ("unheard", 0), ("heard", 1)]
    )
    def test_a_restart_after_sigkill_is_accepted_at_once(
        self,
        relay: Relay,
        launch: Callable[..., RunnerProcess],
        fake_harness: FakeHarness,
        died_between: str | None,
        refusals: int,
    ) -> None:
        box = launch("box")
        dead = wait_until(lambda: relay.runner(box.runner_id).agent_id, seconds=DEADLINE)
        box.kill()
        relay.quiesce()  # its last long poll, still waiting at the server, ends empty
        if died_between is not None:
            # Another restart, killed on its way up: after taking the state directory and
            # before its first heartbeat ("unheard": the server still has the one before as
            # live; its successor used to name only it, and was refused as a second agent),
            # or after the server accepted it and before it recorded that ("heard").
            between = StateLock.acquire(box.state)
            between_id = uuid.uuid4().hex
            between.claim_agent_id(between_id)
            if died_between == "heard":
                hello = {"restarted": True, "agent_id": between_id, "replaces": dead}
                RunnerClient(read_credentials(box.credentials)).heartbeat(hello)
            between.release()
        # The server's clock stands still: the dead agent stays live there, yet its
        # successor on the same state directory is taken at once.
        again = launch("box")
        wait_until(
            lambda: relay.runner(box.runner_id).agent_id not in ("", dead),
            seconds=DEADLINE,
            what="the restarted agent on record",
            explain=again.output,
        )
        relay.seed(1, relay.dispatch(1))
        [done] = relay.wait_settled("dp-1-1")
        assert (done.status, done.lease_holder) == ("succeeded", box.runner_id)
        assert again.proc.poll() is None
        # Each agent its state directory names is tried, oldest first, until one is on record.
        assert len(relay.events("runner.second_agent_refused")) == refusals
        # Accepted: the agent on record is the only one its state directory still names.
        recorded = (again.state / "agent.id").read_text().split()
        assert recorded == [relay.runner(box.runner_id).agent_id]


class TestEnvironmentPerSpawn:
    def test_a_restarted_agent_with_a_changed_variable_gives_it_to_its_next_session(
        self, relay: Relay, launch: Callable[..., RunnerProcess], fake_harness: FakeHarness
    ) -> None:
        box = launch("box", capacity=2, env={"LOOPRELAY_TEST_API_KEY": "before"})
        relay.seed(1, relay.dispatch(1))
        relay.wait_settled("dp-1-1")
        box.signal(signal.SIGTERM)
        assert box.wait() == 0, box.output()
        relay.quiesce()

        # The tmux server, started by the first agent, lives on with its session.
        again = launch("box", capacity=2, env={"LOOPRELAY_TEST_API_KEY": "after"})
        relay.seed(2, relay.dispatch(2))
        [done] = relay.wait_settled("dp-2-1")
        assert done.status == "succeeded", again.output()
        first, second = fake_harness.starts()
        assert first["env"]["LOOPRELAY_TEST_API_KEY"] == "before"
        assert second["env"]["LOOPRELAY_TEST_API_KEY"] == "after"
        assert _alive(first["pid"])  # the first session was not restarted for it
        _assert_slots_are_live_harnesses(relay, fake_harness, again.runner_id)


class TestOlderServer:
    def test_a_server_without_the_failover_fields_still_keeps_the_agent_live_and_working(
        self,
        relay: Relay,
        start_agent: Callable[..., LocalAgent],
        fake_harness: FakeHarness,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level(logging.WARNING, logger="looprelay.agent")
        relay.older = True
        relay.seed(1, relay.dispatch(1))
        agent = start_agent("laptop")
        [done] = relay.wait_settled("dp-1-1")
        assert (done.status, done.lease_holder) == ("succeeded", agent.runner_id)
        # Heartbeats with a session to name still get through, without the names.
        relay.clock.advance(CONFIG.heartbeat_seconds)
        seen = relay.runner(agent.runner_id).last_seen_at
        wait_until(
            lambda: relay.runner(agent.runner_id).last_seen_at != seen,
            seconds=CONFIG.heartbeat_seconds + DEADLINE,
        )
        assert relay.runner(agent.runner_id).sessions == 1
        assert relay.runner(agent.runner_id).hostname == ""  # refused with the rest
        assert [r.getMessage() for r in caplog.records if "failover report" in r.getMessage()] == [
            "the server refused this agent's failover report (runner API refused heartbeat: "
            "invalid request body: agent_id: Extra inputs are not permitted); heartbeats go "
            "without it, so leases of a restart lapse on their own and moved sessions are not "
            "stopped here"
        ]


class TestServerDown:
    def test_the_agent_backs_off_while_the_server_is_down_and_takes_work_once_it_is_back(
        self,
        relay: Relay,
        start_agent: Callable[..., LocalAgent],
        fake_harness: FakeHarness,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level(logging.WARNING, logger="looprelay.agent")
        agent = start_agent("laptop")
        wait_until(lambda: relay.runner(agent.runner_id).repositories, seconds=DEADLINE)
        port = relay.port
        relay.shut_down()

        def backoffs() -> list[int]:
            found = (
                re.match(r"poll failed, retrying in about (\d+)s", record.getMessage())
                for record in caplog.records
                if record.name == "looprelay.agent"
            )
            return [int(match.group(1)) for match in found if match]

        wait_until(lambda: len(backoffs()) >= 2, seconds=DEADLINE)
        assert backoffs()[:2] == [1, 2]  # doubling, each wait jittered
        relay.seed(1, relay.dispatch(1))  # saved while the runner API is down
        relay.serve()
        assert relay.port == port

        # A worker may be in its longest wait yet, or fail once more (doubling) as the server
        # comes back: the deadline follows from that backoff, not from a guess.
        backoff = min(2 * max(backoffs()), MAX_BACKOFF_SECONDS) * BACKOFF_JITTER[1]
        [done] = relay.wait_settled("dp-1-1", seconds=backoff + DEADLINE)
        assert (done.status, done.lease_holder) == ("succeeded", agent.runner_id)
        _eventually_equal(lambda: len(fake_harness.starts()), 1)


def test_calls_from_short_lived_threads_share_the_agents_connections(relay: Relay) -> None:
    """The agent starts a renewer thread for each dispatch; each used to open a connection
    of its own. A call now borrows an idle connection: 20 calls from 20 threads one after
    another use one, and a poll held meanwhile takes a second, not one per call."""
    client = RunnerClient(relay.register("laptop"))

    def calls_in_turn(count: int) -> None:
        for _ in range(count):
            thread = threading.Thread(target=client.heartbeat, args=({"capacity": 1},))
            thread.start()
            thread.join(DEADLINE)

    calls_in_turn(20)
    assert client.sessions_opened == 1
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(client.poll, 2.0)
        wait_until(lambda: relay.waker.waiting() == 1, what="the poll to wait")
        calls_in_turn(20)
        assert held.result(timeout=DEADLINE) is None
    assert client.sessions_opened == 2
