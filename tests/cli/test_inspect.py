"""``looprelay dispatches``: a settled dispatch shows what its runner reported."""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from looprelay.adapters.sqlite.runners import SqliteRunnerRegistry
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore
from looprelay.cli.root import cli
from looprelay.core.model import DeliveryRecord, EventRecord, RunnerRecord
from looprelay.datadir import STORE_FILE
from tests.dispatches import make_dispatch, save_with_own_session
from tests.rigs import T0
from tests.test_up import LOOPRELAY

REPOSITORY = "octo/widgets"
MESSAGE = "claude: Not logged in · Please run /login (exit 1)"


def _failed_turn(
    data_dir: Path,
    *,
    result: str = "harness-failed",
    detail: str = f"{MESSAGE}; stderr: line one\nline two",
) -> None:
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
            result=result,
            now=T0,
            detail=detail,
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
        header, line = listed.output.splitlines()
        assert header.split()[:4] == ["DISPATCH", "ID", "WORK", "ITEM"]
        # Aligned under the headers; the time relative, an empty value a dash.
        assert line.index("failed") == header.index("STATUS")
        assert re.search(
            rf"failed +r1 +- +\d+d ago +harness-failed +- +{re.escape(MESSAGE)}; "
            "stderr: line one line two$",
            line,
        )

    def test_open_dispatches_are_listed_without_a_result(self, tmp_path: Path) -> None:
        items = SqliteWorkItemStore(tmp_path / STORE_FILE)
        dispatch = make_dispatch(repository=REPOSITORY, number=1, created_at=T0)
        save_with_own_session(items, repository=REPOSITORY, number=1, dispatches=[dispatch], now=T0)
        items.close()
        listed = CliRunner().invoke(cli, ["dispatches", "--data", str(tmp_path), "--json"])
        [row] = [json.loads(line) for line in listed.output.splitlines()]
        assert (row["status"], row["result"], row["detail"]) == ("pending", None, None)


class TestInterruptedDispatches:
    def _rows(self, data_dir: Path, *args: str) -> list[dict[str, Any]]:
        listed = CliRunner().invoke(cli, ["dispatches", "--data", str(data_dir), "--json", *args])
        assert listed.exit_code == 0, listed.output
        return [json.loads(line) for line in listed.output.splitlines()]

    def test_one_is_listed_with_the_command_that_sends_it_again_once(self, tmp_path: Path) -> None:
        _failed_turn(tmp_path, result="interrupted", detail="the agent stopped while applying it")

        [row] = self._rows(tmp_path)  # listed without --all: an operator must act on it
        command = f"looprelay dispatches resend dp-1-1 --data {tmp_path}"
        assert (row["status"], row["result"], row["resend"]) == ("failed", "interrupted", command)

        sent = CliRunner().invoke(cli, command.split()[1:])
        assert sent.exit_code == 0, sent.output
        again = sent.output.split(" sent again as ")[1].split()[0]
        old, new = self._rows(tmp_path, "--all")
        assert (old["dispatch_id"], old["resend"]) == ("dp-1-1", f"sent again as {again}")
        assert (new["dispatch_id"], new["status"], new["seq"], new["runner"]) == (
            again,
            "pending",
            2,
            "r1",
        )
        items = SqliteWorkItemStore(tmp_path / STORE_FILE)
        try:
            stored = items.get_dispatch(again)
            assert (
                stored is not None
                and stored.prompt
                == make_dispatch(repository=REPOSITORY, number=1, created_at=T0).prompt
            )
        finally:
            items.close()

        twice = CliRunner().invoke(cli, command.split()[1:])
        assert twice.exit_code == 1
        assert f"dp-1-1 was sent again already as {again} (pending)" in twice.output

    def test_a_dispatch_that_was_not_interrupted_is_not_sent_again(self, tmp_path: Path) -> None:
        _failed_turn(tmp_path)
        assert [r["resend"] for r in self._rows(tmp_path, "--all")] == [None]
        assert self._rows(tmp_path) == []

        refused = CliRunner().invoke(
            cli, ["dispatches", "resend", "dp-1-1", "--data", str(tmp_path)]
        )
        assert refused.exit_code == 1
        assert "dp-1-1 is failed (harness-failed); only interrupted ones are sent again" in (
            refused.output
        )
        unknown = CliRunner().invoke(cli, ["dispatches", "resend", "dp-9", "--data", str(tmp_path)])
        assert "no dispatch dp-9" in unknown.output


