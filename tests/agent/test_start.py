"""``runner run``'s checks at start: each mistake is one line saying what to fix, before any
work is taken; each registration keeps its own state, and no two agents share one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from looprelay.agent.credentials import Credentials, write_credentials
from looprelay.agent.sandbox import Probe
from looprelay.agent.start import RunnerOptions, build_agent, default_tmux_socket
from looprelay.agent.statedir import default_state_dir
from looprelay.errors import ConfigError
from tests.fake_harness import FakeHarness
from tests.gitrepos import GitRepos, offline_github

RUNNER_A = "r-00000000000000aa"
RUNNER_B = "r-00000000000000bb"


def _credentials(tmp_path: Path, runner_id: str) -> Path:
    path = tmp_path / f"{runner_id}.json"
    write_credentials(
        path,
        Credentials(server="http://127.0.0.1:9", runner_id=runner_id, secret="s", name="box"),
    )
    return path


@pytest.fixture
def repos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GitRepos:
    made = offline_github(tmp_path / "git", monkeypatch)
    made.create("octo/repo")
    return made


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "xdg-state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def _options(
    tmp_path: Path, checkout: Path, runner_id: str = RUNNER_A, **more: object
) -> RunnerOptions:
    return RunnerOptions(
        credentials_path=_credentials(tmp_path, runner_id),
        checkout_pairs=[f"octo/repo={checkout}"],
        **more,  # type: ignore[arg-type]
    )


class TestEachRegistrationKeepsItsOwnState:
    def test_the_default_state_and_socket_are_keyed_by_the_runner_id(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, fake_harness: FakeHarness
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        first = build_agent(_options(tmp_path, checkout, RUNNER_A))
        second = build_agent(_options(tmp_path, checkout, RUNNER_B))

        assert first.state.path.parent == state_home / "looprelay-runner" / RUNNER_A
        assert second.state.path.parent == state_home / "looprelay-runner" / RUNNER_B
        assert default_state_dir(RUNNER_A) == first.state.path.parent
        assert (first.tmux_socket, second.tmux_socket) == (
            default_tmux_socket(RUNNER_A),
            default_tmux_socket(RUNNER_B),
        )
        assert first.tmux_socket != second.tmux_socket

    def test_a_second_agent_on_the_same_state_is_refused_until_the_first_is_gone(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, fake_harness: FakeHarness
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        first = build_agent(_options(tmp_path, checkout))

        with pytest.raises(ConfigError) as refused:
            build_agent(_options(tmp_path, checkout))
        assert f"another runner agent (pid {os.getpid()})" in str(refused.value)
        # Not `--state`: that starts a second agent on the same credentials.
        assert "--state" not in str(refused.value)
        assert "own --credentials" in str(refused.value)

        for lock in first.locks:
            lock.release()
        build_agent(_options(tmp_path, checkout))  # free again

    def test_each_start_names_a_new_agent_that_replaces_the_one_before_on_its_state(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, fake_harness: FakeHarness
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        first = build_agent(_options(tmp_path, checkout))
        for lock in first.locks:
            lock.release()
        second = build_agent(_options(tmp_path, checkout))
        assert first.agent_id and first.replaces == ()
        assert second.agent_id not in ("", first.agent_id)
        assert second.replaces == (first.agent_id,)
        elsewhere = build_agent(_options(tmp_path, checkout, state_dir=tmp_path / "other"))
        assert elsewhere.replaces == ()

    def test_two_agents_cannot_share_a_workspace_root(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, fake_harness: FakeHarness
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        workspace = tmp_path / "ws"
        build_agent(_options(tmp_path, checkout, RUNNER_A, workspace=workspace))

        with pytest.raises(ConfigError, match="its own --workspace"):
            build_agent(_options(tmp_path, checkout, RUNNER_B, workspace=workspace))

    def test_another_process_holding_the_state_is_named(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, fake_harness: FakeHarness
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        state = tmp_path / "shared-state"
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; "
                "from looprelay.agent.statedir import StateLock; "
                "StateLock.acquire(Path(sys.argv[1])); print('held', flush=True); "
                "sys.stdin.read()",
                str(state),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
                build_agent(_options(tmp_path, checkout, state_dir=state))
        finally:
            holder.kill()
            holder.wait()


class TestOneLineRefusals:
    def test_capacity_below_one(self, tmp_path: Path, repos: GitRepos) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        with pytest.raises(ConfigError, match="at least 1"):
            build_agent(_options(tmp_path, checkout, capacity=0))

    def test_no_harness_on_path(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        only_git = tmp_path / "only-git"
        only_git.mkdir()
        (only_git / "git").symlink_to(shutil.which("git") or "/usr/bin/git")
        monkeypatch.setenv("PATH", str(only_git))
        with pytest.raises(
            ConfigError, match=r"none of claude, cursor-agent, codex, .* is on PATH"
        ):
            build_agent(_options(tmp_path, checkout))

    def test_a_checkout_that_is_not_a_work_tree(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, fake_harness: FakeHarness
    ) -> None:
        plain = tmp_path / "plain"
        plain.mkdir()
        with pytest.raises(ConfigError) as refused:
            build_agent(_options(tmp_path, plain))
        assert str(plain) in str(refused.value)
        assert "\n" not in str(refused.value)

    def test_the_state_lock_is_let_go_when_a_later_check_fails(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, fake_harness: FakeHarness
    ) -> None:
        plain = tmp_path / "plain"
        plain.mkdir()
        with pytest.raises(ConfigError):
            build_agent(_options(tmp_path, plain))
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        build_agent(_options(tmp_path, checkout))  # not refused as "another agent"


class TestWhatItServes:
    def test_the_lines_it_prints_name_checkouts_workspace_harness_and_attach(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, fake_harness: FakeHarness
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        agent = build_agent(
            _options(
                tmp_path,
                checkout,
                workspace=tmp_path / "ws",
                harness_args={"claude": ("--model=opus",)},
            )
        )
        text = "\n".join(agent.serving)

        assert f"checkout octo/repo: {checkout}" in text
        assert f"workspace {tmp_path / 'ws'}: any repository" in text
        assert f"harness claude: {fake_harness.claude} (--model=opus)" in text
        assert f"tmux -L {default_tmux_socket(RUNNER_A)}" in text


class TestHarnessChoice:
    def test_harness_picks_which_of_those_on_path_it_serves(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, fake_harness: FakeHarness
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        everything = build_agent(_options(tmp_path, checkout))
        assert everything.harnesses == ("claude", "cursor-agent")
        for lock in everything.locks:
            lock.release()

        chosen = build_agent(_options(tmp_path, checkout, harnesses=("cursor-agent",)))
        text = "\n".join(chosen.serving)

        assert chosen.harnesses == ("cursor-agent",)
        assert f"harness cursor-agent: {fake_harness.bin / 'cursor-agent'}" in text
        assert "harness claude" not in text

    def test_a_chosen_harness_missing_from_path_is_refused_in_one_line(
        self, tmp_path: Path, repos: GitRepos, state_home: Path, fake_harness: FakeHarness
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        with pytest.raises(ConfigError) as refused:
            build_agent(_options(tmp_path, checkout, harnesses=("claude", "gemini")))
        assert str(refused.value) == (
            "--harness gemini: gemini is not on this runner's PATH; install it or fix PATH for "
            "the agent"
        )


def _git_only(tmp_path: Path) -> Path:
    """A PATH directory with git and nothing else (no bwrap)."""
    tools = tmp_path / "git-only"
    tools.mkdir()
    (tools / "git").symlink_to(shutil.which("git") or "/usr/bin/git")
    return tools


class TestSandboxChoice:
    @pytest.mark.parametrize(
        ("mode", "without_bwrap", "line"),
        [
            ("never", False, "sandbox never: no session runs in bubblewrap"),
            (
                "untrusted",
                True,
                "sandbox untrusted: UNAVAILABLE (bwrap is not on PATH (Debian: apt-get install "
                "bubblewrap)); fork pull-request sessions are refused (sandbox-unavailable)",
            ),
        ],
    )
    def test_runner_run_says_at_start_whether_the_sandbox_is_available(
        self,
        tmp_path: Path,
        repos: GitRepos,
        state_home: Path,
        fake_harness: FakeHarness,
        monkeypatch: pytest.MonkeyPatch,
        mode: str,
        without_bwrap: bool,
        line: str,
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        if without_bwrap:
            monkeypatch.setenv("PATH", f"{fake_harness.bin}:{_git_only(tmp_path)}")
        agent = build_agent(_options(tmp_path, checkout, sandbox=mode))
        assert agent.serving[-1] == line
        assert agent.applier.sandbox.mode == mode
        assert agent.applier.sandbox.hidden == (
            (tmp_path / f"{RUNNER_A}.json").absolute(),
            agent.state.path.parent.absolute(),
        )

    def test_the_default_sandboxes_fork_sessions_where_bwrap_works(
        self,
        tmp_path: Path,
        repos: GitRepos,
        state_home: Path,
        fake_harness: FakeHarness,
        bwrap: Probe,
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        agent = build_agent(_options(tmp_path, checkout))
        bwrap = agent.applier.sandbox.probe.bwrap
        assert bwrap is not None
        assert agent.serving[-1] == (
            f"sandbox untrusted: fork pull-request sessions run in bubblewrap ({bwrap})"
        )

    def test_always_without_bwrap_is_refused_at_start(
        self,
        tmp_path: Path,
        repos: GitRepos,
        state_home: Path,
        fake_harness: FakeHarness,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        monkeypatch.setenv("PATH", f"{fake_harness.bin}:{_git_only(tmp_path)}")
        with pytest.raises(ConfigError, match="--sandbox always, but bwrap is not on PATH"):
            build_agent(_options(tmp_path, checkout, sandbox="always"))
