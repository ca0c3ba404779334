"""The runner API's OpenAPI document is generated from the endpoint table and served as written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from looprelay.adapters.clock import SystemClock
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.app.services import build_runner_api
from looprelay.config.model import Config
from looprelay.wire.openapi import runner_api_document, runner_api_document_text
from looprelay.wire.runner_api import API_PREFIX, ENDPOINTS
from tests.app_server import AppServer

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = ROOT / "schema" / "runner-api.openapi.json"


class TestDocument:
    def test_the_checked_in_document_equals_the_endpoint_table(self) -> None:
        assert DOCUMENT.read_text(encoding="utf-8") == runner_api_document_text(), (
            "schema/runner-api.openapi.json is stale: run "
            "`looprelay runners openapi > schema/runner-api.openapi.json`"
        )

    def test_every_endpoint_is_a_documented_post(self) -> None:
        paths = json.loads(DOCUMENT.read_text(encoding="utf-8"))["paths"]
        assert sorted(paths) == sorted(f"{API_PREFIX}{name}" for name in ENDPOINTS)
        assert all(list(operations) == ["post"] for operations in paths.values())

    def test_only_register_is_open_without_credentials(self) -> None:
        paths = runner_api_document()["paths"]
        open_paths = [path for path, ops in paths.items() if ops["post"]["security"] == []]
        assert open_paths == [f"{API_PREFIX}register"]

    def test_the_shapes_the_server_enforces_are_documented(self) -> None:
        # Found by tests/fuzz (schemathesis): a schema-valid name was refused with 400.
        schemas = runner_api_document()["components"]["schemas"]
        register, heartbeat = schemas["RegisterBody"], schemas["HeartbeatBody"]
        assert register["properties"]["name"]["pattern"].startswith("^[A-Za-z0-9]")
        labels = register["properties"]["labels"]
        assert labels["propertyNames"]["pattern"] == labels["additionalProperties"]["pattern"]
        assert "/" in heartbeat["properties"]["repositories"]["items"]["pattern"]

    def test_every_schema_reference_resolves(self) -> None:
        document = runner_api_document()
        text = json.dumps(document)
        schemas = document["components"]["schemas"]
        for ref in {part.split('"')[0] for part in text.split('"$ref": "')[1:]}:
            assert ref.removeprefix("#/components/schemas/") in schemas, ref


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    """The runner API exactly as `looprelay up` wires it, on a free port."""
    config = Config.model_validate({"store": {"sqlite": {"path": str(tmp_path / "db")}}})
    store = SqliteStore(tmp_path / "db")
    api = build_runner_api(
        config, store=store, clock=SystemClock(), data_dir=None, github=None, waker=None
    )
    server = AppServer(runner_api=api)
    server.start()
    host, port = server.address
    yield f"http://{host}:{port}{API_PREFIX}"
    server.stop()
    store.close()


class TestServedAsDocumented:
    @pytest.mark.parametrize("name", sorted(ENDPOINTS))
    def test_each_documented_path_is_served(self, url: str, name: str) -> None:
        response = requests.post(url + name, json={}, timeout=10)
        documented = {
            int(code)
            for code in runner_api_document()["paths"][f"{API_PREFIX}{name}"]["post"]["responses"]
        }
        assert response.status_code != 404 or 404 in documented
        assert response.status_code in documented

    def test_an_undocumented_path_is_404(self, url: str) -> None:
        assert requests.post(url + "leases", json={}, timeout=10).status_code == 404