def _log(
    data_dir: Path, names: list[str], *, at: datetime = T0, work_item: str | None = None
) -> None:
    store = SqliteStore(data_dir / STORE_FILE)
    try:
        for name in names:
            store.append_event(EventRecord(name=name, at=at, work_item=work_item))
    finally:
        store.close()


class TestEvents:
    def test_shows_the_newest_events_oldest_first(self, tmp_path: Path) -> None:
        _log(tmp_path, [f"e{n}" for n in range(1_200)])
        listed = CliRunner().invoke(cli, ["events", "--data", str(tmp_path), "--json"])
        assert listed.exit_code == 0, listed.output
        names = [json.loads(line)["name"] for line in listed.output.splitlines()]
        assert len(names) == 1_000 and names[0] == "e200" and names[-1] == "e1199"

        few = CliRunner().invoke(cli, ["events", "--data", str(tmp_path), "--limit", "2"])
        header, *rows = few.output.splitlines()
        assert header.split() == ["AT", "NAME", "DELIVERY", "ID", "WORK", "ITEM", "DATA"]
        assert [row.split("ago")[1].split()[0] for row in rows] == ["e1198", "e1199"]

    def test_follow_starts_now_and_prints_every_event_of_a_burst_at_one_instant(
        self, tmp_path: Path
    ) -> None:
        _log(tmp_path, ["before-1", "before-2"])
        follower = subprocess.Popen(
            [*LOOPRELAY, "events", "--data", str(tmp_path), "--json", "--follow", "--limit", "3"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert follower.stdout is not None
            # Once the follower has found where "now" is, a marker written then comes out;
            # until then markers are "before" it. Write one every half second until one shows.
            first = ""
            for n in range(120):
                _log(tmp_path, [f"marker-{n}"])
                ready, _, _ = select.select([follower.stdout], [], [], 0.5)
                if ready:
                    first = json.loads(follower.stdout.readline())["name"]
                    break
            burst = [f"burst-{n}" for n in range(50)]
            _log(tmp_path, burst, at=T0 + timedelta(hours=1))  # one timestamp, pages of 3
            lines: list[str] = []
            while sum(name.startswith("burst-") for name in lines) < len(burst):
                lines.append(json.loads(follower.stdout.readline())["name"])
            follower.send_signal(signal.SIGINT)  # Ctrl-C is how one stops following
            assert follower.wait(30) == 0
        finally:
            follower.kill()
            follower.wait()

        assert first.startswith("marker-")  # nothing from before it started
        assert [name for name in lines if name.startswith("burst-")] == burst

    def test_a_work_item_filter_matches_in_any_case(self, tmp_path: Path) -> None:
        _log(tmp_path, ["one"], work_item="github:octo/repo#1")
        _log(tmp_path, ["other"], work_item="github:octo/repo#11")
        for given in ("github:Octo/Repo#1", "GitHub:OCTO/repo#1", " github:octo/repo#1"):
            listed = CliRunner().invoke(
                cli, ["events", "--data", str(tmp_path), "--work-item", given, "--json"]
            )
            assert listed.exit_code == 0, listed.output
            assert [json.loads(line)["name"] for line in listed.output.splitlines()] == ["one"]

    def test_a_work_item_filter_that_names_none_is_refused(self, tmp_path: Path) -> None:
        listed = CliRunner().invoke(
            cli, ["events", "--data", str(tmp_path), "--work-item", "octo/repo#1"]
        )
        assert listed.exit_code == 2
        assert "error: Invalid value for --work-item: 'octo/repo#1'" in listed.output
        assert "expected github:owner/repo#N" in listed.output


class TestOptionsEitherSideOfTheArgument:
    """`--data` (and every option) works before or after a command's argument, and on the
    group for `deliveries` and `dispatches`: it is the state that is acted on."""

    @pytest.mark.parametrize(
        "args",
        [
            ["deliveries", "replay", "d-dead", "--data", "{data}"],
            ["deliveries", "replay", "--data", "{data}", "d-dead"],
            ["deliveries", "--data", "{data}", "replay", "d-dead"],
        ],
    )
    def test_deliveries_replay(self, tmp_path: Path, args: list[str]) -> None:
        store = SqliteStore(tmp_path / STORE_FILE)
        store.begin_delivery(
            DeliveryRecord(delivery_id="d-dead", event="issue_comment", action="created",
                           received_at=T0, envelope="{}")
        )  # fmt: skip
        store.settle_delivery("d-dead", outcome="failed", detail="boom", at=T0)
        store.close()
        replayed = CliRunner().invoke(cli, [arg.format(data=tmp_path) for arg in args])
        assert replayed.exit_code == 0, replayed.output
        assert replayed.output == "d-dead: queued again\n"

    @pytest.mark.parametrize(
        "args",
        [
            ["runners", "revoke", "r-0000000000000001", "--data", "{data}"],
            ["runners", "revoke", "--data", "{data}", "r-0000000000000001"],
        ],
    )
    def test_runners_revoke(self, tmp_path: Path, args: list[str]) -> None:
        registry = SqliteRunnerRegistry(tmp_path / STORE_FILE)
        registry.add_runner(
            RunnerRecord(runner_id="r-0000000000000001", name="box", secret_hash="0" * 64,
                         registered_at=T0)
        )  # fmt: skip
        revoked = CliRunner().invoke(cli, [arg.format(data=tmp_path) for arg in args])
        assert revoked.exit_code == 0, revoked.output
        stored = registry.get_runner("r-0000000000000001")
        registry.close()
        assert stored is not None and stored.revoked

    @pytest.mark.parametrize(
        "args",
        [
            ["dispatches", "resend", "dp-none", "--data", "{data}"],
            ["dispatches", "resend", "--data", "{data}", "dp-none"],
            ["dispatches", "--data", "{data}", "resend", "dp-none"],
            ["queue", "retry", "t-none", "--data", "{data}"],
            ["queue", "retry", "--data", "{data}", "t-none"],
        ],
    )
    def test_a_missing_id_is_the_same_answer_in_either_order(
        self, tmp_path: Path, args: list[str]
    ) -> None:
        refused = CliRunner().invoke(cli, [arg.format(data=tmp_path) for arg in args])
        assert refused.exit_code == 1, refused.output
        assert refused.output.startswith("error: ")
        assert "none" in refused.output and "Usage" not in refused.output
        assert any(tmp_path.iterdir())  # the state opened is the one given


class TestFiltersRefuseUnknownValues:
    @pytest.mark.parametrize(
        ("args", "says"),
        [
            (["deliveries", "--outcome", "dispached"], "is none of received, dispatched"),
            (["queue", "list", "--state", "deadd"], "'deadd' is not one of"),
            (["runners", "token", "--ttl", "0s"], "would expire at once"),
        ],
    )
    def test_a_typo_is_an_error_not_an_empty_listing(
        self, tmp_path: Path, args: list[str], says: str
    ) -> None:
        result = CliRunner().invoke(cli, [*args, "--data", str(tmp_path)])
        assert result.exit_code == 2
        assert says in result.output
        assert "Traceback" not in result.output

    @pytest.mark.parametrize(
        "outcome", ["refused", "refused:unauthorized-actor", "failed", "ignored:event", "pong"]
    )
    def test_known_outcomes_are_taken(self, tmp_path: Path, outcome: str) -> None:
        result = CliRunner().invoke(
            cli, ["deliveries", "--outcome", outcome, "--data", str(tmp_path)]
        )
        assert result.exit_code == 0, result.output
