"""``looprelay dispatches``: a settled dispatch shows what its runner reported."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from looprelay.adapters.sqlite_work_items import SqliteWorkItemStore
from looprelay.cli.root import cli
from looprelay.datadir import STORE_FILE
from tests.dispatches import make_dispatch, save_with_own_session
from tests.rigs import T0

REPOSITORY = "octo/widgets"
MESSAGE = "claude: Not logged in · Please run /login (exit 1)"


def _failed_turn(data_dir: Path) -> None:
    """A headless spawn that a runner leased and reported failed with Claude's message."""
    items = SqliteWorkItemStore(data_dir / STORE_FILE)
    try:
        dispatch = make_dispatch(repository=REPOSITORY, number=1, created_at=T0)
        assert save_with_own_session(
            items, repository=REPOSITORY, number=1, dispatches=[dispatch], now=T0
        )
        until = T0 + timedelta(minutes=1)
        assert items.lease_dispatch(dispatch.dispatch_id, runner_id="r1", now=T0, until=until)
        assert items.finish_dispatch(
            dispatch.dispatch_id,
            runner_id="r1",
            status="failed",
            result="harness-failed",
            now=T0,
            detail=f"{MESSAGE}; stderr: line one\nline two",
        )
    finally:
        items.close()


class TestDispatches:
    def test_a_failed_turn_shows_its_reason_and_the_harness_message(self, tmp_path: Path) -> None:
        _failed_turn(tmp_path)
        listed = CliRunner().invoke(cli, ["dispatches", "--data", str(tmp_path), "--all", "--json"])
        assert listed.exit_code == 0, listed.output
        [row] = [json.loads(line) for line in listed.output.splitlines()]
        assert (row["status"], row["result"]) == ("failed", "harness-failed")
        assert row["detail"] == f"{MESSAGE}; stderr: line one\nline two"

    def test_one_line_per_dispatch_in_the_text_form(self, tmp_path: Path) -> None:
        _failed_turn(tmp_path)
        listed = CliRunner().invoke(cli, ["dispatches", "--data", str(tmp_path), "--all"])
        assert listed.exit_code == 0, listed.output
        [line] = listed.output.splitlines()
        assert line.endswith(
            f"failed  r1  -  {T0.isoformat()}  harness-failed  {MESSAGE}; stderr: line one line two"
        )

    def test_open_dispatches_are_listed_without_a_result(self, tmp_path: Path) -> None:
        items = SqliteWorkItemStore(tmp_path / STORE_FILE)
        dispatch = make_dispatch(repository=REPOSITORY, number=1, created_at=T0)
        save_with_own_session(items, repository=REPOSITORY, number=1, dispatches=[dispatch], now=T0)
        items.close()
        listed = CliRunner().invoke(cli, ["dispatches", "--data", str(tmp_path), "--json"])
        [row] = [json.loads(line) for line in listed.output.splitlines()]
        assert (row["status"], row["result"], row["detail"]) == ("pending", None, None)
