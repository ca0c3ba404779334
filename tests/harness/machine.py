"""One operator machine running looprelay for real, with the pinned Claude Code CLI.

A :class:`Machine` is what an operator's box holds: one HOME where Claude's onboarding is done
and no folder is trusted (Claude's files are shared by every runner on the box, as they would
be), one ``XDG_STATE_HOME`` (so each runner falls back to its default state directory, keyed by
its id), bare repositories served as ``https://github.com/...`` through git's ``insteadOf``, the
operator's checkout and a workspace root.

A :class:`Deployment` is a ``looprelay up`` process with its config; deliveries are signed and
POSTed to it as GitHub would. :meth:`Deployment.register` registers a runner and starts its
``looprelay runner run`` with the default state directory and tmux socket. Claude runs offline:
it answers "Not logged in", and its transcript (``read_user_messages``) is what it was told.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprelay.core.prsessions import tmux_session_name
from tests.claude_cli import ClaudeHome, UserMessage, read_user_messages, wait_for_message
from tests.fake_harness import wait_until
from tests.faults.runners import Stack, kill_tmux
from tests.gitrepos import GitRepos, git
from tests.harness.payloads import REPOSITORY, commented, labeled, pull_request_opened
from tests.test_up import LOOPRELAY

REPO = REPOSITORY.lower()
"""The repository as looprelay keeps it, and as the offline GitHub serves it."""
FORK = "someone/hello-world"
DEADLINE = 60.0
"""How long a step may take end to end (delivery, queue, lease, git, Claude) on a loaded box."""
STOP_SECONDS = 15.0
CLI_TIMEOUT = 60.0
OUTPUT_SHOWN_CHARS = 4_000


def ref(number: int, repository: str = REPO) -> str:
    """The ref looprelay gives ``repository#number``."""
    return f"github:{repository}#{number}"


