"""A runner's life on its own machine: `runner rotate`, `runner remove` and `runner status`,
against the real runner API over HTTP."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner, Result

from looprelay.agent.credentials import (
    Credentials,
    credentials_lock,
    lock_path,
    read_credentials,
    write_credentials,
)
from looprelay.agent.ledger import Ledger, LocalSession
from looprelay.agent.run import Agent
from looprelay.agent.start import LEDGER_FILE, STATUS_FILE, RunnerOptions, build_agent
from looprelay.cli.root import cli
from looprelay.errors import Unauthorized
from looprelay.service.runner_secrets import hash_credential
from looprelay.wire.runner_api import runner_bearer
from tests.fake_harness import FakeHarness
from tests.gitrepos import offline_github
from tests.test_runnerapi import Api, api  # noqa: F401 - the runner API fixture

DEAD_SERVER = "http://127.0.0.1:{port}"


def _looprelay(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def _registered(api: Api, path: Path, *, server: str | None = None) -> Credentials:  # noqa: F811
    answer = api.register(name="laptop")
    credentials = Credentials(
        server=server or api.url,
        runner_id=answer["runner_id"],
        secret=answer["secret"],
        name=answer["name"],
    )
    write_credentials(path, credentials)
    return credentials


def _dead_server() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once closed: nothing listens there
    return DEAD_SERVER.format(port=port)


def _heartbeat(api: Api, credentials: Credentials) -> int:  # noqa: F811
    auth = runner_bearer(credentials.runner_id, credentials.secret)
    return api.post("heartbeat", {}, auth=auth).status_code


def _one_error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: ")
    return line


class TestRemove:
    def test_deregisters_at_the_server_then_deletes_the_credentials(
        self,
        api: Api,  # noqa: F811
        tmp_path: Path,
    ) -> None:
        path = tmp_path / "runner.json"
        credentials = _registered(api, path)
        removed = _looprelay("runner", "remove", "--credentials", str(path))
        assert removed.exit_code == 0, removed.output
        assert f"deregistered laptop ({credentials.runner_id})" in removed.output
        assert not path.exists() and not lock_path(path).exists()
        stored = api.registry.get_runner(credentials.runner_id)
        assert stored is not None and stored.revoked
        assert _heartbeat(api, credentials) == 401  # a copy of the file is worthless now
        [event] = api.store.list_events(name="runner.deregistered")
        assert event.data["runner_id"] == credentials.runner_id
        # Registering again needs no --replace: nothing is left behind.
        token = api.token()
        again = _looprelay(
            "runner", "register", "--server", api.url, "--token", token, "--name", "laptop",
            "--credentials", str(path),
        )  # fmt: skip
        assert again.exit_code == 0, again.output

    def test_an_unreachable_server_changes_nothing_and_names_local_only(
        self,
        api: Api,  # noqa: F811
        tmp_path: Path,
    ) -> None:
        path = tmp_path / "runner.json"
        credentials = _registered(api, path, server=_dead_server())
        line = _one_error_line(_looprelay("runner", "remove", "--credentials", str(path)))
        assert f"cannot deregister at {credentials.server}" in line
        assert "nothing was changed" in line and "--local-only" in line
        assert read_credentials(path) == credentials
        stored = api.registry.get_runner(credentials.runner_id)
        assert stored is not None and not stored.revoked

    def test_local_only_deletes_the_file_and_says_the_runner_stays_registered(
        self,
        api: Api,  # noqa: F811
        tmp_path: Path,
    ) -> None:
        path = tmp_path / "runner.json"
        credentials = _registered(api, path, server=_dead_server())
        removed = _looprelay("runner", "remove", "--credentials", str(path), "--local-only")
        assert removed.exit_code == 0, removed.output
        assert not path.exists()
        assert f"`looprelay runners revoke {credentials.runner_id}`" in removed.output
        stored = api.registry.get_runner(credentials.runner_id)
        assert stored is not None and not stored.revoked

    def test_credentials_the_server_no_longer_takes_are_kept_unless_local_only(
        self,
        api: Api,  # noqa: F811
        tmp_path: Path,
    ) -> None:
        path = tmp_path / "runner.json"
        credentials = _registered(api, path)
        api.registry.revoke_runner(credentials.runner_id, at=api.clock.now())
        line = _one_error_line(_looprelay("runner", "remove", "--credentials", str(path)))
        assert "no longer accepts the credentials" in line and "--local-only" in line
        assert "register" not in line  # removing is not a reason to register again
        assert path.exists()

    def test_no_credentials_file_is_one_line(self, tmp_path: Path) -> None:
        path = tmp_path / "runner.json"
        for extra in ((), ("--local-only",)):
            line = _one_error_line(
                _looprelay("runner", "remove", "--credentials", str(path), *extra)
            )
            assert str(path) in line and "does not exist" in line


@pytest.fixture
def agent_credentials(
    api: Api,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_harness: FakeHarness,
) -> Iterator[tuple[Path, Agent]]:
    """A registered runner's credentials file and the agent `runner run` builds on it."""
    path = tmp_path / "runner.json"
    _registered(api, path)
    repos = offline_github(tmp_path / "git", monkeypatch)
    repos.create("octo/repo")
    checkout = repos.clone("octo/repo", tmp_path / "checkout")
    agent = build_agent(
        RunnerOptions(
            credentials_path=path,
            state_dir=tmp_path / "state",
            checkout_pairs=[f"octo/repo={checkout}"],
            tmux_socket="looprelay-unused",
            capacity=1,
            poll_wait_seconds=1,
        )
    )
    yield path, agent
    for lock in agent.locks:
        lock.release()


