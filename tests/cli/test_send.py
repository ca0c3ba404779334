"""Trying looprelay without fixtures: the banner's own command, run as printed, builds and
signs a comment and the server records it."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import requests

from tests.fake_harness import wait_until
from tests.test_up import UpProcess, cli


def test_the_banners_try_it_command_works_from_a_shell_and_is_recorded(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = UpProcess(data)
    try:
        banner = up.stderr_path.read_text()
        [command] = re.findall(r"try it:\s+(.+)", banner)
        args = shlex.split(command)
        # It names this very program, so the user's shell finds it whatever PATH holds.
        assert Path(args[0]).is_absolute() and args[1:3] == ["-m", "looprelay.cli"]
        assert "--comment" in args and "--url" in args
        sent = subprocess.run(
            [*args, "--label", "the-loop: auto-execute", "--user", "hubot"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,  # not the checkout: no fixture file is needed
        )
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout.startswith("20")
        listed = cli("deliveries", "--data", str(data), "--json")
        [row] = [json.loads(line) for line in listed.stdout.splitlines()]
        assert (row["event"], row["action"]) == ("issue_comment", "created")
        envelope = row["envelope"]  # an object in --json, not a JSON string
        assert envelope["comment"]["body"] == "hello"
        assert envelope["issue"]["labels"] == ["the-loop: auto-execute"]
        assert envelope["sender"]["login"] == "hubot"
    finally:
        assert up.stop() == 0


def test_the_banner_names_the_status_page_and_tries_it_as_an_authorized_user(
    tmp_path: Path,
) -> None:
    config = tmp_path / "looprelay.yaml"
    config.write_text("routing:\n  authorizedUsers: [{login: codertocat, id: 21031067}]\n")
    data = tmp_path / "data"
    up = UpProcess(data, "--config", str(config))
    try:
        banner = up.stderr_path.read_text()
        [status_url] = re.findall(r"status page\s+(\S+)", banner)
        assert status_url == up.webhook_url.removesuffix("/webhook") + "/status"
        assert requests.get(status_url, timeout=10).status_code == 200
        [command] = re.findall(r"try it:\s+(.+)", banner)
        args = shlex.split(command)
        assert args[args.index("--user") + 1 :][:3] == ["codertocat", "--user-id", "21031067"]
        sent = subprocess.run(
            [*args, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
        )
        assert sent.returncode == 0, sent.stderr

        def settled() -> dict[str, object] | None:
            listed = cli("deliveries", "--data", str(data), "--json")
            rows = [json.loads(line) for line in listed.stdout.splitlines()]
            return rows[0] if rows and rows[0]["outcome"] != "received" else None

        row = wait_until(settled, seconds=30, what="the try-it delivery settled")
        assert not str(row["outcome"]).startswith("refused"), row
    finally:
        assert up.stop() == 0


def test_send_needs_a_payload_or_a_comment() -> None:
    result = cli("send", "--url", "http://127.0.0.1:9/webhook")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        'error: give PAYLOAD --event EVENT, or --comment "TEXT"'
    )
