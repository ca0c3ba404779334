"""The sandbox around untrusted sessions: its argv (pure), what a command inside it can reach
(real bubblewrap), which dispatches the applier wraps, and the real Claude binary inside it.

The real-bubblewrap tests skip where bwrap cannot make a sandbox, unless
``LOOPRELAY_REQUIRE_SANDBOX=1`` (CI, which installs Debian's bubblewrap), where they fail.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from looprelay.agent import harness
from looprelay.agent.children import run_child
from looprelay.agent.sandbox import (
    NAMESPACES,
    Layout,
    Probe,
    Sandbox,
    sandbox_argv,
    sandbox_available,
)
from looprelay.core.model import PullRequestHead
from looprelay.core.prsessions import tmux_session_name
from looprelay.wire.runner_api import Dispatch
from tests.agent.conftest import SESSION_ID, Rig, make_dispatch
from tests.claude_cli import ClaudeHome, UserMessage, read_user_messages
from tests.fake_harness import DEADLINE_SECONDS, FakeHarness, wait_until

PULL_REQUEST = "github:octo/repo#16"
"""The rig's pull request (``refs/pull/16/head``), whose own session a head names."""


class TestArgv:
    LAYOUT = Layout(
        system=(("/usr", None), ("/bin", "usr/bin")),
        home=Path("/home/op"),
        tree=Path("/home/op/ws/loop-x"),
        writable=(Path("/home/op/.claude"), Path("/home/op/.claude.json")),
        readable=(Path("/home/op/.cache/claude-bin"),),
        hidden=(
            (Path("/home/op/.config/looprelay/runner.json"), False),
            (Path("/usr/local/etc/runner.json"), False),
            (Path("/home/op/.claude/looprelay-state"), True),
            (Path("/home/op/ws"), True),
        ),
        unset=("GH_TOKEN",),
    )

    def test_home_is_emptied_before_the_tree_and_config_are_bound_back(self) -> None:
        argv = sandbox_argv(
            ["/home/op/.cache/claude-bin/claude", "-p"], bwrap="bw", layout=self.LAYOUT
        )
        assert argv == [
            "bw",
            *NAMESPACES,
            *("--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin"),
            *("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/home/op"),
            *("--ro-bind", "/home/op/.cache/claude-bin", "/home/op/.cache/claude-bin"),
            *("--bind", "/home/op/.claude", "/home/op/.claude"),
            *("--bind", "/home/op/.claude.json", "/home/op/.claude.json"),
            *("--bind", "/home/op/ws/loop-x", "/home/op/ws/loop-x"),
            # Covered where a mount shows them: under /usr, and inside the bound config; the
            # credentials under the emptied HOME and the tree's own ancestor need no cover.
            *("--ro-bind", os.devnull, "/usr/local/etc/runner.json"),
            *("--tmpfs", "/home/op/.claude/looprelay-state"),
            *("--unsetenv", "GH_TOKEN", "--setenv", "TMPDIR", "/tmp"),
            *("--chdir", "/home/op/ws/loop-x", "--", "/home/op/.cache/claude-bin/claude", "-p"),
        ]

    def test_no_network_namespace_the_harness_needs_its_api(self) -> None:
        assert "--unshare-net" not in NAMESPACES and "--unshare-all" not in NAMESPACES
        assert {"--die-with-parent", "--new-session", "--unshare-pid"} <= set(NAMESPACES)


def _operator_home(tmp_path: Path) -> dict[str, Path]:
    """A HOME with the runner's secrets, Claude's config, ssh keys and two session trees."""
    home = tmp_path / "home"
    paths = {
        "credentials": home / ".config" / "looprelay" / "runner.json",
        "ledger": home / ".local" / "state" / "looprelay-runner" / "r1" / "ledger.db",
        "ssh": home / ".ssh" / "id_ed25519",
        "settings": home / ".claude" / "settings.json",
        "config": home / ".claude.json",
        "other_tree": home / "ws" / "loop-other" / "notes.txt",
        "tree": home / "ws" / "loop-fork",
    }
    for name, path in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if name != "tree":
            path.write_text(f"{name} secret\n")
    paths["tree"].mkdir()
    paths["home"] = home
    return paths


