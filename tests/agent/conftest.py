"""Agent fixtures: real tmux on a throwaway socket, a ledger and an applier (the fake
harness comes from ``tests.fake_harness``).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from looprelay.agent.apply import Applier
from looprelay.agent.ledger import Ledger
from looprelay.agent.prepare import SessionPreparer
from looprelay.agent.sandbox import Probe, sandbox_available
from looprelay.agent.tmux import TmuxTerminal
from looprelay.agent.workspaces import Workspaces
from looprelay.wire.runner_api import Dispatch
from tests import dispatches
from tests.gitrepos import GitRepos, offline_github


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


def make_dispatch(**fields: Any) -> Dispatch:
    """A dispatch for ``github:octo/repo#15``'s own session; ``fields`` override any part."""
    defaults: dict[str, Any] = {
        "dispatch_id": f"d-{uuid.uuid4().hex[:8]}",
        "delivery_id": "delivery-1",
        "session_id": SESSION_ID,
        "prompt": "Work on github:octo/repo#15",
        "created_at": datetime.now(UTC),
    }
    record = dispatches.make_dispatch(repository="octo/repo", number=15, **{**defaults, **fields})
    return Dispatch.from_record(record)


@pytest.fixture
def git_repos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GitRepos:
    """An offline GitHub (``tests.gitrepos``) holding ``octo/repo`` with one commit on main."""
    repos = offline_github(tmp_path / "git", monkeypatch)
    repos.create("octo/repo")
    return repos


@dataclass
class Rig:
    """An applier wired to real tmux, a real ledger file and real git: ``checkout`` is the
    operator's clone of octo/repo, ``workspace`` the root; ``repos`` has pull request 16."""

    applier: Applier
    ledger: Ledger
    terminal: TmuxTerminal
    checkout: Path
    workspace: Path
    repos: GitRepos


@pytest.fixture
def rig(terminal: TmuxTerminal, tmp_path: Path, git_repos: GitRepos) -> Iterator[Rig]:
    """Short grace and probe (0.3 s) keep the suite fast; fresh ids are always FRESH_ID."""
    git_repos.add_pull_request("octo/repo", 16)
    checkout = git_repos.clone("octo/repo", tmp_path / "checkout")
    workspace = tmp_path / "workspace"
    ledger = Ledger(tmp_path / "state" / "ledger.db")
    workspaces = Workspaces(
        configured={"octo/repo": checkout}, root=workspace, worktrees=tmp_path / "worktrees"
    )
    applier = Applier(
        terminal,
        ledger,
        SessionPreparer(workspaces, ledger, {"claude": ("--model", "opus")}),
        kill_grace_seconds=0.3,
        headless_timeout_seconds=10.0,
        resume_probe_seconds=0.3,
        new_uuid=lambda: uuid.UUID(FRESH_ID),
    )
    yield Rig(applier, ledger, terminal, checkout, workspace, git_repos)
    ledger.close()


REQUIRE_SANDBOX_ENV = "LOOPRELAY_REQUIRE_SANDBOX"
"""Set by CI, which installs Debian's bubblewrap: a sandbox test that cannot run fails there."""


@pytest.fixture(scope="module")
def bwrap() -> Probe:
    """A bubblewrap that works here, or a skip (a failure under ``LOOPRELAY_REQUIRE_SANDBOX``)."""
    probe = sandbox_available()
    if probe.bwrap is None:
        if os.environ.get(REQUIRE_SANDBOX_ENV) == "1":
            pytest.fail(f"{REQUIRE_SANDBOX_ENV}=1 but {probe.reason}", pytrace=False)
        pytest.skip(f"no sandbox here: {probe.reason}")
    return probe
