"""Fault: the embedded queue restarted with tasks in flight.

``looprelay up`` runs with a little latency on every store call (``tests.faults.boot``), so that
while a burst of routed comments drains, tasks are leased and their POSTs to ``/worker`` are
in the middle of being handled. The test SIGKILLs the process at that moment (no drain, no
answer to the queue), starts it again on the same data directory and checks that every
delivery settled exactly once, every dispatch exists exactly once and GitHub saw each effect
once. ``tests/test_up.py`` covers the simpler case of tasks that were only queued.
"""

from __future__ import annotations

import signal
from pathlib import Path

from tests.fake_github import FakeGitHub
from tests.fake_harness import wait_until
from tests.faults.deliveries import (
    Outcomes,
    Up,
    assert_exactly_once,
    send_all,
    wait_settled,
    workload,
    write_config,
)

ISSUES = 4
COMMENTS_PER_ISSUE = 12
"""4 starts + 48 comments = 52 deliveries."""
SLOW_STORE = "transient:1000000000:0:0.02"
"""No store error, 20 ms on every store call: a delivery takes ~0.2 s to handle."""


class TestQueueRestartedWithTasksInFlight:
    def test_a_kill_mid_post_settles_each_delivery_once_after_the_restart(
        self, tmp_path: Path, fake_github: FakeGitHub, running: list[Up]
    ) -> None:
        data_dir = tmp_path / "data"
        config = write_config(tmp_path / "looprelay.yaml", fake_github)
        load = workload(fake_github, issues=ISSUES, comments_per_issue=COMMENTS_PER_ISSUE)
        first = Up(data_dir, config, store_fault=SLOW_STORE)
        running.append(first)
        assert send_all(first.webhook_url, first.secret, load.starts) == [202] * ISSUES
        wait_settled(data_dir, [d.delivery_id for d in load.starts])
        assert send_all(first.webhook_url, first.secret, load.comments) == [202] * len(
            load.comments
        )

        def in_flight() -> Outcomes | None:
            outcomes = Outcomes.read(data_dir)
            leased = [t for t in outcomes.tasks if t.state == "leased"]
            begun = [r for r in outcomes.ledger if not r.settled]
            settled = len(outcomes.settled_ids()) - ISSUES
            return outcomes if leased and begun and settled >= 3 else None

        at_kill = wait_until(in_flight, seconds=60, what="tasks leased and mid-handling")
        first.stop(signal.SIGKILL)
        unsettled_at_kill = len(load.all) - len(at_kill.settled_ids())
        assert unsettled_at_kill > 0, "the kill came after the burst had drained"

        second = Up(data_dir, config)
        running.append(second)
        outcomes = wait_settled(data_dir, [d.delivery_id for d in load.all])
        assert_exactly_once(outcomes, load.all, github=fake_github)
