"""`looprelay up` and `looprelay send` as an operator runs them: real processes, real HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from looprelay.agent.client import RunnerClient
from looprelay.agent.credentials import read_credentials
from looprelay.cli.sender import post_delivery
from looprelay.datadir import WEBHOOK_SECRET_FILE, read_secret
from tests.samples import FIXTURES, payload_bytes

ROOT = Path(__file__).resolve().parents[1]
LOOPRELAY = [sys.executable, "-m", "looprelay.cli"]
START_TIMEOUT = 30.0


class UpProcess:
    """A running `looprelay up` on a free port with its own data directory.

    ``command`` is what runs ``looprelay`` (a wrapper may stand in, as the fault suite's boot
    module does); ``env`` replaces the environment. Output goes to ``stderr_path``.
    """

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        command: Sequence[str] = LOOPRELAY,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.stderr_path = data_dir.parent / f"up-{uuid.uuid4().hex[:6]}.err"
        self._stderr = self.stderr_path.open("w")
        self.proc = subprocess.Popen(
            [*command, "up", "--data", str(data_dir), "--port", "0", *extra],
            stdout=self._stderr,  # the JSON log lines, beside the banner
            stderr=self._stderr,
            start_new_session=True,
            env=env,
            cwd=ROOT,
        )
        self.webhook_url = self._wait_for_banner()

    def _wait_for_banner(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            found = re.search(r"webhook URL\s+(\S+)", self.stderr_path.read_text())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise AssertionError(f"looprelay up exited: {self.stderr_path.read_text()}")
            time.sleep(0.05)
        raise AssertionError("looprelay up printed no banner")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self._stderr.close()
        return code


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``looprelay *args`` to completion (60 s at most) and capture its output."""
    return subprocess.run(
        [*LOOPRELAY, *args], capture_output=True, text=True, timeout=60, check=False
    )


def _ledger(data_dir: Path) -> list[dict[str, Any]]:
    result = cli("deliveries", "--data", str(data_dir), "--json", "--limit", "100000")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def _settled_events(data_dir: Path) -> Counter[str]:
    result = cli("events", "--data", str(data_dir), "--json", "--name", "delivery.settled")
    assert result.returncode == 0, result.stderr
    return Counter(json.loads(line)["delivery_id"] for line in result.stdout.splitlines())


