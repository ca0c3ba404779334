"""`looprelay app create` from a fresh data directory to a routed delivery: one command, one
click on its page (driven with an HTTP client, as a browser posts the form), against the
stand-in for github.com and its API."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
import requests

from looprelay.cli.sender import comment_payload
from tests.fake_github import INSTALLATION_ID, FakeGitHub
from tests.fake_harness import wait_until
from tests.samples import AUTO_LABEL
from tests.test_up import LOOPRELAY, ROOT, UpProcess, _wait_settled

WAIT = 60.0


class _Form(HTMLParser):
    """The page's form: its action and its fields, as a browser would post them."""

    def __init__(self) -> None:
        super().__init__()
        self.action = ""
        self.fields: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "form":
            self.action = found.get("action") or ""
        if tag == "input" and found.get("name"):
            self.fields[str(found["name"])] = found.get("value") or ""


class AppCreate:
    """A running `looprelay app create`; ``page`` is the setup page's URL it printed."""

    def __init__(self, data: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*LOOPRELAY, "app", "create", "--data", str(data), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()  # blocks until it prints the page, or exits
        found = re.search(r"Open (http://127\.0\.0\.1:\d+/)", line)
        assert found, line + self.proc.stderr.read()
        self.page = found.group(1)

    def form(self) -> _Form:
        response = requests.get(self.page, timeout=WAIT)
        assert response.status_code == 200
        parsed = _Form()
        parsed.feed(response.text)
        return parsed

    def finish(self) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=WAIT)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.communicate(timeout=WAIT)


@pytest.fixture
def free_port() -> int:
    """A port free now, for the `up` the App's webhook URL points at."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def stray() -> Iterator[list[AppCreate]]:
    started: list[AppCreate] = []
    yield started
    for run in started:
        run.kill()


def test_one_command_and_one_click_reach_a_routed_signed_delivery(
    tmp_path: Path, fake_github: FakeGitHub, free_port: int, stray: list[AppCreate]
) -> None:
    data = tmp_path / "fresh" / "data"
    webhook = f"http://127.0.0.1:{free_port}/webhook"
    # --github-url as for GitHub Enterprise Server: the API is then {url}/api/v3.
    run = AppCreate(data, "--github-url", fake_github.url, "--webhook-url", webhook)
    stray.append(run)
    form = run.form()
    assert form.action.startswith(f"{fake_github.url}/settings/apps/new?state=")

    forged = requests.get(f"{run.page}callback?code=stolen&state=guessed", timeout=WAIT)
    assert forged.status_code == 400 and "state" in forged.text
    assert not fake_github.calls("POST", "/conversions")
    assert not data.exists()

    clicked = requests.post(form.action, data=form.fields, timeout=WAIT)  # the button
    assert clicked.status_code == 200 and "App created" in clicked.text, clicked.text
    code, out, err = run.finish()
    assert code == 0, err
    created = fake_github.created
    assert created is not None
    [manifest] = fake_github.manifests
    assert manifest["hook_attributes"]["url"] == webhook
    assert manifest["redirect_url"] == f"{run.page}callback"
    assert manifest["public"] is False
    assert manifest["default_permissions"] == {
        "issues": "write",
        "pull_requests": "write",
        "metadata": "read",
    }
    assert set(manifest["default_events"]) == {
        "issues",
        "issue_comment",
        "pull_request",
        "pull_request_review",
        "pull_request_review_comment",
    }
    assert f"App created: {created['slug']} (id {created['id']})" in out
    assert f"https://github.com/apps/{created['slug']}/installations/new" in out
    for secret in ("webhook_secret", "client_secret"):
        assert created[secret] not in out + err
    assert "PRIVATE KEY" not in out + err
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    for path in data.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path

    config = tmp_path / "looprelay.yaml"  # who may command, nothing about GitHub
    config.write_text("routing:\n  authorizedUsers: [octocat]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB", "LOOPRELAY"))}
    up = UpProcess(data, "--port", str(free_port), "--config", str(config), env=env)
    try:
        banner = up.stderr_path.read_text()
        assert f"GitHub App {created['slug']} (id {created['id']})" in banner
        [missing] = [line for line in banner.splitlines() if "has no label" in line]
        assert missing == (
            f"octo/widgets has no label {AUTO_LABEL!r}; create it: gh label create "
            f"'{AUTO_LABEL}' --repo octo/widgets --color 0E8A16 --description "
            "'looprelay: arms an issue or pull request'"
        )
        payload = comment_payload(
            repository="octo/widgets",
            issue=5,
            body="the-loop start",
            login="octocat",
            labels=[AUTO_LABEL],
        )
        payload["installation"] = {"id": INSTALLATION_ID}
        assert fake_github.deliver("issue_comment", payload, delivery_id="first") == 202
        [row] = _wait_settled(data, 1, timeout=WAIT)
        assert (row["delivery_id"], row["outcome"]) == ("first", "dispatched"), row
        # The App's own installation token posted the checklist: the App's key works.
        posted = wait_until(lambda: fake_github.on(5), seconds=WAIT, what="the checklist")
        assert [c.author for c in posted] == [fake_github.app_login]
    finally:
        up.stop()


def test_org_posts_to_the_organization_and_github_com_is_the_default(
    tmp_path: Path, stray: list[AppCreate]
) -> None:
    run = AppCreate(
        tmp_path / "data", "--org", "acme", "--webhook-url", "https://relay.example/webhook"
    )
    stray.append(run)
    assert run.form().action.startswith(
        "https://github.com/organizations/acme/settings/apps/new?state="
    )
