"""`GET /status`, its JSON, who may read it, and `looprelay status`: `looprelay up`'s application
over a real SQLite data directory, seeded through the stores' own ports.

Requests from this machine go over real HTTP; a caller off this machine is the same ASGI
application called with a non-loopback client address (the one thing loopback HTTP cannot
give a test).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import requests
from starlette.applications import Starlette

from looprelay.app.adapters import open_runner_registry, open_work_item_store
from looprelay.app.compose import build_app
from looprelay.app.local import LocalStack
from looprelay.config.model import Config, GitHubConfig, ServerConfig, SqliteConfig, StoreConfig
from looprelay.core.model import (
    DeliveryRecord,
    DispatchRecord,
    EventRecord,
    RunnerRecord,
    SessionRecord,
    WorkItemRecord,
)
from looprelay.errors import ConfigError
from looprelay.ports import RunnerStatus
from looprelay.service.status import COPY_SCRIPT
from tests.fake_github import APP_ID, AppKey, FakeGitHub
from tests.test_up import cli

TOKEN = "operator-token-0123456789abcdef"
KEY_ENV = "TEST_GH_APP_KEY"
CLOUD_PEER = "169.254.8.1"  # Cloud Run's front end, as a function sees its callers
JSON = {"accept": "application/json"}
TOKEN_ENV = "TEST_LOOPRELAY_OPERATOR_TOKEN"
HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>"
PROMPT = "PRIVATE-PROMPT-TEXT do not show"
REF = "github:octo/private-repo#7"
SESSION = "loop-github-octo-private-repo-7"


@dataclass
class Seeded:
    stack: LocalStack
    runner_id: str

    @property
    def url(self) -> str:
        return f"{self.stack.base_url}/status"

    @property
    def app(self) -> Starlette:
        return self.stack.local.app


def _seed(config: Config, data_dir: Path) -> str:
    """A live runner with a hostile name, a work item with a live tmux session and a waiting
    dispatch carrying a private prompt, a dead letter and an interrupted dispatch."""
    now = datetime.now(UTC)
    registry = open_runner_registry(config, data_dir=data_dir)
    runner = RunnerRecord(
        runner_id="r-laptop", name=f"laptop {HOSTILE}", secret_hash="HASH-NEVER-SHOWN",
        registered_at=now,
    )  # fmt: skip
    registry.add_runner(runner)
    registry.record_heartbeat(
        runner.runner_id,
        at=now,
        status=RunnerStatus(
            version="9.9.9",
            capacity=3,
            repositories=("octo/other",),
            sessions=1,
            hostname="build-box.local",
        ),
    )
    session = SessionRecord(
        endpoint=REF, session_name=SESSION, session_id="s-1", harness="claude",
        runner_kind="tmux", interaction="work-item", status="live", runner_id="r-laptop",
        activity="pasted", active_at=now - timedelta(minutes=2),
    )  # fmt: skip
    item = WorkItemRecord(
        ref=REF, repository="octo/private-repo", number=7, control="running",
        sessions={REF: session}, next_seq=4, updated_at=now,
    )  # fmt: skip
    dispatch = DispatchRecord(
        dispatch_id="dp-waiting", delivery_id="d-2", work_item=REF, endpoint=REF, seq=3,
        kind="spawn", repository="octo/private-repo", session_name=SESSION, session_id="s-1",
        prompt=PROMPT, created_at=now,
    )  # fmt: skip
    interrupted = dispatch.model_copy(
        update={"dispatch_id": "dp-cut", "seq": 2, "status": "failed", "result": "interrupted",
                "detail": f"stopped mid-paste {HOSTILE}", "kind": "deliver"}
    )  # fmt: skip
    items = open_work_item_store(config, data_dir=data_dir)
    assert items.save_work_item(item, expected_version=0, dispatches=[interrupted, dispatch])
    return runner.runner_id


def _dead_letter(stack: LocalStack) -> None:
    now = datetime.now(UTC) - timedelta(minutes=3)
    stack.store.begin_delivery(
        DeliveryRecord(delivery_id="d-dead", event="issue_comment", action="created",
                       received_at=now, envelope="{}")
    )  # fmt: skip
    stack.store.settle_delivery(
        "d-dead", outcome="failed", detail=f"KeyError: {HOSTILE}", at=now + timedelta(seconds=1)
    )
    stack.store.append_event(
        EventRecord(
            name="delivery.dead_lettered",
            at=now + timedelta(seconds=1),
            delivery_id="d-dead",
            severity="ERROR",
            data={"error": HOSTILE, "attempts": 5},
        )
    )


def _serve(tmp_path: Path, environ: Mapping[str, str], config: Config) -> Iterator[Seeded]:
    data_dir = tmp_path / "data"
    stack = LocalStack(config, data_dir=data_dir, environ=environ)
    runner_id = _seed(config, stack.data_dir)
    _dead_letter(stack)
    stack.start()
    yield Seeded(stack, runner_id)
    stack.stop()


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[Seeded]:
    yield from _serve(tmp_path, {}, Config(server=ServerConfig(port=0)))


@pytest.fixture
def with_token(tmp_path: Path) -> Iterator[Seeded]:
    config = Config(server=ServerConfig(port=0, operator_token_env=TOKEN_ENV))
    yield from _serve(tmp_path, {TOKEN_ENV: TOKEN}, config)


def call(
    app: Starlette,
    path: str,
    *,
    client: str,
    headers: Mapping[str, str],
    method: str = "GET",
) -> tuple[int, dict[str, str], bytes]:
    """One request (a GET unless ``method``) through the ASGI application as if ``client``
    had connected."""

    async def run() -> tuple[int, dict[str, str], bytes]:
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "client": (client, 40000), "server": ("127.0.0.1", 8484),
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }  # fmt: skip

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body

    return anyio.run(run)


class TestWhatItShows:
    def test_json_names_every_part_an_operator_acts_on(self, seeded: Seeded) -> None:
        response = requests.get(seeded.url, headers={"Accept": "application/json"}, timeout=10)

        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/json")
        view = response.json()
        assert set(view) == {
            "generated_at", "totals", "runners", "sessions", "dispatches", "deliveries",
            "replays", "polling",
        }  # fmt: skip
        assert view["polling"] == []  # no github.poll.repositories
        [runner] = view["runners"]
        assert (runner["runner_id"], runner["state"], runner["capacity"]) == ("r-laptop", "live", 3)
        # The server gave this runner no session slot (the seed writes the session directly):
        # the page counts the server's slots, which capacity is judged by, not the heartbeat's 1.
        assert (runner["sessions"], runner["version"]) == (0, "9.9.9")
        [session] = view["sessions"]
        assert session["attach"] == f"tmux -L looprelay-r-laptop attach -t {SESSION}"
        assert (session["work_item"], session["state"]) == (REF, "live")
        [waiting] = view["dispatches"]
        assert (waiting["dispatch_id"], waiting["waiting"]) == (
            "dp-waiting",
            "repository-not-served",
        )
        commands = {row["id"]: row["command"] for row in view["replays"]}
        data_dir = str(seeded.stack.data_dir)
        assert commands == {
            "d-dead": f"looprelay deliveries replay d-dead --data {data_dir}",
            "dp-cut": f"looprelay dispatches resend dp-cut --data {data_dir}",
        }
        assert view["totals"]["dead_letters"] == 1 and view["totals"]["interrupted"] == 1
        assert [d["outcome"] for d in view["deliveries"]] == ["failed"]

    def test_no_prompt_and_no_secret_hash_ever_appears(self, seeded: Seeded) -> None:
        for accept in ("application/json", "text/html"):
            body = requests.get(seeded.url, headers={"Accept": accept}, timeout=10).text
            assert PROMPT not in body
            assert "HASH-NEVER-SHOWN" not in body

    def test_the_page_is_self_contained_html_with_hostile_text_escaped(
        self, seeded: Seeded
    ) -> None:
        response = requests.get(seeded.url, headers={"Accept": "text/html"}, timeout=10)

        assert response.headers["content-type"] == "text/html; charset=utf-8"
        page = response.text
        # One script, ours, and the policy allows exactly it (by hash); no hostile one.
        assert page.count("<script") == 1 and f"<script>{COPY_SCRIPT}</script>" in page
        digest = base64.b64encode(hashlib.sha256(COPY_SCRIPT.encode()).digest()).decode()
        policy = response.headers["content-security-policy"]
        assert f"script-src 'sha256-{digest}';" in policy and "unsafe-inline'; f" not in policy
        assert "<img" not in page
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
        assert f"tmux -L looprelay-r-laptop attach -t {SESSION}" in page
        assert 'http-equiv="refresh"' in page
        assert "src=" not in page.replace("src=x", "")
        # Links go to GitHub's pages and to this page's own delivery views, nowhere else.
        links = re.findall(r'href="([^"]*)"', page)
        assert links and all(
            link.startswith(("https://github.com/", "/status/deliveries/")) for link in links
        )

    def test_it_links_github_and_each_delivery_and_says_where_and_when(
        self, seeded: Seeded
    ) -> None:
        view = requests.get(seeded.url, headers=JSON, timeout=10).json()
        [session], [runner] = view["sessions"], view["runners"]
        assert session["work_item_url"] == "https://github.com/octo/private-repo/issues/7"
        assert session["activity"] == "pasted 2 m ago"
        assert runner["hostname"] == "build-box.local"
        page = requests.get(seeded.url, timeout=10).text
        assert 'href="https://github.com/octo/private-repo/issues/7"' in page
        assert 'href="/status/deliveries/d-dead"' in page
        assert f'data-copy="tmux -L looprelay-r-laptop attach -t {SESSION}"' in page

    def test_a_deliverys_page_shows_its_events_escaped(self, seeded: Seeded) -> None:
        url = f"{seeded.url}/deliveries/d-dead"
        page = requests.get(url, timeout=10)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "delivery.dead_lettered" in page.text and "<img" not in page.text
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page.text
        answer = requests.get(url, headers=JSON, timeout=10).json()
        assert answer["delivery"]["outcome"] == "failed"
        [event] = answer["events"]
        assert (event["name"], event["data"]["attempts"]) == ("delivery.dead_lettered", "5")
        missing = requests.get(f"{seeded.url}/deliveries/d-none", timeout=10)
        assert missing.status_code == 404 and "d-none" in missing.json()["error"]

    def test_a_deliverys_page_answers_only_this_machine(self, seeded: Seeded) -> None:
        status, _, _ = call(
            seeded.app, "/status/deliveries/d-dead", client="203.0.113.9",
            headers={"host": "relay.example"},
        )  # fmt: skip
        assert status == 403

    def test_it_shows_the_last_50_deliveries_unless_asked_for_another_number(
        self, seeded: Seeded
    ) -> None:
        for n in range(60):
            seeded.stack.store.begin_delivery(
                DeliveryRecord(
                    delivery_id=f"d-{n:02}",
                    event="issues",
                    received_at=datetime.now(UTC) - timedelta(hours=1, seconds=60 - n),
                )
            )
        shown = requests.get(seeded.url, headers=JSON, timeout=10).json()["deliveries"]
        assert len(shown) == 50
        three = requests.get(f"{seeded.url}?deliveries=3", headers=JSON, timeout=10).json()
        assert len(three["deliveries"]) == 3
        for bad in ("0", "abc", "²", "1001"):
            refused = requests.get(f"{seeded.url}?deliveries={bad}", timeout=10)
            assert refused.status_code == 400, bad
            assert "deliveries must be a whole number" in refused.json()["error"]

    def test_the_root_points_to_the_status_page(self, seeded: Seeded) -> None:
        response = requests.get(seeded.stack.base_url + "/", timeout=10, allow_redirects=False)
        assert (response.status_code, response.headers["location"]) == (307, "/status")


class TestWhoMayRead:
    @pytest.mark.parametrize(
        ("client", "headers"),
        [
            ("203.0.113.9", {"host": "relay.example"}),
            ("203.0.113.9", {"host": "127.0.0.1:8484"}),
            # A tunnel connects from loopback but forwards the public name or the caller.
            ("127.0.0.1", {"host": "abc.ngrok.example"}),
            ("127.0.0.1", {"host": "127.0.0.1:8484", "x-forwarded-for": "198.51.100.7"}),
            ("::1", {"host": "[::1]:8484", "forwarded": "for=198.51.100.7"}),
            # Issue 24: Cloudflare's tunnel names the caller in headers of its own.
            ("127.0.0.1", {"host": "127.0.0.1:8484", "cf-connecting-ip": "198.51.100.7"}),
            ("127.0.0.1", {"host": "localhost:8484", "true-client-ip": "198.51.100.7"}),
        ],
    )
    def test_without_a_token_only_this_machine_may(
        self, seeded: Seeded, client: str, headers: dict[str, str]
    ) -> None:
        status, _, body = call(seeded.app, "/status", client=client, headers=headers)
        assert status == 403
        assert "server.operatorTokenEnv" in json.loads(body)["error"]

    @pytest.mark.parametrize(
        ("client", "host"), [("127.0.0.1", "127.0.0.1:8484"), ("::1", "[::1]:8484"),
                             ("127.0.0.1", "localhost:8484")]
    )  # fmt: skip
    def test_this_machine_may(self, seeded: Seeded, client: str, host: str) -> None:
        status, _, _ = call(seeded.app, "/status", client=client, headers={"host": host})
        assert status == 200

    def test_with_a_token_a_caller_elsewhere_presenting_it_may(self, with_token: Seeded) -> None:
        elsewhere = {"host": "relay.example", "accept": "application/json"}
        status, _, body = call(
            with_token.app,
            "/status",
            client="203.0.113.9",
            headers=elsewhere | {"authorization": f"Bearer {TOKEN}"},
        )
        assert status == 200 and json.loads(body)["runners"][0]["runner_id"] == "r-laptop"

    @pytest.mark.parametrize(
        "authorization", [None, f"Bearer {TOKEN}x", f"Basic {TOKEN}", f"Bearer {TOKEN[:-1]}"]
    )
    def test_with_a_token_anyone_else_elsewhere_is_told_to_send_it(
        self, with_token: Seeded, authorization: str | None
    ) -> None:
        headers = {"host": "relay.example"}
        if authorization:
            headers["authorization"] = authorization
        status, answer, _ = call(with_token.app, "/status", client="203.0.113.9", headers=headers)
        assert status == 401
        assert answer["www-authenticate"].startswith("Bearer")

    def test_with_a_token_this_machine_still_may(self, with_token: Seeded) -> None:
        assert requests.get(with_token.url, timeout=10).status_code == 200

    @pytest.mark.parametrize("value", [None, "", "short"])
    def test_a_named_token_that_is_missing_or_short_stops_the_start(
        self, tmp_path: Path, value: str | None
    ) -> None:
        config = Config(server=ServerConfig(port=0, operator_token_env=TOKEN_ENV))
        environ = {} if value is None else {TOKEN_ENV: value}
        with pytest.raises(ConfigError, match=TOKEN_ENV):
            LocalStack(config, data_dir=tmp_path / "data", environ=environ)


class TestStatusCommand:
    def test_it_prints_the_same_view_as_aligned_text(self, seeded: Seeded) -> None:
        data_dir = str(seeded.stack.data_dir)
        result = cli("status", "--data", data_dir)

        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].startswith("looprelay status at ")
        assert any(f"tmux -L looprelay-r-laptop attach -t {SESSION}" in line for line in lines)
        assert any(
            line.startswith("dp-waiting") and "repository-not-served" in line for line in lines
        )
        assert any(
            f"looprelay deliveries replay d-dead --data {data_dir}" in line for line in lines
        )
        header = next(line for line in lines if line.startswith("DISPATCH "))
        row = next(line for line in lines if line.startswith("dp-waiting"))
        assert row.index(REF) == header.index("WORK ITEM")
        assert PROMPT not in result.stdout

    def test_json_is_the_pages_json(self, seeded: Seeded) -> None:
        result = cli("status", "--data", str(seeded.stack.data_dir), "--json")

        assert result.returncode == 0, result.stderr
        [line] = result.stdout.splitlines()
        from_cli = json.loads(line)
        from_page = requests.get(
            seeded.url, headers={"Accept": "application/json"}, timeout=10
        ).json()
        for part in ("runners", "sessions", "dispatches", "replays"):
            for row in (*from_cli[part], *from_page[part]):
                row.pop("last_seen_at", None)
            assert from_cli[part] == from_page[part]


def test_an_interrupted_dispatch_is_sent_again_by_the_command_the_page_gives(
    seeded: Seeded,
) -> None:
    view = requests.get(seeded.url, headers={"Accept": "application/json"}, timeout=10).json()
    [command] = [r["command"] for r in view["replays"] if r["id"] == "dp-cut"]
    words = command.split()
    assert words[:3] == ["looprelay", "dispatches", "resend"]

    result = cli(*words[1:])

    assert result.returncode == 0, result.stderr
    new_id = result.stdout.split(" sent again as ")[1].split()[0]
    view = requests.get(seeded.url, headers={"Accept": "application/json"}, timeout=10).json()
    retried = {d["dispatch_id"]: d for d in view["dispatches"]}[new_id]
    assert (retried["kind"], retried["seq"], retried["status"]) == ("deliver", 4, "pending")
    again = cli("dispatches", "--data", str(seeded.stack.data_dir), "resend", "dp-waiting")
    assert again.returncode == 1 and "only interrupted ones are sent again" in again.stderr


class TestItsOwnCloudFunction:
    """Issue 22: on the sweeper's one instance at concurrency 1, a sweep held the page up and
    a page view could make a scheduled sweep be skipped. The two are separate functions now."""

    def _apps(
        self, tmp_path: Path, fake_github: FakeGitHub, key: AppKey
    ) -> tuple[Starlette, Starlette]:
        fake_github.app_public_key = key.public_key
        config = Config(
            github=GitHubConfig(api_url=fake_github.url, app_id=APP_ID, private_key_env=KEY_ENV),
            store=StoreConfig(sqlite=SqliteConfig(path=str(tmp_path / "store.db"))),
        )
        environ = {KEY_ENV: key.private_pem}
        sweeper = build_app(config, environ, function="sweeper")
        return sweeper, build_app(config, environ, function="status")

    def test_the_sweeper_serves_no_status_page_and_the_status_function_only_that(
        self, tmp_path: Path, fake_github: FakeGitHub, github_app_key: AppKey
    ) -> None:
        sweeper, status = self._apps(tmp_path, fake_github, github_app_key)
        anywhere = {"host": "looprelay-status-abc.a.run.app"}

        assert call(sweeper, "/status", client=CLOUD_PEER, headers=anywhere)[0] == 404
        # Behind IAM, which has checked the caller: no loopback rule in the cloud.
        assert call(status, "/status", client=CLOUD_PEER, headers=anywhere)[0] == 200
        assert call(status, "/", client=CLOUD_PEER, headers=anywhere)[1]["location"] == "/status"
        assert call(status, "/sweeper", client=CLOUD_PEER, headers=anywhere)[0] == 404
        posted = call(status, "/", client=CLOUD_PEER, headers=anywhere, method="POST")
        assert posted[0] != 200 and fake_github.calls("GET", "/app/hook/deliveries") == []

    def test_a_sweep_in_progress_does_not_hold_up_the_page(
        self, tmp_path: Path, fake_github: FakeGitHub, github_app_key: AppKey
    ) -> None:
        sweeper, status = self._apps(tmp_path, fake_github, github_app_key)
        listing, answers = threading.Event(), []
        fake_github.script(match="GET /app/hook/deliveries", until=listing)
        sweep = threading.Thread(
            target=lambda: answers.append(
                call(sweeper, "/", client=CLOUD_PEER, headers={}, method="POST")
            )
        )
        sweep.start()
        try:
            _wait_for(lambda: bool(fake_github.calls("GET", "/app/hook/deliveries")))

            page = call(status, "/status", client=CLOUD_PEER, headers=JSON)

            assert page[0] == 200 and json.loads(page[2])["runners"] == []
            assert sweep.is_alive() and answers == [], "the sweep is still held by GitHub"
        finally:
            listing.set()
            sweep.join(timeout=60)
        [(swept, _, body)] = answers
        assert swept == 200, body


def _wait_for(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(0.01)