def _wait_settled(data_dir: Path, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        ledger = _ledger(data_dir)
        if sum(1 for row in ledger if row["outcome"] != "received") >= count:
            return ledger
        if time.monotonic() > deadline:
            raise AssertionError(f"only {ledger} settled")
        time.sleep(0.2)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def up(data_dir: Path) -> Iterator[UpProcess]:
    process = UpProcess(data_dir)
    yield process
    process.stop(signal.SIGKILL)


class TestUpAndSend:
    def test_first_start_generates_a_private_secret_and_says_where(
        self, up: UpProcess, data_dir: Path
    ) -> None:
        secret_file = data_dir / WEBHOOK_SECRET_FILE
        assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
        assert len(read_secret(secret_file)) == 64
        banner = up.stderr_path.read_text()
        assert str(secret_file) in banner
        assert re.search(r"-m looprelay.cli send --comment|looprelay send --comment", banner)
        assert up.webhook_url.startswith("http://127.0.0.1:")

    def test_a_sent_comment_is_recorded_once_and_a_resend_changes_nothing(
        self, up: UpProcess, data_dir: Path
    ) -> None:
        fixture = str(FIXTURES / "issue_comment.created.json")
        args = [
            "send",
            fixture,
            "--event",
            "issue_comment",
            "--url",
            up.webhook_url,
            "--data",
            str(data_dir),
            "--delivery",
            "d-send-1",
        ]
        first = cli(*args)
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith("202 ") and '"queued"' in first.stdout
        [row] = _wait_settled(data_dir, 1)
        assert (row["delivery_id"], row["event"], row["attempts"]) == (
            "d-send-1",
            "issue_comment",
            1,
        )
        again = cli(*args)  # queued again: the ledger, not the queue, keeps it from running twice
        assert again.returncode == 0 and '"queued"' in again.stdout
        time.sleep(0.5)
        assert _ledger(data_dir) == [row]
        assert _settled_events(data_dir) == Counter({"d-send-1": 1})

    def test_send_with_a_wrong_secret_fails_with_401(self, up: UpProcess, data_dir: Path) -> None:
        env = os.environ | {"WRONG_SECRET": "not-the-secret"}
        result = subprocess.run(
            [
                *LOOPRELAY,
                "send",
                str(FIXTURES / "issues.opened.json"),
                "--event",
                "issues",
                "--url",
                up.webhook_url,
                "--secret-env",
                "WRONG_SECRET",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
        assert result.returncode == 1
        assert result.stdout.startswith("401 ")
        assert _ledger(data_dir) == []

    def test_a_second_up_on_the_same_data_directory_is_refused(
        self, up: UpProcess, data_dir: Path
    ) -> None:
        result = cli("up", "--data", str(data_dir), "--port", "0")
        assert result.returncode == 1
        assert "another `looprelay up` is using" in result.stderr


class TestRestart:
    def _burst(self, url: str, secret: bytes, count: int) -> list[str]:
        body = payload_bytes("issue_comment.created")
        ids = [f"d-burst-{index}" for index in range(count)]
        with ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(
                    lambda delivery: post_delivery(
                        url=url,
                        event="issue_comment",
                        body=body,
                        secret=secret,
                        delivery_id=delivery,
                    ),
                    ids,
                )
            )
        assert [status for status, _ in results] == [202] * count
        return ids

    def test_killed_with_tasks_queued_then_restarted_settles_each_exactly_once(
        self, data_dir: Path
    ) -> None:
        first = UpProcess(data_dir)
        secret = read_secret(data_dir / WEBHOOK_SECRET_FILE).encode()
        ids = self._burst(first.webhook_url, secret, 60)
        first.stop(signal.SIGKILL)  # no chance to finish anything in flight
        second = UpProcess(data_dir)
        try:
            ledger = _wait_settled(data_dir, len(ids))
        finally:
            assert second.stop() == 0
        assert sorted(row["delivery_id"] for row in ledger) == sorted(ids)
        assert _settled_events(data_dir) == Counter(dict.fromkeys(ids, 1))

    def test_ctrl_c_stops_cleanly_and_keeps_what_was_queued(self, data_dir: Path) -> None:
        first = UpProcess(data_dir)
        secret = read_secret(data_dir / WEBHOOK_SECRET_FILE).encode()
        ids = self._burst(first.webhook_url, secret, 20)
        assert first.stop(signal.SIGINT) == 0
        assert "queued tasks stay on disk" in first.stderr_path.read_text()
        second = UpProcess(data_dir)
        try:
            ledger = _wait_settled(data_dir, len(ids))
        finally:
            second.stop()
        assert sorted(row["delivery_id"] for row in ledger) == sorted(ids)
        assert _settled_events(data_dir) == Counter(dict.fromkeys(ids, 1))


class TestRunnerRegistration:
    def test_an_operator_mints_a_token_and_a_runner_registers_with_it(
        self, up: UpProcess, data_dir: Path, tmp_path: Path
    ) -> None:
        minted = cli("runners", "token", "--data", str(data_dir), "--ttl", "10m")
        assert minted.returncode == 0, minted.stderr
        token = minted.stdout.strip()
        assert token.startswith("lrreg_") and "\n" not in token
        server = up.webhook_url.removesuffix("/webhook")
        credentials = tmp_path / "runner.json"
        registered = cli(
            "runner",
            "register",
            "--server",
            server,
            "--token",
            token,
            "--name",
            "ci-box",
            "--label",
            "os=linux",
            "--credentials",
            str(credentials),
        )
        assert registered.returncode == 0, registered.stderr
        assert oct(credentials.stat().st_mode & 0o777) == "0o600"
        saved = json.loads(credentials.read_text())
        assert saved["server"] == server and saved["name"] == "ci-box"

        listed = cli("runners", "list", "--data", str(data_dir), "--json")
        [row] = [json.loads(line) for line in listed.stdout.splitlines()]
        assert row["status"] == "not-started"  # live once its agent runs
        assert (row["runner_id"], row["labels"], row["revoked_at"]) == (
            saved["runner_id"],
            {"os": "linux"},
            None,
        )
        assert saved["secret"] not in listed.stdout

        reused = cli(
            "runner",
            "register",
            "--server",
            server,
            "--token",
            token,
            "--name",
            "other",
            "--credentials",
            str(tmp_path / "other.json"),
        )
        assert reused.returncode == 1
        assert "already used" in reused.stderr
        assert not (tmp_path / "other.json").exists()

        # Registering again over the same credentials is refused before the token is spent.
        second = cli("runners", "token", "--data", str(data_dir)).stdout.strip()
        register = ["runner", "register", "--server", server, "--token", second, "--name", "new"]
        kept = cli(*register, "--credentials", str(credentials))
        assert kept.returncode == 1
        assert kept.stderr.strip() == (
            f"error: {credentials} already holds a runner's credentials; pass --replace to "
            "overwrite them, or --credentials to write another file"
        )
        assert json.loads(credentials.read_text()) == saved
        replaced = cli(*register, "--credentials", str(credentials), "--replace")
        assert replaced.returncode == 0, replaced.stderr
        assert json.loads(credentials.read_text())["name"] == "new"

        assert cli("runners", "revoke", "--data", str(data_dir), saved["runner_id"]).returncode == 0
        again = cli("runners", "list", "--data", str(data_dir))
        assert "revoked" in again.stdout


class TestQuietStop:
    @pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
    def test_a_stop_with_a_poll_waiting_answers_it_and_prints_no_traceback(
        self, sig: int, data_dir: Path, tmp_path: Path
    ) -> None:
        # Issue 24: Ctrl-C with an agent connected waited 5 s, then printed the watchdog's
        # "health check failed", "Cancel 2 running task(s)" and two tracebacks.
        up = UpProcess(data_dir, "--log-level", "DEBUG")
        try:
            credentials = tmp_path / "runner.json"
            token = cli("runners", "token", "--data", str(data_dir)).stdout.strip()
            server = up.webhook_url.removesuffix("/webhook")
            registered = cli(
                "runner", "register", "--server", server, "--token", token,
                "--name", "quiet", "--credentials", str(credentials),
            )  # fmt: skip
            assert registered.returncode == 0, registered.stderr
            client = RunnerClient(read_credentials(credentials))
            polled: list[object] = []
            waiting = threading.Thread(target=lambda: polled.append(client.poll(50)))
            waiting.start()
            deadline = time.monotonic() + START_TIMEOUT
            waits = f"a poll of runner {client.runner_id} waits"
            while waits not in up.stderr_path.read_text():
                assert time.monotonic() < deadline, "the poll never reached the server"
                time.sleep(0.1)
            assert up.stop(sig) == 0
            waiting.join(START_TIMEOUT)
            assert polled == [None]  # answered "no work" (204), not cut off
        finally:
            up.stop(signal.SIGKILL)
        log = up.stderr_path.read_text()
        for noise in ("Traceback", "Cancel ", "health check", "Exception in ASGI application"):
            assert noise not in log, log
