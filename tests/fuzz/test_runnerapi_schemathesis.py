"""schemathesis against the runner API's checked-in OpenAPI document, served on loopback.

Requests generated from ``schema/runner-api.openapi.json`` (valid ones and invalid ones, with a
registered runner's credentials and without) must never get a 5xx, and every answer must be
one the document lists, with the body it documents.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import given
from schemathesis import Case, GenerationMode

from looprelay.adapters.clock import SystemClock
from looprelay.adapters.sqlite.runners import SqliteRunnerRegistry
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore
from looprelay.config.model import RunnersConfig
from looprelay.service.lease_desk import LeaseDesk
from looprelay.service.results import Progress
from looprelay.service.runners import RunnerApi, mint_registration_token
from looprelay.wire.runner_api import runner_bearer
from tests.app_server import AppServer
from tests.dispatches import make_dispatch, save_with_own_session
from tests.fuzz.budget import examples

DOCUMENT = Path(__file__).resolve().parents[2] / "schema" / "runner-api.openapi.json"
SCHEMA = schemathesis.openapi.from_path(DOCUMENT)
# Rotation retires the secret every later request signs with, and deregistering the runner
# itself: rotation is exercised once, last; deregistering in tests/cli/test_runner_lifecycle.py.
KEEPS_CREDENTIALS = SCHEMA.exclude(operation_id=["rotate", "deregister"])
REPOSITORY = "codertocat/hello-world"
AnyCase = Case[Any]


@dataclass(frozen=True)
class Served:
    """The runner API on loopback and a registered runner's Authorization header."""

    base_url: str
    authorization: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The runner API with its lease desk, as build_runner_api wires it, with work waiting.

    The desk's monotonic clock jumps a minute per reading, so a long poll that finds nothing
    answers 204 at once instead of holding the connection for ``runners.pollWaitSeconds``.
    """
    path = tmp_path_factory.mktemp("runnerapi") / "store.db"
    registry, work_items, store = (
        SqliteRunnerRegistry(path),
        SqliteWorkItemStore(path),
        SqliteStore(path),
    )
    clock, config, ticks = SystemClock(), RunnersConfig(), itertools.count(0, 60)
    desk = LeaseDesk(
        registry=registry,
        work_items=work_items,
        store=store,
        clock=clock,
        config=config,
        progress=Progress(
            work_items=work_items, store=store, github=None, clock=clock, bot_logins=[]
        ),
        monotonic=lambda: float(next(ticks)),
    )
    api = RunnerApi(registry=registry, store=store, clock=clock, config=config, desk=desk)
    server = AppServer(runner_api=api)
    server.start()
    host, port = server.address
    base_url = f"http://{host}:{port}"
    for number in range(1, 40):
        save_with_own_session(
            work_items,
            repository=REPOSITORY,
            number=number,
            dispatches=[
                make_dispatch(repository=REPOSITORY, number=number, created_at=clock.now())
            ],
            now=clock.now(),
        )
    token = mint_registration_token(registry, now=clock.now(), ttl=timedelta(hours=1))
    registered = requests.post(
        f"{base_url}/runner/v1/register", json={"token": token, "name": "fuzz"}, timeout=10
    ).json()
    yield Served(base_url, runner_bearer(registered["runner_id"], registered["secret"]))
    server.stop()
    for adapter in (registry, work_items, store):
        adapter.close()


def _post(served: Served, name: str, body: dict[str, object]) -> requests.Response:
    """POST to one endpoint as the registered runner; the answer must be as documented."""
    response = requests.post(
        f"{served.base_url}/runner/v1/{name}",
        json=body,
        headers={"Authorization": served.authorization},
        timeout=10,
    )
    SCHEMA[f"/runner/v1/{name}"]["POST"].validate_response(response)
    return response


def _exercise(case: AnyCase, served: Served, *, authenticated: bool) -> None:
    headers = {"Authorization": served.authorization} if authenticated else None
    response = case.call_and_validate(base_url=served.base_url, headers=headers, timeout=10)
    assert response.status_code < 500, response.text


class TestRunnerApiConformsToItsDocument:
    @examples(2)
    @given(case=KEEPS_CREDENTIALS.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def test_valid_requests_from_a_registered_runner(self, served: Served, case: AnyCase) -> None:
        _exercise(case, served, authenticated=True)

    @examples(2)
    @given(case=KEEPS_CREDENTIALS.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    def test_invalid_requests_from_a_registered_runner(self, served: Served, case: AnyCase) -> None:
        _exercise(case, served, authenticated=True)

    @examples(1)
    @given(case=SCHEMA.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def test_requests_without_credentials(self, served: Served, case: AnyCase) -> None:
        _exercise(case, served, authenticated=False)


class TestWorkAnswersAsDocumented:
    """The success paths random requests rarely reach: a lease, its renewal, its result."""

    def test_poll_renew_and_report_answer_with_the_documented_bodies(self, served: Served) -> None:
        beat = {"capacity": 256, "workspace": True, "repositories": [REPOSITORY]}
        assert _post(served, "heartbeat", beat).status_code == 200
        polled = _post(served, "poll", {"wait_seconds": 0})
        assert polled.status_code == 200
        dispatch_id = polled.json()["dispatch"]["dispatch_id"]
        assert _post(served, "renew", {"dispatch_id": dispatch_id}).status_code == 200
        result = {"dispatch_id": dispatch_id, "status": "spawned", "session_id": "s-1"}
        assert _post(served, "results", result).status_code == 200
        assert _post(served, "results", result | {"status": "done"}).status_code in {200, 409}
        assert _post(served, "renew", {"dispatch_id": "dp-none"}).status_code in {404, 409}

    def test_rotation_answers_with_the_documented_body_and_retires_the_secret(
        self, served: Served
    ) -> None:
        assert _post(served, "rotate", {}).status_code == 200
        assert _post(served, "heartbeat", {}).status_code == 401
