"""The whole path on one machine, as an operator runs it: `looprelay up`, a registered
`looprelay runner run` with a fake `claude` on PATH, and comments posted with `looprelay send`.

An authorized `the-loop start` on an armed issue becomes a live tmux session whose first prompt
carries the work-item directive; a following comment is pasted into that same session, in order;
`tmux -L <socket> attach` names it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_harness import FakeHarness, wait_until
from tests.gitrepos import git, operator_checkout
from tests.samples import payload
from tests.test_up import LOOPRELAY, UpProcess, cli

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"


@pytest.fixture
def socket_name() -> Iterator[str]:
    name = f"lr-e2e-{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True, check=False)


@pytest.fixture
def stack(tmp_path: Path, fake_harness: FakeHarness) -> Iterator[UpProcess]:
    config = tmp_path / "looprelay.yaml"
    config.write_text("routing:\n  authorizedUsers: [codertocat]\n")
    up = UpProcess(tmp_path / "data", "--config", str(config))
    yield up
    up.stop(signal.SIGKILL)


def _send(up: UpProcess, tmp_path: Path, event: str, body: dict[str, Any]) -> None:
    path = tmp_path / f"{uuid.uuid4().hex}.json"
    path.write_text(json.dumps(body))
    sent = cli(
        "send", str(path), "--event", event, "--url", up.webhook_url, "--data", str(up.data_dir)
    )
    assert sent.returncode == 0 and sent.stdout.startswith("202 "), sent.stdout + sent.stderr


class TestOneMachine:
    def test_a_start_comment_spawns_a_session_and_the_next_comment_is_pasted_into_it(
        self, stack: UpProcess, tmp_path: Path, fake_harness: FakeHarness, socket_name: str
    ) -> None:
        token = cli("runners", "token", "--data", str(stack.data_dir)).stdout.strip()
        server = stack.webhook_url.removesuffix("/webhook")
        credentials = tmp_path / "runner.json"
        registered = cli(
            "runner",
            "register",
            "--server",
            server,
            "--token",
            token,
            "--name",
            "e2e",
            "--credentials",
            str(credentials),
        )
        assert registered.returncode == 0, registered.stderr
        checkout = operator_checkout(tmp_path / "checkout", "codertocat/hello-world")
        state = tmp_path / "runner-state"
        runner = subprocess.Popen(
            [
                *LOOPRELAY,
                "runner",
                "run",
                "--credentials",
                str(credentials),
                "--checkout",
                f"codertocat/hello-world={checkout}",
                "--state",
                str(state),
                "--tmux-socket",
                socket_name,
                "--poll-wait",
                "2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=os.environ.copy(),
        )
        try:
            labeled = payload("issues.labeled")
            labeled["label"]["name"] = "the-loop: auto-execute"
            _send(stack, tmp_path, "issues", labeled)
            start = payload("issue_comment.created")
            start["comment"]["body"] = "Ready when you are: the-loop start"
            _send(stack, tmp_path, "issue_comment", start)

            (spawned,) = fake_harness.wait_ready(1)
            # A worktree of the operator's checkout, at its commit, never the checkout itself.
            tree = Path(spawned["cwd"])
            assert tree.parent == state / "worktrees" and tree.name.startswith("loop-github-")
            assert git("rev-parse", "HEAD", cwd=tree) == git("rev-parse", "HEAD", cwd=checkout)
            assert spawned["argv"][0] == "--session-id"
            assert len(spawned["argv"]) == 2  # the id; the boot prompt is pasted, never in argv
            boot_prompt = wait_until(
                lambda: (
                    PASTE_END in fake_harness.received(spawned["pid"])
                    and fake_harness.received(spawned["pid"])
                )
            )
            assert boot_prompt.count(PASTE_START) == 1
            assert "## Interaction mode: work-item" in boot_prompt
            assert boot_prompt.index("Interaction mode") < boot_prompt.index("UNTRUSTED")

            follow_up = payload("issue_comment.created")
            follow_up["comment"]["id"] += 1
            follow_up["comment"]["body"] = "Second thought:\nline two\nline three"
            _send(stack, tmp_path, "issue_comment", follow_up)
            pasted = wait_until(
                lambda: (
                    "line three" in fake_harness.received(spawned["pid"])
                    and fake_harness.received(spawned["pid"])
                )
            )
            assert pasted.startswith(boot_prompt) and pasted.count(PASTE_START) == 2
            assert "Second thought:" in pasted and "line two" in pasted
            assert len(fake_harness.starts()) == 1  # the same session, not a second one

            sessions = subprocess.run(
                ["tmux", "-L", socket_name, "ls", "-F", "#S"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            assert len(sessions) == 1 and sessions[0].startswith("loop-github-codertocat")
            status = cli(
                "runner", "status", "--state", str(state), "--tmux-socket", socket_name, "--json"
            )
            [session] = json.loads(status.stdout)["sessions"]
            assert session["attach"] == f"tmux -L {socket_name} attach -t {sessions[0]}"

            runner.send_signal(signal.SIGTERM)
            assert runner.wait(30) == 0
        finally:
            if runner.poll() is None:
                runner.kill()
                runner.wait(10)
        events = cli("events", "--data", str(stack.data_dir), "--json", "--name", "session.spawned")
        [spawn_event] = [json.loads(line) for line in events.stdout.splitlines()]
        assert spawn_event["data"]["interaction"] == "work-item"
        assert spawn_event["data"]["tmux_target"] == sessions[0]

    def test_a_dispatch_no_runner_can_take_waits_and_says_why(
        self, stack: UpProcess, tmp_path: Path
    ) -> None:
        labeled = payload("issues.labeled")
        labeled["label"]["name"] = "the-loop: auto-execute"
        _send(stack, tmp_path, "issues", labeled)
        start = payload("issue_comment.created")
        start["comment"]["body"] = "the-loop start"
        _send(stack, tmp_path, "issue_comment", start)

        def waiting() -> list[dict[str, Any]]:
            listed = cli("dispatches", "--data", str(stack.data_dir), "--json")
            return [json.loads(line) for line in listed.stdout.splitlines()]

        [row] = wait_until(waiting)
        assert (row["kind"], row["status"], row["waiting"]) == (
            "spawn",
            "pending",
            "no-live-runner",
        )
        assert row["work_item"] == "github:codertocat/hello-world#1"