def _inside(probe: Probe, paths: dict[str, Path], script: str, *, mode: str = "untrusted") -> str:
    """Run ``sh -c script`` as a session runs: the same builder, fed a shell for a harness."""
    sandbox = Sandbox(
        mode=mode,
        probe=probe,
        hidden=(paths["credentials"], paths["ledger"].parent),
        environ={"HOME": str(paths["home"])},
    )
    argv = sandbox.wrap(
        ["/bin/sh", "-c", script], harness_name=harness.CLAUDE, tree=paths["tree"], trusted=False
    )
    done = run_child(argv, cwd=paths["tree"], timeout_seconds=DEADLINE_SECONDS)
    assert done.exit_code == 0, done.stderr
    return done.stdout


class TestWhatASessionReaches:
    def test_the_runners_credentials_state_and_other_files_are_hidden(
        self, bwrap: Probe, tmp_path: Path
    ) -> None:
        paths = _operator_home(tmp_path)
        names = ("credentials", "ledger", "ssh", "other_tree")
        script = "".join(
            f"if cat {paths[n]} 2>/dev/null; then echo {n}: read; else echo {n}: hidden; fi\n"
            for n in names
        )
        script += f"ls -A {paths['home']}; ls -A {paths['ledger'].parent.parent} 2>&1 | wc -l\n"
        said = _inside(bwrap, paths, script).splitlines()
        assert said[: len(names)] == [f"{n}: hidden" for n in names]
        assert "secret" not in "\n".join(said)
        # Only what is bound back shows in HOME: the config and the path down to the tree.
        assert said[len(names) :] == [".claude", ".claude.json", "ws", "1"]

    def test_its_tree_and_the_harness_config_are_writable_and_the_system_is_not(
        self, bwrap: Probe, tmp_path: Path
    ) -> None:
        paths = _operator_home(tmp_path)
        script = (
            f"echo built > {paths['tree']}/out.txt\n"
            f"cat {paths['settings']}\n"
            f"echo seen >> {paths['home']}/.claude/history\n"
            f"echo kept >> {paths['home']}/.scratch\n"
            "if touch /usr/looprelay-probe 2>/dev/null; then echo usr: written; "
            "else echo usr: read-only; fi\n"
            "echo $$\n"
        )
        said = _inside(bwrap, paths, script).splitlines()
        assert said == ["settings secret", "usr: read-only", "2"]  # a PID namespace of its own
        assert (paths["tree"] / "out.txt").read_text() == "built\n"
        assert (paths["home"] / ".claude" / "history").read_text() == "seen\n"
        assert not (paths["home"] / ".scratch").exists()  # the rest of HOME was a tmpfs

    def test_an_npm_cli_finds_its_package_tree_and_an_interpreter_under_home(
        self, bwrap: Probe, tmp_path: Path
    ) -> None:
        # Codex's and Copilot's launchers start a platform binary from a sibling package, and
        # nvm puts node under HOME: with only the launcher's directory shown, both failed.
        paths = _operator_home(tmp_path)
        modules = paths["home"] / ".npm-global" / "lib" / "node_modules"
        launcher = modules / "@acme" / "cli" / "bin" / "cli.js"
        native = modules / "@acme" / "cli-linux-x64" / "native.txt"
        interpreter = paths["home"] / ".nvm" / "bin" / "lrnode"
        launcher.parent.mkdir(parents=True)
        native.parent.mkdir(parents=True)
        interpreter.parent.mkdir(parents=True)
        native.write_text("native ran\n")
        launcher.write_text(
            "#!/usr/bin/env lrnode\n"
            'cat "$(dirname "$0")/../../cli-linux-x64/native.txt"\n'
            f"cat {paths['ssh']} 2>/dev/null || echo ssh: hidden\n"
        )
        interpreter.write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
        for script in (launcher, interpreter):
            script.chmod(0o755)
        environ = {"HOME": str(paths["home"]), "PATH": f"{interpreter.parent}:/usr/bin:/bin"}
        sandbox = Sandbox(mode="untrusted", probe=bwrap, environ=environ)
        argv = sandbox.wrap(
            [str(launcher)], harness_name=harness.CLAUDE, tree=paths["tree"], trusted=False
        )
        done = run_child(argv, cwd=paths["tree"], env=environ, timeout_seconds=DEADLINE_SECONDS)
        assert done.exit_code == 0, done.stderr
        assert done.stdout.splitlines() == ["native ran", "ssh: hidden"]

    def test_a_tree_holding_home_is_refused(self, bwrap: Probe, tmp_path: Path) -> None:
        paths = _operator_home(tmp_path)
        paths["tree"] = paths["home"]
        with pytest.raises(Exception) as caught:
            _inside(bwrap, paths, "true")
        assert getattr(caught.value, "reason", "") == "sandbox-unavailable"


