"""Sessions speak on GitHub through the runner API, as the App (issue 27, point 3).

A real ``looprelay runner run`` spawns the fake harness in real tmux; then ``looprelay session
comment`` and ``ask`` run in a shell in a new window of that very tmux session, in the session's
tree, with the environment the agent gave the session. The fake GitHub gets marked comments from
the App; the operator's view shows ``awaiting-input`` after the question; another session's
token is refused.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from looprelay.agent.tmux import TmuxTerminal
from looprelay.core.markers import read_marker
from looprelay.core.prsessions import tmux_session_name
from looprelay.core.replies import GITHUB_MAX_COMMENT_CHARS
from looprelay.wire.runner_api import API_PREFIX, SESSION_ENV, runner_bearer
from tests.agent.test_agent_faults import (
    CONFIG,
    DEADLINE,
    REPOSITORY,
    Relay,
    RunnerProcess,
    checkout,
    launch,
    relay,
)
from tests.dispatches import work_item_ref
from tests.fake_github import APP_LOGIN
from tests.fake_harness import FakeHarness, wait_until
from tests.rigs import status_json

__all__ = ["checkout", "launch", "relay"]  # fixtures this module uses from the faults rig


def _start_session(
    relay: Relay, fake: FakeHarness, number: int, *, starts: int = 1
) -> dict[str, Any]:
    """Seed a spawn for work item ``number``; the fake harness's start record once it runs."""
    relay.seed(number, relay.dispatch(number, prompt=f"work on #{number}"))
    [spawned] = relay.wait_settled(f"dp-{number}-1")
    assert (spawned.status, spawned.result) == ("succeeded", "spawned")
    ready = fake.wait_ready(starts)
    [start] = [s for s in ready if s["env"].get(SESSION_ENV["work_item"]) == _ref(number)]
    return start


def _ref(number: int) -> str:
    return work_item_ref(REPOSITORY, number)


def _in_session(terminal: TmuxTerminal, start: dict[str, Any], command: str) -> tuple[int, str]:
    """Run ``command`` in a shell in a new window of the tmux session the harness of
    ``start`` runs in, in its tree: it inherits the session's environment, but for ``PATH``,
    which tmux takes from the client asking, so the client asks with the harness's. Its exit
    code and output."""
    session, tree = tmux_session_name(start["env"][SESSION_ENV["endpoint"]]), start["cwd"]
    out = Path(tree) / f".out-{abs(hash(command))}"
    script = f"{command} > {shlex.quote(str(out))} 2>&1; echo $? > {shlex.quote(str(out))}.rc"
    subprocess.run(
        [
            *("tmux", "-L", terminal.socket_name, "new-window", "-d", "-t", f"={session}:"),
            *("-c", tree, "--", "sh", "-c", script),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "PATH": start["env"]["PATH"]},
    )
    rc = Path(f"{out}.rc")
    wait_until(lambda: rc.exists() and rc.read_text().strip(), seconds=DEADLINE, what=command)
    return int(rc.read_text()), out.read_text()


def _app_comments(relay: Relay, number: int) -> list[str]:
    """What sessions posted on ``number``, as the App (not its attach comment)."""
    return [
        c.body
        for c in relay.github.on(number, REPOSITORY)
        if c.author == APP_LOGIN and "kind=session-" in c.body
    ]


def _status(relay: Relay) -> dict[str, Any]:
    """The view ``looprelay status --json`` prints, from the relay's stores."""
    return status_json(relay.stores, relay.clock, lost_after_seconds=CONFIG.lost_after_seconds)


def _post(relay: Relay, endpoint: str, body: dict[str, Any], *, auth: str) -> requests.Response:
    return requests.post(
        f"{relay.url}{API_PREFIX}{endpoint}",
        json=body,
        headers={"Authorization": auth},
        timeout=DEADLINE,
    )


