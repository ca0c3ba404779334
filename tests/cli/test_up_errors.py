"""Mistakes an operator makes starting `looprelay up` or sending to it: each ends in one line
that starts with ``error:`` and says what to change, never a traceback, and nothing is left
behind. The real entry point runs in a process, as the operator runs it."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.samples import FIXTURES
from tests.test_up import LOOPRELAY, ROOT, UpProcess


def looprelay(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``looprelay *args`` to completion with ``env`` added to this environment."""
    return subprocess.run(
        [*LOOPRELAY, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    """The error line of a failed command, after checking there is no traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), result.stderr
    return last


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process (this test) listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


class TestUpRefusals:
    def test_a_port_in_use_is_one_line_and_leaves_no_secret(
        self, tmp_path: Path, taken_port: int
    ) -> None:
        data = tmp_path / "data"
        result = looprelay("up", "--data", str(data), "--port", str(taken_port))
        line = one_error(result)
        assert f"127.0.0.1:{taken_port} is already in use" in line
        assert "--port" in line
        assert not data.exists()  # no secret, no database behind

    def test_a_port_out_of_range_names_the_range(self, tmp_path: Path) -> None:
        line = one_error(looprelay("up", "--data", str(tmp_path / "d"), "--port", "99999"))
        assert "0<=x<=65535" in line

    def test_a_data_directory_that_is_a_file_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "file"
        path.write_text("mine\n")
        line = one_error(looprelay("up", "--data", str(path), "--port", "0"))
        assert "not a directory" in line
        assert path.read_text() == "mine\n"

    def test_a_data_directory_whose_parent_cannot_hold_it_is_refused(self, tmp_path: Path) -> None:
        parent = tmp_path / "file"
        parent.write_text("")
        line = one_error(looprelay("up", "--data", str(parent / "data"), "--port", "0"))
        assert f"cannot create the data directory {parent / 'data'}" in line

    def test_a_broken_environment_override_names_the_variable(self, tmp_path: Path) -> None:
        result = looprelay(
            "up", "--data", str(tmp_path / "d"), env={"LOOPRELAY__SERVER__PORT": "many"}
        )
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert result.stderr.startswith("error: ")
        assert "server.port: " in result.stderr
        assert "(set by LOOPRELAY__SERVER__PORT)" in result.stderr

    def test_an_environment_value_that_is_not_yaml_is_one_line(self, tmp_path: Path) -> None:
        line = one_error(
            looprelay("up", "--data", str(tmp_path / "d"), env={"LOOPRELAY__server__host": "[x"})
        )
        assert "LOOPRELAY__server__host: the value is not valid YAML" in line

    def test_an_unknown_log_level_is_a_usage_error(self, tmp_path: Path) -> None:
        line = one_error(looprelay("up", "--data", str(tmp_path / "d"), "--log-level", "loud"))
        assert "'loud' is not one of 'debug', 'info', 'warning', 'error'" in line


class TestUpLogs:
    def test_lower_case_debug_is_accepted_and_text_logs_are_readable(self, tmp_path: Path) -> None:
        up = UpProcess(tmp_path / "data", "--log-level", "debug", "--log-format", "text")
        try:
            output = up.stderr_path.read_text()
        finally:
            assert up.stop() == 0
        serving = [line for line in output.splitlines() if "looprelay up serving" in line]
        assert serving and " INFO    looprelay up serving  url=http://127.0.0.1:" in serving[0]
        assert not any(line.startswith("{") for line in output.splitlines())


class TestSend:
    def test_sending_to_a_stopped_server_says_to_start_it(self, tmp_path: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]  # free once closed: nothing listens there
        url = f"http://127.0.0.1:{port}/webhook"
        result = looprelay(
            "send",
            str(FIXTURES / "issue_comment.created.json"),
            *("--event", "issue_comment", "--url", url, "--secret-env", "SECRET"),
            env={"SECRET": "a" * 32},
        )
        line = one_error(result)
        assert (
            line
            == f"error: nothing answers at {url}; start `looprelay up` or pass the --url it printed"
        )


class TestRunnerServerWarning:
    def test_plain_http_to_another_machine_is_warned_about(self, tmp_path: Path) -> None:
        # 0.0.0.0 is not loopback, yet nothing listens there: the warning, then a clear error.
        result = looprelay(
            "runner",
            "register",
            *("--server", "http://0.0.0.0:9", "--token", "t", "--name", "box"),
            *("--credentials", str(tmp_path / "runner.json")),
        )
        assert result.stderr.startswith(
            "warning: http://0.0.0.0:9 is plain http to another machine: the runner's secret "
            "and every prompt cross the network unencrypted; use https"
        )
        one_error(result)

    def test_plain_http_on_loopback_is_not(self, tmp_path: Path) -> None:
        result = looprelay(
            "runner",
            "register",
            *("--server", "http://127.0.0.1:9", "--token", "t", "--name", "box"),
            *("--credentials", str(tmp_path / "runner.json")),
        )
        assert "warning" not in result.stderr
        one_error(result)
