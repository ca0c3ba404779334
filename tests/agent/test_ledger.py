"""The local ledger: at most once across restarts and crashes, and the local session table."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from looprelay.agent.apply import ApplyResult
from looprelay.agent.ledger import APPLYING, RECORDED, Ledger, LedgerEntry, LocalSession
from tests.agent.conftest import SESSION, Rig, make_dispatch
from tests.fake_harness import FakeHarness

_CRASH_AFTER_CLAIM = """
import os, sys
from pathlib import Path
from looprelay.agent.ledger import Ledger
Ledger(Path(sys.argv[1])).claim(sys.argv[2])
os._exit(9)  # dies between the claim and the result, like a power cut mid-paste
"""


def _session(name: str, work_item: str = "github:octo/repo#15") -> LocalSession:
    return LocalSession(
        session_name=name,
        work_item=work_item,
        endpoint=work_item,
        session_id="0b9d6f4e-3a53-4d7c-9a55-2f0f6f4b1c11",
        checkout="/work/octo",
        created_checkout=False,
        harness="claude",
        runner_kind="tmux",
    )


class TestClaims:
    def test_the_first_claim_wins_and_later_ones_see_the_entry(self, tmp_path: Path) -> None:
        ledger = Ledger(tmp_path / "ledger.db")
        assert ledger.claim("d1") is None
        assert ledger.claim("d1") == LedgerEntry("d1", APPLYING, None)
        ledger.record_result("d1", {"status": "delivered", "retryable": False})
        assert ledger.claim("d1") == LedgerEntry(
            "d1", RECORDED, {"status": "delivered", "retryable": False}
        )

    def test_claims_and_results_survive_a_restart(self, tmp_path: Path) -> None:
        path = tmp_path / "state" / "ledger.db"
        first = Ledger(path)
        first.claim("d1")
        first.record_result("d1", ApplyResult("spawned", session_id="s").to_record())
        first.close()
        entry = Ledger(path).claim("d1")
        assert entry is not None and entry.result is not None
        assert ApplyResult.from_record(entry.result) == ApplyResult("spawned", session_id="s")

    def test_the_file_is_durable_wal(self, tmp_path: Path) -> None:
        Ledger(tmp_path / "ledger.db").claim("d1")
        with sqlite3.connect(tmp_path / "ledger.db") as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


class TestCrash:
    def test_a_crash_between_apply_and_record_is_reported_not_applied_again(
        self, rig: Rig, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        dispatch = make_dispatch(kind="deliver", prompt="paste me at most once")
        path = tmp_path / "state" / "ledger.db"
        crashed = subprocess.run(
            [sys.executable, "-c", _CRASH_AFTER_CLAIM, str(path), dispatch.dispatch_id],
            check=False,
        )
        assert crashed.returncode == 9
        result = rig.applier.apply(dispatch)
        assert (result.status, result.reason, result.retryable) == ("failed", "interrupted", False)
        assert rig.applier.apply(dispatch) == result  # and it stays reported
        assert fake_harness.starts() == []
        assert rig.terminal.pane_dead(SESSION) is None


class TestSessions:
    def test_remember_find_and_forget(self, tmp_path: Path) -> None:
        ledger = Ledger(tmp_path / "ledger.db")
        own, pr = _session("loop-a-15"), _session("loop-a-16")
        other = _session("loop-b-1", work_item="github:octo/other#1")
        for session in (pr, own, other):
            ledger.remember(session)
        assert ledger.session("loop-a-15") == own
        assert ledger.sessions_for("github:octo/repo#15") == [own, pr]
        assert ledger.session_count() == 3
        ledger.forget("loop-a-15")
        ledger.forget("loop-a-15")
        assert ledger.session("loop-a-15") is None
        assert ledger.all_sessions() == [pr, other]

    def test_remembering_again_replaces(self, tmp_path: Path) -> None:
        ledger = Ledger(tmp_path / "ledger.db")
        ledger.remember(_session("loop-a-15"))
        moved = replace(_session("loop-a-15"), session_id="other")
        ledger.remember(moved)
        assert ledger.all_sessions() == [moved]