class TestRotate:
    def test_writes_the_new_secret_and_the_running_agent_goes_on_with_it(
        self,
        api: Api,  # noqa: F811
        agent_credentials: tuple[Path, Agent],
    ) -> None:
        path, agent = agent_credentials
        old = read_credentials(path)
        assert agent.client.heartbeat(agent.describe())  # with the secret it started with

        rotated = _looprelay("runner", "rotate", "--credentials", str(path))
        assert rotated.exit_code == 0, rotated.output
        new = read_credentials(path)  # refuses a file others may read: 0600
        assert new.model_dump(exclude={"secret"}) == old.model_dump(exclude={"secret"})
        assert new.secret != old.secret and new.secret not in rotated.output
        stored = api.registry.get_runner(old.runner_id)
        assert stored is not None and stored.secret_hash == hash_credential(new.secret)
        assert _heartbeat(api, old) == 401

        # The agent's next call is refused, reads the file again and is answered.
        api.clock.advance(60)
        assert agent.client.heartbeat(agent.describe())["heartbeat_seconds"] == 30
        stored = api.registry.get_runner(old.runner_id)
        assert stored is not None and stored.last_seen_at == api.clock.current

    def test_an_agent_refused_mid_rotation_waits_for_the_file(
        self,
        api: Api,  # noqa: F811
        agent_credentials: tuple[Path, Agent],
    ) -> None:
        # Between the server's new secret and the file's, the agent must not read the old
        # secret again and stop: `runner rotate` holds the lock across both.
        path, agent = agent_credentials
        old = read_credentials(path)
        answers: list[dict[str, Any]] = []
        with credentials_lock(path, exclusive=True):
            secret = requests.post(
                f"{api.url}/runner/v1/rotate",
                json={},
                headers={"Authorization": runner_bearer(old.runner_id, old.secret)},
                timeout=10,
            ).json()["secret"]
            beat = threading.Thread(
                target=lambda: answers.append(agent.client.heartbeat(agent.describe()))
            )
            beat.start()
            beat.join(0.5)
            assert beat.is_alive()  # waiting for the lock, not refused
            write_credentials(path, old.model_copy(update={"secret": secret}))
        beat.join(30)
        assert answers and answers[0]["heartbeat_seconds"] == 30

    def test_a_file_naming_another_runner_is_not_taken(
        self,
        api: Api,  # noqa: F811
        agent_credentials: tuple[Path, Agent],
    ) -> None:
        # `runner register --replace` over a running agent's file: the agent keeps its own
        # identity (its state is keyed by it) and stops when that is refused.
        path, agent = agent_credentials
        old = read_credentials(path)
        api.registry.revoke_runner(old.runner_id, at=api.clock.now())
        _registered(api, path)
        with pytest.raises(Unauthorized):
            agent.client.heartbeat(agent.describe())

    def test_an_unreachable_server_leaves_the_secret_as_it_was(
        self,
        api: Api,  # noqa: F811
        tmp_path: Path,
    ) -> None:
        path = tmp_path / "runner.json"
        credentials = _registered(api, path, server=_dead_server())
        line = _one_error_line(_looprelay("runner", "rotate", "--credentials", str(path)))
        assert "the secret is unchanged" in line
        assert read_credentials(path) == credentials