def session_name(number: int) -> str:
    """The tmux session (and directory) name of ``REPO#number``'s own session, an issue's or
    a pull request's."""
    return tmux_session_name(ref(number))


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``looprelay *args`` to completion in ``env`` (default: this process's)."""
    return subprocess.run(
        [*LOOPRELAY, *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=env,
        check=False,
    )


def head_of(directory: Path) -> str:
    """The commit checked out in the work tree ``directory``."""
    return git("rev-parse", "HEAD", cwd=directory)


@dataclass(frozen=True)
class Machine:
    """An operator's machine: Claude's HOME, state home, offline GitHub and checkouts."""

    claude: ClaudeHome
    repos: GitRepos
    checkout: Path
    workspace: Path
    state_home: Path
    main: str
    """The commit ``main`` of ``REPO`` points at."""

    def environ(self) -> dict[str, str]:
        """The whole environment of a runner agent here: Claude's HOME and PATH, offline git."""
        return {**self.claude.environ(), "XDG_STATE_HOME": str(self.state_home)}

    def messages(self) -> list[UserMessage]:
        """Every user message Claude recorded on this machine."""
        return read_user_messages(self.claude.home)

    def wait_for(
        self, predicate: Callable[[UserMessage], bool], explain: Callable[[], object]
    ) -> UserMessage:
        """The first user message Claude recorded that satisfies ``predicate``."""
        return wait_for_message(self.claude.home, predicate, DEADLINE, explain=explain)

    def trusted(self, directory: Path) -> dict[str, Any]:
        """What Claude's config says of ``directory`` (empty when it names it not)."""
        config = json.loads(self.claude.config_path.read_text(encoding="utf-8"))
        found: dict[str, Any] = config.get("projects", {}).get(str(directory), {})
        return found


@dataclass
class RunnerAgent:
    """A registered runner and its ``looprelay runner run`` process, with default state."""

    name: str
    credentials: Path
    runner_id: str
    machine: Machine
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> str:
        """The agent's default tmux socket: ``looprelay-<id>``."""
        return f"looprelay-{self.runner_id}"

    @property
    def state_dir(self) -> Path:
        """The agent's default state directory: ``$XDG_STATE_HOME/looprelay-runner/<id>``."""
        # This and the socket are spelled out, not asked of looprelay: the documented defaults
        # are what is under test.
        return self.machine.state_home / "looprelay-runner" / self.runner_id

    def run_args(self, *extra: str) -> list[str]:
        """``runner run`` with these credentials and no ``--state`` or ``--tmux-socket``."""
        return ["runner", "run", "--credentials", str(self.credentials), *extra]

    def start(self, *extra: str, env: Mapping[str, str] | None = None) -> None:
        """Start the agent with ``extra`` arguments (and ``env`` added to the machine's
        environment); wait until it says what it serves."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*LOOPRELAY, *self.run_args(*extra)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self.machine.environ(), **(env or {})},
                start_new_session=True,
            )

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"runner {self.name} exited at start: {self.output()}")
            return "runner agent up" in self.output()

        wait_until(up, seconds=DEADLINE, what=f"runner {self.name} to start", explain=self.output)

    def output(self) -> str:
        """What the agent printed so far (its tail)."""
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-OUTPUT_SHOWN_CHARS:]

    def status(self) -> dict[str, Any]:
        """``looprelay runner status --json`` for this runner, found by its credentials alone."""
        shown = run_cli(
            "runner",
            "status",
            "--credentials",
            str(self.credentials),
            "--json",
            env=self.machine.environ(),
        )
        assert shown.returncode == 0, shown.stderr
        status: dict[str, Any] = json.loads(shown.stdout)
        return status

    def tmux(self, *args: str) -> str:
        """Run tmux on the agent's socket; return its output."""
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=False
        )
        return done.stdout

    def screens(self) -> str:
        """What each of the agent's tmux sessions shows (a dialog Claude waits at, say)."""
        names = self.tmux("list-sessions", "-F", "#{session_name}").split()
        return "".join(
            f"--- {name}:\n{self.tmux('capture-pane', '-p', '-t', f'={name}:')}" for name in names
        )

    def stop(self) -> None:
        """Drain the agent (SIGTERM), kill it if it lingers, and kill its tmux server."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(STOP_SECONDS)
        kill_tmux(self.socket)


@dataclass
class Deployment:
    """A running ``looprelay up`` (``stack``) with its config file, on ``machine``.

    ``installation`` goes into every delivery when the deployment talks to a (fake) GitHub App.
    """

    stack: Stack
    config_path: Path
    machine: Machine
    directory: Path
    installation: int | None = None
    runners: list[RunnerAgent] = field(default_factory=list)
    _started: dict[int, UserMessage] = field(default_factory=dict)
    _comment_ids: Iterator[int] = field(default_factory=lambda: itertools.count(70_001))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``looprelay *args --config ... --data ...`` against this deployment's state."""
        return run_cli(*args, "--config", str(self.config_path), "--data", str(self.stack.data_dir))

    def register(self, name: str, *, capacity: int = 4) -> RunnerAgent:
        """Mint a token and register runner ``name`` as an operator does; not started yet.
        ``capacity``: the sessions it may hold (the server counts them; 4 leaves room for
        every session one test starts)."""
        minted = self.cli("runners", "token")
        assert minted.returncode == 0, minted.stderr
        credentials = self.directory / f"{name}.json"
        registered = run_cli(
            "runner",
            "register",
            "--server",
            self.stack.server,
            "--token",
            minted.stdout.strip(),
            "--name",
            name,
            "--credentials",
            str(credentials),
            "--capacity",
            str(capacity),
        )
        assert registered.returncode == 0, registered.stderr
        runner = RunnerAgent(
            name=name,
            credentials=credentials,
            runner_id=str(json.loads(credentials.read_text())["runner_id"]),
            machine=self.machine,
            log_path=self.directory / f"{name}.log",
        )
        self.runners.append(runner)
        return runner

    def arm(self, number: int) -> None:
        """An authorized user labels issue ``number`` for the loop, and the label is recorded
        (deliveries run concurrently: a start handled first would find nothing armed)."""
        self.stack.wait_settled(
            [self.stack.send("issues", labeled(number, installation=self.installation))]
        )

    def comment(self, number: int, body: str, *, on_pull_request: bool = False) -> str:
        """Codertocat comments ``body`` on issue (or pull request) ``number``; returns the
        delivery id."""
        data = commented(
            number,
            body,
            comment_id=next(self._comment_ids),
            installation=self.installation,
            on_pull_request=on_pull_request,
        )
        return self.stack.send("issue_comment", data)

    def open_pull_request(self, number: int, *, closes: int, fork: str | None = None) -> str:
        """Make PR ``number`` (from ``fork`` or a branch) in the offline GitHub and deliver its
        ``opened`` event, recorded before this returns (as a person comments on a pull request
        they have seen); returns its head commit."""
        head = self.machine.repos.add_pull_request(REPO, number, fork=fork)
        data = pull_request_opened(
            number,
            closes=closes,
            head_sha=head,
            head_repository=fork or REPOSITORY,
            installation=self.installation,
        )
        self.stack.wait_settled([self.stack.send("pull_request", data)])
        return head

    def start(self, number: int) -> UserMessage:
        """Issue ``number`` armed and started (once per deployment); the spawn prompt as Claude
        recorded it."""
        if number not in self._started:
            self.arm(number)
            token = f"tok-{uuid.uuid4().hex[:12]}"
            self.comment(number, f"Ready when you are: the-loop start {token}")
            self._started[number] = self.machine.wait_for(
                lambda m: token in m.text, explain=self.explain
            )
        return self._started[number]

    def dispatch_rows(self) -> list[dict[str, Any]]:
        """``looprelay dispatches --all --json``, one dict per dispatch."""
        listed = self.cli("dispatches", "--all", "--json")
        assert listed.returncode == 0, listed.stderr
        return [json.loads(line) for line in listed.stdout.splitlines()]

    def events(self, name: str) -> list[dict[str, Any]]:
        """``looprelay events --json --name NAME``, one dict per event, oldest first."""
        listed = self.cli("events", "--json", "--name", name)
        assert listed.returncode == 0, listed.stderr
        return [json.loads(line) for line in listed.stdout.splitlines()]

    def explain(self) -> str:
        """What to read when a wait gives up: the newest events, the dispatches and each
        runner's output."""
        parts = [f"events: {self.cli('events', '--limit', '30').stdout}"]
        parts += [f"dispatches: {self.cli('dispatches', '--all').stdout}"]
        parts += [f"runner {r.name}: {r.output()}\n{r.screens()}" for r in self.runners]
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop every runner (and its tmux server), then ``looprelay up``."""
        for runner in self.runners:
            runner.stop()
        self.stack.close()
        self.stack.up.stop(signal.SIGKILL)