class TestSessionComments:
    def test_a_session_comments_and_asks_as_the_app_and_then_awaits_input(
        self,
        relay: Relay,
        launch: Callable[..., RunnerProcess],
        terminal: TmuxTerminal,
        fake_harness: FakeHarness,
    ) -> None:
        launch("laptop")
        start = _start_session(relay, fake_harness, 1)
        env, tree = start["env"], start["cwd"]
        assert env[SESSION_ENV["endpoint"]] == _ref(1)
        assert env[SESSION_ENV["api_url"]] == relay.url
        assert env[SESSION_ENV["token"]].startswith("lrses_")
        item = relay.stores.work_items.get_work_item(_ref(1))
        assert item is not None
        session = item.sessions[_ref(1)]
        assert session.token_hash and env[SESSION_ENV["token"]] not in session.model_dump_json()
        Path(tree, "note.md").write_text("Plan: fix the parser first.\n", encoding="utf-8")

        code, said = _in_session(terminal, start, "looprelay session comment --body-file note.md")
        assert code == 0, said
        assert f"commented on {_ref(1)}" in said
        [comment] = _app_comments(relay, 1)
        assert comment.startswith("Plan: fix the parser first.")
        marker = read_marker(comment)
        assert marker is not None and marker.kind == "session-comment"
        [event] = relay.events("session.comment")
        assert event["endpoint"] == _ref(1)

        code, said = _in_session(
            terminal, start, "looprelay session ask --question 'Postgres or SQLite?'"
        )
        assert code == 0, said
        asked = _app_comments(relay, 1)[1]
        assert asked.startswith("Postgres or SQLite?")
        asked_marker = read_marker(asked)
        assert asked_marker is not None and asked_marker.kind == "session-ask"
        assert relay.events("session.awaiting_input")
        [row] = [s for s in _status(relay)["sessions"] if s["endpoint"] == _ref(1)]
        assert row["state"] == "awaiting-input" and row["awaiting_input_since"]

    def test_a_token_is_refused_for_another_session_and_a_long_comment_is_cut(
        self,
        relay: Relay,
        launch: Callable[..., RunnerProcess],
        terminal: TmuxTerminal,
        fake_harness: FakeHarness,
    ) -> None:
        launch("laptop", capacity=2)
        first = _start_session(relay, fake_harness, 1)
        second = _start_session(relay, fake_harness, 2, starts=2)
        token = second["env"][SESSION_ENV["token"]]
        # Session #2's token naming session #1: refused, and nothing is posted.
        refused = _post(
            relay,
            "session-comment",
            {"work_item": _ref(1), "endpoint": _ref(1), "body": "hi", "key": "k1"},
            auth=f"Bearer {token}",
        )
        assert refused.status_code == 401, refused.text
        assert "not github:octo/repo#1's" in refused.json()["error"]
        assert _app_comments(relay, 1) == []

        Path(first["cwd"], "long.md").write_text("Log:\n" + "x" * 70_000, encoding="utf-8")
        code, said = _in_session(terminal, first, "looprelay session comment --body-file long.md")
        assert code == 0, said
        [comment] = _app_comments(relay, 1)
        assert len(comment) <= GITHUB_MAX_COMMENT_CHARS
        assert comment.startswith("Log:\nxxx") and "… (cut: " in comment
        assert read_marker(comment) is not None

    def test_a_runner_gets_a_token_only_for_a_dispatch_whose_lease_it_holds(
        self, relay: Relay
    ) -> None:
        relay.seed(3, relay.dispatch(3))  # pending: leased by nobody
        runner = relay.register("bystander")

        def ask(dispatch_id: str) -> requests.Response:
            auth = runner_bearer(runner.runner_id, runner.secret)
            return _post(relay, "session-token", {"dispatch_id": dispatch_id}, auth=auth)

        refused = ask("dp-3-1")
        assert refused.status_code == 409 and "not this runner's" in refused.json()["error"]
        assert ask("dp-none").status_code == 404
        item = relay.stores.work_items.get_work_item(_ref(3))
        assert item is not None and item.sessions[_ref(3)].token_hash == ""
