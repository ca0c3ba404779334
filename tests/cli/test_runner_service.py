"""`looprelay runner service install|uninstall`: the files an operator gets, checked by
systemd's own verifier where it is installed."""

from __future__ import annotations

import plistlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_up_errors import looprelay, one_error


def _run_args(checkout: Path) -> list[str]:
    return ["--checkout", f"octo/widgets={checkout}", "--capacity", "2"]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    path = tmp_path / "my checkout 100%"  # a space and a specifier, as systemd reads them
    path.mkdir()
    return path


def test_a_systemd_unit_runs_the_agent_with_the_options_given(
    tmp_path: Path, checkout: Path
) -> None:
    units = tmp_path / "units"
    result = looprelay(
        "runner", "service", "install", "--kind", "systemd", "--dir", str(units), "--",
        *_run_args(checkout),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    unit = units / "looprelay-runner.service"
    assert result.stdout.splitlines() == [
        f"wrote {unit}",
        "  start:  systemctl --user daemon-reload && systemctl --user enable --now "
        "looprelay-runner",
        "  stop:   systemctl --user stop looprelay-runner",
        "  logs:   journalctl --user -u looprelay-runner -f",
        "  at boot without logging in: loginctl enable-linger $USER",
    ]
    lines = unit.read_text().splitlines()
    [exec_start] = [line for line in lines if line.startswith("ExecStart=")]
    # systemd's quoting is shell-like once its %-specifiers are undone.
    words = shlex.split(exec_start.removeprefix("ExecStart=").replace("%%", "%"))
    assert words == [sys.executable, "-m", "looprelay.cli", "runner", "run", *_run_args(checkout)]
    for expected in ("Restart=on-failure", "TimeoutStopSec=120", "WantedBy=default.target"):
        assert expected in lines
    assert any(line.startswith('Environment="PATH=') or line.startswith("Environment=PATH=")
               for line in lines)  # fmt: skip
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed; the unit's content was checked")
    verified = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert (verified.returncode, verified.stderr) == (0, ""), verified.stderr


def test_a_launchd_agent_runs_the_agent_and_restarts_it_on_failure(
    tmp_path: Path, checkout: Path
) -> None:
    agents = tmp_path / "LaunchAgents"
    result = looprelay(
        "runner", "service", "install", "--kind", "launchd", "--dir", str(agents),
        "--name", "laptop", "--", *_run_args(checkout),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    path = agents / "dev.looprelay.laptop.plist"
    plist = plistlib.loads(path.read_bytes())
    assert plist["Label"] == "dev.looprelay.laptop"
    assert plist["ProgramArguments"] == [
        sys.executable, "-m", "looprelay.cli", "runner", "run", *_run_args(checkout),
    ]  # fmt: skip
    assert plist["KeepAlive"] == {"SuccessfulExit": False} and plist["RunAtLoad"] is True
    assert plist["StandardErrorPath"].endswith("Library/Logs/laptop.log")
    assert f"launchctl bootstrap gui/$(id -u) {path}" in result.stdout
    assert "launchctl bootout gui/$(id -u)/dev.looprelay.laptop" in result.stdout


def test_options_runner_run_refuses_write_nothing(tmp_path: Path) -> None:
    units = tmp_path / "units"
    result = looprelay(
        "runner", "service", "install", "--dir", str(units), "--", "--capacity", "none"
    )
    assert "--capacity" in one_error(result)
    assert not units.exists()


def test_uninstall_removes_the_file_and_a_second_one_says_there_is_none(
    tmp_path: Path, checkout: Path
) -> None:
    units = tmp_path / "units"
    args = ("runner", "service")
    assert (
        looprelay(*args, "install", "--dir", str(units), "--", *_run_args(checkout)).returncode == 0
    )
    removed = looprelay(*args, "uninstall", "--dir", str(units))
    assert removed.returncode == 0, removed.stderr
    assert "systemctl --user stop looprelay-runner" in removed.stdout
    assert not (units / "looprelay-runner.service").exists()
    again = one_error(looprelay(*args, "uninstall", "--dir", str(units)))
    assert "nothing removed" in again
