"""Build a runner agent from the command line's choices, after checking them.

Everything an operator can get wrong is checked here, before the agent takes any work, and
refused with one line that says what to fix: credentials, each checkout (a git work tree of
the repository it names), the workspace root, the harness binaries, capacity, harness flags,
and a state directory no other agent is using.
"""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from looprelay.agent import harness, harnesses
from looprelay.agent.apply import Applier
from looprelay.agent.client import RunnerClient
from looprelay.agent.credentials import Credentials, read_credentials
from looprelay.agent.ledger import Ledger
from looprelay.agent.prepare import SessionPreparer
from looprelay.agent.run import Agent, AgentState
from looprelay.agent.sandbox import SANDBOX_MODES, Probe, Sandbox, sandbox_available
from looprelay.agent.session_env import SessionEnv
from looprelay.agent.statedir import StateLock, default_state_dir
from looprelay.agent.tmux import TmuxTerminal
from looprelay.agent.workspaces import Workspaces, parse_checkout_pairs
from looprelay.core.attach import runner_socket
from looprelay.errors import ConfigError, RunnerError

LEDGER_FILE = "ledger.db"
STATUS_FILE = "status.json"
_HOSTNAME = re.compile(r"[A-Za-z0-9._-]{1,253}")
WORKTREES_DIR = "worktrees"
"""Under the state directory: worktrees of operator checkouts when no workspace is given."""


@dataclass(frozen=True)
class RunnerOptions:
    """What ``looprelay runner run`` was told; every default is the CLI's."""

    credentials_path: Path
    state_dir: Path | None = None
    checkout_pairs: Sequence[str] = ()
    workspace: Path | None = None
    strategy: str = "worktree"
    clone_protocol: str = "https"
    git_host: str = "github.com"
    git_timeout_seconds: float = 300.0
    keep_checkout_on_close: bool = False
    tmux_socket: str | None = None
    capacity: int = 2
    poll_wait_seconds: float = 300.0
    """What a poll asks for; the server caps it (``runners.pollWaitSeconds``)."""
    keep_session_on_terminate: bool = True
    harness_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    harnesses: Sequence[str] = ()
    """The harnesses to serve (``--harness``); empty: every one found on ``PATH``."""
    sandbox: str = "untrusted"


def default_tmux_socket(runner_id: str) -> str:
    """Return the tmux socket of a runner: its own, so two runners never share sessions."""
    return runner_socket(runner_id)


_SECOND_AGENT_ADVICE = (
    "one agent per runner (the server refuses a second one on the same credentials); "
    "to run another runner on this machine, register it (`looprelay runner register`) and "
    "start it with its own --credentials"
)


def build_agent(options: RunnerOptions) -> Agent:
    """Check ``options`` and assemble the agent, holding its state directory's lock.

    Raises ``ConfigError`` (one line naming the fix) for anything the operator must change.
    """
    if options.capacity < 1:
        raise ConfigError(f"--capacity {options.capacity}: a runner applies at least 1 at once")
    credentials = read_credentials(options.credentials_path)
    state_dir = options.state_dir or default_state_dir(credentials.runner_id)
    locks = [StateLock.acquire(state_dir, option=_SECOND_AGENT_ADVICE)]
    try:
        agent_id = uuid.uuid4().hex  # new at each start (docs/architecture.md, one agent)
        replaces = locks[0].claim_agent_id(agent_id)
        if options.workspace is not None:
            # Session trees are named after their work item: two agents on one root would
            # share a tree whenever they served the same issue.
            locks.append(
                StateLock.acquire(options.workspace, option="give this one its own --workspace")
            )
        agent = _assemble(options, credentials, state_dir, locks)
        agent.agent_id, agent.replaces, agent.identity = agent_id, replaces, locks[0]
        agent.hostname = reported_hostname()
        return agent
    except BaseException:
        for lock in locks:
            lock.release()
        raise