class TestStatus:
    def test_prints_what_the_agent_holds_and_its_sessions_as_tables(self, tmp_path: Path) -> None:
        state = tmp_path / "state"
        state.mkdir()
        (state / STATUS_FILE).write_text(
            json.dumps(
                {
                    "note": "applying",
                    "holding": {"dp-1": "deliver github:octo/repo#1"},
                    "counts": {"leased": 3, "spawned": 1},
                    "hosted": {"loop-octo-repo-1": "exited (status 1, since 2026-12-02T14:02:03Z)"},
                }
            )
        )
        ledger = Ledger(state / LEDGER_FILE)
        for number, kind in ((1, "tmux"), (2, "process")):
            ledger.remember(
                LocalSession(
                    session_name=f"loop-octo-repo-{number}",
                    work_item=f"github:octo/repo#{number}",
                    endpoint=f"github:octo/repo#{number}/issue",
                    session_id=f"s-{number}",
                    checkout=f"/work/octo-repo-{number}",
                    created_checkout=True,
                    harness="claude",
                    runner_kind=kind,
                )
            )
        ledger.close()
        shown = _looprelay("runner", "status", "--state", str(state), "--tmux-socket", "sock")
        assert shown.exit_code == 0, shown.output
        summary, blank, held_header, held, blank2, header, *rows = shown.output.splitlines()
        assert blank == blank2 == ""
        assert summary == "agent: applying; leased 3, spawned 1"
        assert held_header.split() == ["DISPATCH", "ID", "HOLDING"]
        assert held.split() == ["dp-1", "deliver", "github:octo/repo#1"]
        assert header.split() == [
            "ENDPOINT",
            "WORK",
            "ITEM",
            "SESSION",
            "STATE",
            "CHECKOUT",
            "ATTACH",
        ]
        tmux_row, process_row = rows
        assert tmux_row.endswith("tmux -L sock attach -t loop-octo-repo-1")
        assert tmux_row.index("loop-octo-repo-1") == header.index("SESSION")
        # As the agent's last heartbeat saw it; one it has not looked at yet is unknown.
        assert tmux_row[header.index("STATE") :].startswith("exited (status 1, since 2026-12-02")
        assert process_row[header.index("STATE") :].startswith("unknown")
        assert process_row.split()[-2:] == ["/work/octo-repo-2", "-"]  # no tmux, no attach

    def test_an_agent_with_no_sessions_says_so(self, tmp_path: Path) -> None:
        state = tmp_path / "state"
        state.mkdir()
        (state / STATUS_FILE).write_text(
            json.dumps({"note": "polling", "holding": {}, "counts": {}})
        )
        shown = _looprelay("runner", "status", "--state", str(state), "--tmux-socket", "sock")
        assert shown.output.splitlines() == [
            "agent: polling; nothing applied yet",
            "",
            "no sessions",
        ]


class TestHelp:
    def test_runner_and_runners_point_to_each_other(self) -> None:
        runner = _looprelay("runner", "-h").output
        runners = _looprelay("runners", "-h").output
        assert "`looprelay runners -h`" in runner
        assert "`looprelay runner -h`" in runners
        for command in ("register", "run", "status", "rotate", "remove"):
            assert f"  {command} " in runner
