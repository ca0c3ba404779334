"""The runner API's registration half over real HTTP: tokens, register, heartbeat, rotate."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from looprelay.adapters.sqlite.runners import SqliteRunnerRegistry
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.agent.credentials import Credentials, write_credentials
from looprelay.agent.start import RunnerOptions, build_agent
from looprelay.config.model import RunnersConfig
from looprelay.service.runners import RunnerApi, mint_registration_token
from looprelay.wire.runner_api import runner_bearer
from tests.app_server import AppServer
from tests.fake_harness import FakeHarness
from tests.gitrepos import offline_github
from tests.rigs import T0, SteppingClock


@dataclass
class Api:
    url: str
    registry: SqliteRunnerRegistry
    store: SqliteStore
    clock: SteppingClock

    def post(self, path: str, body: Any = None, *, auth: str | None = None) -> requests.Response:
        headers = {"Authorization": auth} if auth else {}
        return requests.post(
            f"{self.url}/runner/v1/{path}", json=body or {}, headers=headers, timeout=10
        )

    def token(self, ttl: timedelta = timedelta(hours=1)) -> str:
        return mint_registration_token(self.registry, now=self.clock.now(), ttl=ttl)

    def register(self, name: str = "laptop", **extra: Any) -> dict[str, Any]:
        response = self.post("register", {"token": self.token(), "name": name, **extra})
        assert response.status_code == 201, response.text
        answer: dict[str, Any] = response.json()
        return answer


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    registry = SqliteRunnerRegistry(tmp_path / "store.db")
    store = SqliteStore(tmp_path / "store.db")
    clock = SteppingClock()
    runner_api = RunnerApi(registry=registry, store=store, clock=clock, config=RunnersConfig())
    server = AppServer(runner_api=runner_api)
    server.start()
    yield Api(server.url, registry, store, clock)
    server.stop()
    registry.close()
    store.close()


class TestRegister:
    def test_a_token_buys_an_id_and_a_secret_of_which_only_the_hash_is_kept(self, api: Api) -> None:
        answer = api.register(labels={"os": "linux"}, capacity=3, version="0.1.0")
        assert answer["name"] == "laptop"
        assert answer["secret"].startswith("lrsec_") and len(answer["secret"]) > 40
        stored = api.registry.get_runner(answer["runner_id"])
        assert stored is not None
        assert stored.secret_hash == hashlib.sha256(answer["secret"].encode()).hexdigest()
        assert answer["secret"] not in stored.model_dump_json()
        assert (stored.labels, stored.capacity, stored.version) == ({"os": "linux"}, 3, "0.1.0")
        [event] = api.store.list_events(name="runner.registered")
        assert event.data["runner_id"] == answer["runner_id"]
        assert answer["secret"] not in str(event.data)

    def test_a_token_works_once(self, api: Api) -> None:
        token = api.token()
        assert api.post("register", {"token": token, "name": "a"}).status_code == 201
        again = api.post("register", {"token": token, "name": "b"})
        assert again.status_code == 401
        assert "looprelay runners token" in again.json()["error"]
        assert [r.name for r in api.registry.list_runners()] == ["a"]

    def test_an_expired_token_is_refused(self, api: Api) -> None:
        token = api.token(ttl=timedelta(minutes=10))
        api.clock.current = T0 + timedelta(minutes=11)
        assert api.post("register", {"token": token, "name": "late"}).status_code == 401
        assert api.registry.list_runners() == []

    @pytest.mark.parametrize(
        "body",
        [
            {"name": "no-token"},
            {"token": "x", "name": "bad name with spaces"},
            {"token": "x", "name": "-flag"},
            {"token": "x", "name": "ok", "labels": {"k": "v w"}},
            {"token": "x", "name": "ok", "capacity": 0},
            {"token": "x", "name": "ok", "surprise": 1},
            {"token": "x", "name": "trailing-newline\n"},
            {"token": "x", "name": "ok", "labels": {"k\n": "v"}},
            {"token": "x", "name": "ok", "labels": {"k": "v\n"}},
        ],
    )
    def test_a_malformed_request_is_400_and_keeps_the_token(
        self, api: Api, body: dict[str, Any]
    ) -> None:
        token = api.token()
        body = body | ({"token": token} if "token" in body else {})
        response = api.post("register", body)
        assert response.status_code == 400
        assert "invalid request body" in response.json()["error"]
        assert api.post("register", {"token": token, "name": "fine"}).status_code == 201

    def test_non_json_is_400(self, api: Api) -> None:
        response = requests.post(f"{api.url}/runner/v1/register", data=b"\xff{", timeout=10)
        assert response.status_code == 400


class TestAuthenticatedCalls:
    def test_heartbeat_records_liveness(self, api: Api) -> None:
        runner = api.register()
        api.clock.current = T0 + timedelta(seconds=30)
        response = api.post(
            "heartbeat",
            {"version": "0.2.0", "capacity": 1},
            auth=runner_bearer(runner["runner_id"], runner["secret"]),
        )
        assert response.status_code == 200
        assert response.json() == {
            "heartbeat_seconds": 30,
            "lost_after_seconds": 120,
            "moved": [],
            "released_leases": 0,
        }
        stored = api.registry.get_runner(runner["runner_id"])
        assert stored is not None and stored.last_seen_at == api.clock.current

    def test_an_agent_with_one_worker_keeps_the_sessions_it_registered_for(
        self, api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_harness: FakeHarness
    ) -> None:
        # `runner register --capacity 3` (sessions), `runner run --capacity 1` (workers): the
        # agent's heartbeat used to overwrite 3 with 1, so its second work item never started
        # (runner-at-capacity). Found by tests/faults/test_runner_faults.py.
        runner = api.register(capacity=3)
        credentials = tmp_path / "runner.json"
        write_credentials(
            credentials,
            Credentials(
                server=api.url,
                runner_id=runner["runner_id"],
                secret=runner["secret"],
                name=runner["name"],
            ),
        )
        repos = offline_github(tmp_path / "git", monkeypatch)
        repos.create("octo/repo")
        checkout = repos.clone("octo/repo", tmp_path / "checkout")
        agent = build_agent(
            RunnerOptions(
                credentials_path=credentials,
                state_dir=tmp_path / "state",
                checkout_pairs=[f"octo/repo={checkout}"],
                tmux_socket="looprelay-unused",
                capacity=1,
                poll_wait_seconds=1,
            )
        )
        agent.client.heartbeat(agent.describe())
        stored = api.registry.get_runner(runner["runner_id"])
        assert stored is not None
        assert (stored.capacity, stored.repositories) == (3, ["octo/repo"])

    def test_a_heartbeat_naming_a_capacity_records_it(self, api: Api) -> None:
        runner = api.register(capacity=3)
        auth = runner_bearer(runner["runner_id"], runner["secret"])
        assert api.post("heartbeat", {"capacity": 5}, auth=auth).status_code == 200
        stored = api.registry.get_runner(runner["runner_id"])
        assert stored is not None and stored.capacity == 5

    @pytest.mark.parametrize(
        "body", [{"capacity": True}, {"capacity": "2"}, {"workspace": 1}, {"sessions": 1.5}]
    )
    def test_a_field_of_another_json_type_is_400_as_documented(
        self, api: Api, body: dict[str, Any]
    ) -> None:
        # Found by tests/fuzz (schemathesis): lax parsing took `true` for a number.
        runner = api.register()
        response = api.post(
            "heartbeat", body, auth=runner_bearer(runner["runner_id"], runner["secret"])
        )
        assert response.status_code == 400
        assert "invalid request body" in response.json()["error"]

    def test_a_whole_number_written_with_a_fraction_is_an_integer_as_json_schema_says(
        self, api: Api
    ) -> None:
        runner = api.register()
        auth = runner_bearer(runner["runner_id"], runner["secret"])
        assert api.post("heartbeat", {"capacity": 2.0}, auth=auth).status_code == 200
        stored = api.registry.get_runner(runner["runner_id"])
        assert stored is not None and stored.capacity == 2

    def test_a_repository_with_a_trailing_newline_is_400(self, api: Api) -> None:
        runner = api.register()
        response = api.post(
            "heartbeat",
            {"repositories": ["owner/repo\n"]},
            auth=runner_bearer(runner["runner_id"], runner["secret"]),
        )
        assert response.status_code == 400
        assert "is not owner/repo" in response.json()["error"]

    @pytest.mark.parametrize(
        "auth",
        [None, "Bearer", "Bearer r-0000000000000000:nope", "Basic abc", "Bearer {id}:wrong"],
    )
    def test_a_wrong_credential_is_401_and_says_to_register_again(
        self, api: Api, auth: str | None
    ) -> None:
        runner = api.register()
        header = auth.format(id=runner["runner_id"]) if auth else None
        response = api.post("heartbeat", {}, auth=header)
        assert response.status_code == 401
        assert "looprelay runner register" in response.json()["error"]

    def test_a_revoked_runner_is_told_so(self, api: Api) -> None:
        runner = api.register(name="old-box")
        api.registry.revoke_runner(runner["runner_id"], at=T0)
        response = api.post(
            "heartbeat", {}, auth=runner_bearer(runner["runner_id"], runner["secret"])
        )
        assert response.status_code == 401
        assert "old-box was revoked" in response.json()["error"]

    def test_rotation_gives_a_new_secret_and_retires_the_old_one(self, api: Api) -> None:
        runner = api.register()
        old = runner_bearer(runner["runner_id"], runner["secret"])
        rotated = api.post("rotate", {}, auth=old)
        assert rotated.status_code == 200
        new = runner_bearer(runner["runner_id"], rotated.json()["secret"])
        assert api.post("heartbeat", {}, auth=new).status_code == 200
        refused = api.post("heartbeat", {}, auth=old)
        assert refused.status_code == 401
        # The old secret's holder is told how rotation is finished, not only to register.
        assert "`looprelay runners rotate`" in refused.json()["error"]
        assert "credentials file" in refused.json()["error"]


class TestRouting:
    def test_unknown_paths_are_404_and_other_methods_405(self, api: Api) -> None:
        assert api.post("nope").status_code == 404
        assert requests.get(f"{api.url}/runner/v1/register", timeout=10).status_code == 405
