"""Fault: the worker process is killed at a random point while it handles a delivery.

``looprelay up`` runs through ``tests.faults.boot``, which exits the process (``os._exit(137)``,
as abrupt as SIGKILL) the ``k``-th time the worker reaches one point: before the ledger's first
write, right after the work item and its dispatch were committed, before the outcome is
written, or after it was written but before the queue got its answer. ``k`` is drawn from a
seeded generator (the seed is printed; ``LOOPRELAY_FAULT_SEED`` replays it). The test then
starts ``looprelay up`` again on the same data directory, without the fault, re-sends what the
dead process never acknowledged (GitHub's redelivery), and checks that every delivery settled
exactly once, every dispatch exists exactly once, and GitHub saw each effect once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import requests

from tests.fake_github import FakeGitHub
from tests.fake_harness import wait_until
from tests.faults.boot import KILL_POINTS, KILLED_EXIT
from tests.faults.deliveries import (
    Delivery,
    Outcomes,
    Up,
    assert_exactly_once,
    seeded_random,
    send,
    wait_settled,
    workload,
    write_config,
)

ISSUES = 3
COMMENTS_PER_ISSUE = 9
"""3 starts + 27 comments = 30 deliveries per kill point."""


def _send_until_dead(up: Up, items: Sequence[Delivery]) -> list[Delivery]:
    """Send ``items`` one by one; return those the process did not acknowledge (it died)."""
    unsent: list[Delivery] = []
    for item in items:
        try:
            status = send(up.webhook_url, up.secret, item)
        except requests.ConnectionError:
            status = 0
        assert status in (0, 202), f"webhook answered {status}"
        if status != 202:
            unsent.append(item)
    return unsent


def _wave(up: Up, items: Sequence[Delivery], data_dir: Path, config: Path) -> Up:
    """Send one wave; if the fault kills the process, restart it clean and redeliver.

    Returns the process serving afterwards, with the whole wave settled.
    """
    unsent = _send_until_dead(up, items)
    ids = [d.delivery_id for d in items]

    def settled_or_dead() -> bool:
        return up.proc.poll() is not None or set(ids) <= Outcomes.read(data_dir).settled_ids()

    wait_until(settled_or_dead, seconds=60, what="the wave to settle or the worker to die")
    if up.proc.poll() is None:
        assert unsent == []
        return up
    assert up.wait_exit() == KILLED_EXIT
    assert "FAULT: killed at" in up.log()
    restarted = Up(data_dir, config)
    assert _send_until_dead(restarted, unsent) == []
    wait_settled(data_dir, ids)
    return restarted


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


class TestWorkerKilledMidDelivery:
    @pytest.mark.parametrize("point", KILL_POINTS)
    def test_every_delivery_settles_once_and_every_effect_happens_once(
        self,
        point: str,
        tmp_path: Path,
        data_dir: Path,
        fake_github: FakeGitHub,
        running: list[Up],
    ) -> None:
        load = workload(fake_github, issues=ISSUES, comments_per_issue=COMMENTS_PER_ISSUE)
        occurrence = seeded_random(f"kill {point}").randint(1, len(load.all))
        print(f"killing at {point}:{occurrence}")
        config = write_config(tmp_path / "looprelay.yaml", fake_github)
        up = Up(data_dir, config, fault=f"{point}:{occurrence}")
        running.append(up)
        after_starts = _wave(up, load.starts, data_dir, config)
        running.append(after_starts)
        final = _wave(after_starts, load.comments, data_dir, config)
        running.append(final)
        # The last occurrence may settle before the kill lands: the wave looks done at once.
        wait_until(
            lambda: any(u.proc.poll() == KILLED_EXIT for u in running),
            seconds=10,
            what="the fault to fire",
        )

        outcomes = wait_settled(data_dir, [d.delivery_id for d in load.all])
        assert_exactly_once(outcomes, load.all, github=fake_github)
