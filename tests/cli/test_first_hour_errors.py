"""A new operator's first commands, run in the wrong order or with something missing, end in
one line saying what to do, never a library's internals."""

from __future__ import annotations

import socket
from pathlib import Path

from click.testing import CliRunner

from looprelay.cli.root import ERROR_PREFIX, cli


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_runner_register_with_the_server_down_says_so_in_one_line(tmp_path: Path) -> None:
    server = f"http://127.0.0.1:{_closed_port()}"
    result = CliRunner().invoke(
        cli,
        [
            "runner",
            "register",
            "--server",
            server,
            "--token",
            "t",
            "--name",
            "laptop",
            "--credentials",
            str(tmp_path / "runner.json"),
        ],
    )
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines == [
        f"{ERROR_PREFIX}nothing answers at {server}: is looprelay running there "
        "(`looprelay up`), and is --server its address?"
    ]
    assert not (tmp_path / "runner.json").exists()


def test_status_before_the_first_up_says_there_is_no_data_directory_yet(tmp_path: Path) -> None:
    missing = tmp_path / "state" / "looprelay"
    result = CliRunner().invoke(cli, ["status", "--data", str(missing)])
    assert result.exit_code == 1
    assert (
        result.output.strip()
        .splitlines()[-1]
        .startswith(
            f"{ERROR_PREFIX}no data directory at {missing} yet: start looprelay once with "
            "`looprelay up`"
        )
    )
    assert "unable to open database file" not in result.output
    assert not missing.exists()  # reading never creates it


def test_deliveries_before_the_first_up_say_the_same(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    result = CliRunner().invoke(cli, ["deliveries", "--data", str(missing)])
    assert result.exit_code == 1
    assert f"no data directory at {missing} yet" in result.output


def test_runner_run_without_checkout_or_workspace_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["runner", "run", "--credentials", str(tmp_path / "runner.json")]
    )
    assert result.exit_code == 2
    assert "give --checkout owner/repo=/path/to/checkout (repeat for more) or --workspace DIR" in (
        result.output
    )