def _assemble(
    options: RunnerOptions, credentials: Credentials, state_dir: Path, locks: list[StateLock]
) -> Agent:
    configured = parse_checkout_pairs(options.checkout_pairs)
    workspaces = Workspaces(
        configured=configured,
        root=options.workspace,
        worktrees=state_dir / WORKTREES_DIR,
        strategy=options.strategy,
        protocol=options.clone_protocol,
        host=options.git_host,
        git_timeout_seconds=options.git_timeout_seconds,
        keep_on_close=options.keep_checkout_on_close,
    )
    workspaces.check()
    binaries = served_harnesses(options.harnesses)
    socket_name = options.tmux_socket or default_tmux_socket(credentials.runner_id)
    terminal = TmuxTerminal(socket_name)
    sandbox = runner_sandbox(options, state_dir)
    ledger = Ledger(state_dir / LEDGER_FILE)
    repositories = sorted(configured)

    def describe() -> dict[str, Any]:
        # No "capacity": ``capacity`` counts workers applying at once, while the server's
        # capacity is the sessions the runner may hold, fixed when it registered.
        return {
            "version": version("looprelay"),
            "repositories": repositories,
            "workspace": options.workspace is not None,
            "sessions": ledger.session_count(),
        }

    client = RunnerClient(credentials, source=options.credentials_path)
    return Agent(
        client=client,
        applier=Applier(
            terminal,
            ledger,
            SessionPreparer(workspaces, ledger, options.harness_args, served=frozenset(binaries)),
            keep_session_on_terminate=options.keep_session_on_terminate,
            sandbox=sandbox,
            session_env=SessionEnv(client),
        ),
        state=AgentState(state_dir / STATUS_FILE),
        describe=describe,
        tmux_socket=socket_name,
        capacity=options.capacity,
        poll_wait_seconds=options.poll_wait_seconds,
        locks=locks,
        harnesses=tuple(sorted(binaries)),
        serving=[
            *serving_lines(options, binaries, state_dir, socket_name),
            sandbox_line(sandbox),
        ],
    )


def reported_hostname() -> str:
    """This machine's name as a heartbeat may carry it ("" when it has an odd one)."""
    name = socket.gethostname()
    return name if _HOSTNAME.fullmatch(name) else ""


def runner_sandbox(options: RunnerOptions, state_dir: Path) -> Sandbox:
    """Return the sandbox ``options`` ask for, probed once; it hides the runner's credentials
    and state directory. Raises ``ConfigError`` for an unknown mode, and for ``always`` where
    bubblewrap does not work (no session could be served)."""
    if options.sandbox not in SANDBOX_MODES:
        raise ConfigError(f"--sandbox {options.sandbox!r} is not one of {', '.join(SANDBOX_MODES)}")
    probe = Probe(None, "--sandbox never") if options.sandbox == "never" else sandbox_available()
    if options.sandbox == "always" and probe.bwrap is None:
        raise ConfigError(
            f"--sandbox always, but {probe.reason}; install bubblewrap or run with "
            "--sandbox untrusted"
        )
    hidden = (options.credentials_path.absolute(), state_dir.absolute())
    return Sandbox(mode=options.sandbox, probe=probe, hidden=hidden)


def sandbox_line(sandbox: Sandbox) -> str:
    """Say at start whether sessions run sandboxed, for ``runner run``'s serving lines."""
    if sandbox.mode == "never":
        return "sandbox never: no session runs in bubblewrap"
    if sandbox.probe.bwrap is None:
        return (
            f"sandbox {sandbox.mode}: UNAVAILABLE ({sandbox.probe.reason}); fork pull-request "
            "sessions are refused (sandbox-unavailable)"
        )
    which = "every session" if sandbox.mode == "always" else "fork pull-request sessions"
    return f"sandbox {sandbox.mode}: {which} run in bubblewrap ({sandbox.probe.bwrap})"


def served_harnesses(chosen: Sequence[str]) -> dict[str, str]:
    """Return the harnesses to serve with their binaries' absolute paths: each of ``chosen``
    (``--harness``), or every one on PATH when none was chosen. Raises ``ConfigError`` for an
    unknown name, a chosen one not on PATH, or none found at all."""
    for name in chosen:
        if name not in harnesses.REGISTRY:
            raise ConfigError(f"--harness {name} is not one of {', '.join(harnesses.NAMES)}")
    found = {}
    for name in dict.fromkeys(chosen or harnesses.NAMES):
        try:
            found[name] = harness.resolve_binary(name)
        except RunnerError as exc:
            if chosen:
                raise ConfigError(f"--harness {name}: {exc}") from None
    if not found:
        raise ConfigError(
            f"none of {', '.join(harnesses.NAMES)} is on PATH; install one (Claude Code: "
            "npm install -g @anthropic-ai/claude-code) or fix PATH for the agent"
        )
    return found


def serving_lines(
    options: RunnerOptions, binaries: Mapping[str, str], state_dir: Path, socket_name: str
) -> list[str]:
    """Say what this runner serves, in the lines ``runner run`` prints at start."""
    lines = [
        f"checkout {repository}: {path} (sessions get worktrees of it)"
        for repository, path in sorted(parse_checkout_pairs(options.checkout_pairs).items())
    ]
    if options.workspace is not None:
        lines.append(
            f"workspace {options.workspace}: any repository and pull-request sessions "
            f"({options.strategy}, {options.clone_protocol} clones from {options.git_host})"
        )
    for name, path in sorted(binaries.items()):
        extra = " ".join(options.harness_args.get(name, ())) or "no extra flags"
        lines.append(f"harness {name}: {path} ({extra})")
    lines.append(f"capacity {options.capacity}; state {state_dir}")
    lines.append(f"attach: tmux -L {socket_name} ls, then tmux -L {socket_name} attach -t NAME")
    return lines
