"""The load burst of ``bench/load.py`` at a CI size: nothing lost, nothing applied twice.

The same driver (``bench/loadrun.py``) runs ``looprelay up`` and one runner agent with the fake
harness, sends the burst and checks the ledger, the dispatches and what the fake harness got.
``LOOPRELAY_LOAD_FULL=1`` runs the full 10,000 deliveries across 200 work items instead. No
timing is asserted; the figures go to the test's output.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from loadrun import format_report, run_load  # noqa: E402

FULL = os.environ.get("LOOPRELAY_LOAD_FULL") == "1"
CI_SIZE = (200, 10)
"""Deliveries and work items in CI. The runner holds one poll thread per session (``--capacity``
is both), so the lease desk's work grows with the work items; this size stays under a minute."""
FULL_SIZE = (10_000, 200)

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


@pytest.mark.timeout(3600 if FULL else 300)
def test_a_burst_is_applied_once_each_with_nothing_lost(tmp_path: Path) -> None:
    deliveries, work_items = FULL_SIZE if FULL else CI_SIZE
    report = run_load(
        tmp_path,
        deliveries=deliveries,
        work_items=work_items,
        senders=8,
        max_seconds=3000 if FULL else 240,
    )
    print(format_report(report))
    assert report.failures == []
    assert report.checks["settled"] == deliveries
    assert report.checks["spawn_dispatches"] == work_items
    assert report.checks["harness_spawns"] == work_items
    assert report.checks["deliver_dispatches"] == deliveries - work_items
    assert report.checks["tokens_missing"] == report.checks["tokens_doubled"] == 0