def _recording_bwrap(directory: Path) -> Probe:
    """A stand-in for bwrap that records its argv, then runs what follows ``--`` unsandboxed
    (the fake harness writes beside itself, which the real sandbox makes read-only)."""
    directory.mkdir()
    script = directory / "bwrap"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "log = os.path.join(os.path.dirname(sys.argv[0]), 'calls.jsonl')\n"
        "with open(log, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "rest = sys.argv[sys.argv.index('--') + 1 :]\n"
        "os.execv(rest[0], rest)\n"
    )
    script.chmod(0o755)
    return Probe(str(script))


def _wrapped(directory: Path) -> list[list[str]]:
    log = directory / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _on_pull_request(rig: Rig, *, fork: bool | None, **fields: object) -> Dispatch:
    """A dispatch for the rig's pull request's own session, its head a fork's or the base
    repository's own; with ``fork`` None, one for the work item's session (no head)."""
    if fork is None:
        return make_dispatch(**fields)
    sha = rig.repos.tip("octo/repo", "refs/pull/16/head")
    head = PullRequestHead(fork=fork, sha=sha, base_ref="main")
    return make_dispatch(
        endpoint=PULL_REQUEST, session_name=tmux_session_name(PULL_REQUEST), head=head, **fields
    )


class TestWhichSessionsAreWrapped:
    @pytest.mark.parametrize(
        ("mode", "fork", "wrapped"),
        [
            ("untrusted", True, True),
            ("untrusted", False, False),
            ("untrusted", None, False),
            ("always", None, True),
            ("always", True, True),
            ("never", True, False),
        ],
    )
    def test_headless_turns(
        self,
        rig: Rig,
        fake_harness: FakeHarness,
        tmp_path: Path,
        mode: str,
        fork: bool | None,
        wrapped: bool,
    ) -> None:
        rig.applier.sandbox = Sandbox(mode=mode, probe=_recording_bwrap(tmp_path / "bw"))
        result = rig.applier.apply(_on_pull_request(rig, fork=fork, runner_kind="process"))
        assert result.status == "done", result.detail
        calls = _wrapped(tmp_path / "bw")
        assert len(calls) == int(wrapped)
        if wrapped:
            [start] = fake_harness.starts()
            tree = start["cwd"]
            assert calls[0][calls[0].index("--chdir") :] == [
                *("--chdir", tree, "--", os.path.realpath(fake_harness.claude), "-p"),
                *("--output-format", "json", "--session-id", SESSION_ID, "--model", "opus"),
            ]
            noted = [e for e in result.events if e["name"] == "session.sandboxed"]
            assert noted == [{"name": "session.sandboxed", "data": {"tree": tree, "mode": mode}}]

    @pytest.mark.parametrize(("fork", "speaks"), [(True, False), (False, True), (None, True)])
    def test_only_a_trusted_head_gets_the_sessions_identity(
        self, rig: Rig, fake_harness: FakeHarness, fork: bool | None, speaks: bool
    ) -> None:
        rig.applier.sandbox = Sandbox(mode="never")
        rig.applier.session_env = lambda d: {"LOOPRELAY_SESSION_TOKEN": f"lrses_{d.dispatch_id}"}
        result = rig.applier.apply(_on_pull_request(rig, fork=fork, runner_kind="process"))
        assert result.status == "done", result.detail
        [start] = fake_harness.starts()
        assert ("LOOPRELAY_SESSION_TOKEN" in start["env"]) is speaks

    def test_a_hosted_fork_session_runs_its_harness_inside_and_gets_its_boot_paste(
        self, rig: Rig, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        rig.applier.sandbox = Sandbox(mode="untrusted", probe=_recording_bwrap(tmp_path / "bw"))
        assert rig.applier.apply(_on_pull_request(rig, fork=True, prompt="review it")).status == (
            "spawned"
        )
        (start,) = fake_harness.wait_ready()
        [call] = _wrapped(tmp_path / "bw")
        assert call[call.index("--") + 1 :] == [
            os.path.realpath(fake_harness.claude),
            *("--session-id", start["argv"][1], "--model", "opus"),
        ]
        wait_until(lambda: "review it" in fake_harness.received(start["pid"]))

    @pytest.mark.parametrize("runner_kind", ["tmux", "process"])
    def test_without_bwrap_fork_sessions_are_refused_and_others_served(
        self,
        rig: Rig,
        fake_harness: FakeHarness,
        monkeypatch: pytest.MonkeyPatch,
        runner_kind: str,
    ) -> None:
        with monkeypatch.context() as patch:
            patch.setenv("PATH", f"{fake_harness.bin}:/nowhere")  # no bwrap on it
            rig.applier.sandbox = Sandbox(mode="untrusted", probe=sandbox_available())
        refused = rig.applier.apply(_on_pull_request(rig, fork=True, runner_kind=runner_kind))
        assert (refused.status, refused.reason, refused.retryable) == (
            "failed",
            "sandbox-unavailable",
            False,
        )
        assert "bwrap is not on PATH" in refused.detail
        assert fake_harness.starts() == []
        assert rig.ledger.session(tmux_session_name(PULL_REQUEST)) is None  # no tree was made
        served = rig.applier.apply(make_dispatch(runner_kind=runner_kind, dispatch_id="d-2"))
        assert served.status in ("spawned", "done"), served.detail


class TestRealClaudeInside:
    def test_a_headless_turn_starts_records_its_prompt_and_returns_its_result(
        self, bwrap: Probe, claude_home: ClaudeHome, tmp_path: Path
    ) -> None:
        runner_json = claude_home.home / ".config" / "looprelay" / "runner.json"
        runner_json.parent.mkdir(parents=True)
        runner_json.write_text('{"secret": "s"}')
        tree = tmp_path / "workspace" / "loop-fork"
        tree.mkdir(parents=True)
        environ = claude_home.environ()
        sandbox = Sandbox(mode="untrusted", probe=bwrap, hidden=(runner_json,), environ=environ)
        session_id = str(uuid.uuid4())
        argv = harness.headless_argv(
            binary=str(claude_home.claude),
            harness=harness.CLAUDE,
            session_id=session_id,
            resume=False,
        )
        wrapped = sandbox.wrap(argv, harness_name=harness.CLAUDE, tree=tree, trusted=False)
        prompt = f"Review the fork's change {uuid.uuid4()}"
        done = run_child(
            wrapped,
            cwd=tree,
            env=environ,
            stdin=harness.prompt_input(prompt),
            timeout_seconds=DEADLINE_SECONDS * 2,
        )
        assert done.exit_code == 1, done.stderr
        result = json.loads(done.stdout)
        assert (result["type"], result["is_error"], result["session_id"]) == (
            "result",
            True,
            session_id,
        )
        assert read_user_messages(claude_home.home) == [
            UserMessage(cwd=str(tree.resolve()), session_id=session_id, text=prompt)
        ]
