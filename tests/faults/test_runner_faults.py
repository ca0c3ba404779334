"""Runner faults, N deliveries each, on real processes: `looprelay up`, `looprelay runner run`
agents with the fake `claude` first on PATH, tmux on a private socket.

- An agent SIGKILLed at random moments (seeded; the seed is printed) while it holds leases, and
  restarted with the same credentials and ledger, again and again.
- An agent that dies between applying a dispatch and reporting it (``agent_boot`` makes its k-th
  report ``os._exit(137)``), restarted each time.
- Two agents competing for the same dispatches.
- An agent killed in the middle of a paste: the dispatch ends ``interrupted``, is listed by
  ``looprelay dispatches`` with the command that sends it again, and that command does.

Each ends with what a user would notice: every delivery settled once; every dispatch settled;
every comment's text reached a harness at most once, exactly once when its dispatch succeeded,
in each work item's seq order; one harness per work item, on the runner that spawned it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from looprelay.core.model import DispatchRecord
from tests.fake_harness import FakeHarness, wait_until
from tests.faults.deliveries import seeded_random
from tests.faults.runners import (
    DEADLINE,
    Runner,
    Stack,
    assert_applied_once_in_order,
    comment_plan,
    commented,
    dispatch_token,
    kill_tmux,
    register_runner,
    sightings,
    socket_name,
    start_stack,
    start_work_items,
    token,
)
from tests.test_up import cli

__all__ = ["socket_name"]  # the fixture, imported for pytest

CONFIG = """\
routing:
  authorizedUsers: [codertocat]
runners:
  leaseSeconds: 10
  pollWaitSeconds: 1
  heartbeatSeconds: 5
"""


@pytest.fixture
def stack(tmp_path: Path, fake_harness: FakeHarness) -> Iterator[Stack]:
    started = start_stack(tmp_path, CONFIG)
    yield started
    started.close()
    started.up.stop(signal.SIGKILL)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    return seeded_random(request.node.nodeid)


@pytest.fixture
def runners() -> Iterator[list[Runner]]:
    """Runners a test starts; every agent still running is SIGKILLed at teardown, and the
    tmux server of each runner's socket is killed."""
    started: list[Runner] = []
    yield started
    for runner in started:
        runner.kill()
        kill_tmux(runner.socket_name)
        # Shown only when the test failed (captured output): what each agent process said.
        if runner.log_path.exists():
            tail = runner.log_path.read_text(errors="replace").splitlines()[-60:]
            print(f"--- the last lines of {runner.log_path.name}", *tail, sep="\n")


def _send_comments(stack: Stack, plan: list[tuple[int, int]], rng: random.Random) -> list[str]:
    """Send the planned comments, a few at a time with short pauses (the seed decides)."""
    sent = []
    for number, index in plan:
        body = f"Comment {index} on #{number}: {token(number, index)}\nplease look"
        sent.append(
            stack.send("issue_comment", commented(number, body, comment_id=number * 1000 + index))
        )
        if rng.random() < 0.3:
            threading.Event().wait(rng.uniform(0.05, 0.4))
    return sent


def _assert_every_delivery_settled_once(stack: Stack, ids: list[str]) -> None:
    records = stack.wait_settled(ids)
    assert {r.outcome for r in records} <= {"dispatched", "ignored"}, Counter(
        r.outcome for r in records
    )
    counts = stack.settled_counts()
    assert {d: counts[d] for d in ids} == dict.fromkeys(ids, 1)


def _assert_one_harness_each(fake: FakeHarness, numbers: list[int]) -> None:
    """Every work item of ``numbers`` got exactly one harness process, and no other did."""
    found: dict[int, set[int]] = {}
    for seen in sightings(fake):
        found.setdefault(seen.number, set()).add(seen.pid)
    assert {n: len(pids) for n, pids in found.items()} == dict.fromkeys(numbers, 1), found


def _assert_ledger_agrees(runner: Runner, dispatches: list[DispatchRecord]) -> None:
    """The agent's ledger holds each dispatch it applied with the result the server counted."""
    ledger = runner.ledger()
    for dispatch in dispatches:
        if dispatch.lease_holder != runner.runner_id:
            continue
        state, result = ledger[dispatch.dispatch_id]
        assert state == "recorded", dispatch.dispatch_id
        assert result is not None
        expected = dispatch.result if dispatch.status == "succeeded" else "failed"
        assert result["status"] == expected, (dispatch.dispatch_id, result, dispatch.result)


class TestAgentKilledHoldingLeases:
    def test_random_sigkills_leave_every_comment_applied_at_most_once_and_in_order(
        self,
        stack: Stack,
        tmp_path: Path,
        fake_harness: FakeHarness,
        socket_name: str,
        runners: list[Runner],
        rng: random.Random,
    ) -> None:
        numbers, comments, kills = [1, 2, 3, 4, 5], 30, 4
        box = register_runner(stack, tmp_path, "box", socket_name=socket_name, capacity=2)
        runners.append(box)
        box.start()
        starts = start_work_items(stack, numbers)
        plan = comment_plan(numbers, comments, rng)
        sent: list[str] = []
        sender = threading.Thread(target=lambda: sent.extend(_send_comments(stack, plan, rng)))
        sender.start()
        for _ in range(kills):
            threading.Event().wait(rng.uniform(0.3, 2.5))
            box.kill()
            box.start()
        sender.join()

        _assert_every_delivery_settled_once(stack, [*starts.values(), *sent])
        dispatches = stack.wait_dispatches_settled(len(numbers) + comments)
        assert len(dispatches) == len(numbers) + comments
        summary = assert_applied_once_in_order(dispatches, fake_harness)
        print(f"killed {kills} times; {summary}")
        _assert_one_harness_each(fake_harness, numbers)
        _assert_ledger_agrees(box, dispatches)


class TestAgentKilledBetweenApplyAndReport:
    def test_a_result_lost_on_the_way_is_reported_from_the_ledger_not_applied_again(
        self,
        stack: Stack,
        tmp_path: Path,
        fake_harness: FakeHarness,
        socket_name: str,
        runners: list[Runner],
        rng: random.Random,
    ) -> None:
        # One worker: when the agent dies at its k-th report, nothing else is in hand, so each
        # crash lands exactly between a recorded apply and its report.
        numbers, comments, crashes = [1, 2, 3, 4], 20, 3
        box = register_runner(stack, tmp_path, "box", socket_name=socket_name, capacity=1)
        runners.append(box)
        box.start(exit_on_report=rng.randint(2, 5))
        starts = start_work_items(stack, numbers)
        sent = _send_comments(stack, comment_plan(numbers, comments, rng), rng)
        for crash in range(crashes):
            assert box.proc is not None
            wait_until(
                lambda: not box.alive(), seconds=DEADLINE, what=f"crash {crash + 1} of the agent"
            )
            assert box.proc.returncode == 137, box.output()
            box.start(exit_on_report=rng.randint(2, 5) if crash + 1 < crashes else None)

        _assert_every_delivery_settled_once(stack, [*starts.values(), *sent])
        dispatches = stack.wait_dispatches_settled(len(numbers) + comments)
        assert [d for d in dispatches if d.status != "succeeded"] == []
        assert_applied_once_in_order(dispatches, fake_harness)
        reported_late = [d.dispatch_id for d in dispatches if d.attempts > 1]
        assert len(reported_late) == crashes, reported_late
        _assert_one_harness_each(fake_harness, numbers)
        _assert_ledger_agrees(box, dispatches)


class TestTwoRunnersCompete:
    def test_each_dispatch_is_applied_by_one_runner_and_sessions_stay_where_they_spawned(
        self,
        stack: Stack,
        tmp_path: Path,
        fake_harness: FakeHarness,
        socket_name: str,
        runners: list[Runner],
        rng: random.Random,
    ) -> None:
        numbers, comments = [1, 2, 3, 4, 5, 6], 30
        pair = [
            register_runner(
                stack, tmp_path, name, socket_name=f"{socket_name}-{name}", labels=("pool=a",)
            )
            for name in ("left", "right")
        ]
        runners.extend(pair)
        for runner in pair:
            runner.start()
        # The comments follow the starts at once: many are routed while their session is still
        # pending, so no runner is named on them until the spawn is reported.
        starts = start_work_items(stack, numbers)
        sent = _send_comments(stack, comment_plan(numbers, comments, rng), rng)

        _assert_every_delivery_settled_once(stack, [*starts.values(), *sent])
        dispatches = stack.wait_dispatches_settled(len(numbers) + comments)
        assert_applied_once_in_order(dispatches, fake_harness)
        by_id = {r.runner_id: r for r in pair}
        ledgers = {r.runner_id: set(r.ledger()) for r in pair}
        for dispatch in dispatches:
            holders = [rid for rid, seen in ledgers.items() if dispatch.dispatch_id in seen]
            assert holders == [dispatch.lease_holder], (dispatch.dispatch_id, holders)
        spawner = {dispatch_token(d)[0]: d.lease_holder for d in dispatches if d.kind == "spawn"}
        for dispatch in dispatches:
            number = dispatch_token(dispatch)[0]
            assert dispatch.lease_holder == spawner[number], (
                f"{dispatch.dispatch_id} (#{number}, seq {dispatch.seq}) applied on "
                f"{dispatch.lease_holder}, its session is on {spawner[number]}"
            )
        for seen in sightings(fake_harness):
            holder = spawner[seen.number]
            assert holder is not None
            # Its own worktree of the holder's checkout, made under the holder's state.
            assert Path(seen.cwd).parent == by_id[holder].state / "worktrees", seen.cwd
        _assert_one_harness_each(fake_harness, numbers)
        print(f"spawns per runner: {Counter(spawner.values())}")


class TestInterruptedPaste:
    def test_an_interrupted_dispatch_is_listed_with_its_command_and_sent_again_on_request(
        self,
        stack: Stack,
        tmp_path: Path,
        fake_harness: FakeHarness,
        socket_name: str,
        runners: list[Runner],
    ) -> None:
        box = register_runner(stack, tmp_path, "box", socket_name=socket_name, capacity=1)
        runners.append(box)
        box.start()
        start_work_items(stack, [1])
        stack.wait_dispatches_settled(1)
        first = int(wait_until(fake_harness.starts, seconds=DEADLINE)[0]["pid"])
        os.kill(first, signal.SIGKILL)  # the harness died: the next comment respawns it

        text = f"Comment 1 on #1: {token(1, 1)}"
        stack.wait_settled([stack.send("issue_comment", commented(1, text, comment_id=1001))])
        # The respawn is held for the resume probe after the harness started: the agent dies
        # after the side effect and before its ledger has a result.
        second = wait_until(lambda: fake_harness.starts()[1:], seconds=DEADLINE)[0]
        box.kill()
        [interrupted] = [d for d in stack.dispatches() if d.seq == 2]
        assert box.ledger()[interrupted.dispatch_id][0] == "applying", "the apply had ended"

        box.start()  # at once: its leases are released, it reports the half-done apply
        stack.wait_dispatches_settled(2)
        failed = stack.items.get_dispatch(interrupted.dispatch_id)
        assert failed is not None and (failed.status, failed.result) == ("failed", "interrupted")
        data = ("--data", str(stack.data_dir))
        listed = cli("dispatches", *data, "--json")
        assert listed.returncode == 0, listed.stderr
        [row] = [json.loads(line) for line in listed.stdout.splitlines()]
        command = f"looprelay dispatches resend {failed.dispatch_id} --data {stack.data_dir}"
        assert (row["dispatch_id"], row["resend"]) == (failed.dispatch_id, command)
        assert len(fake_harness.starts()) == 2  # nothing was sent again on its own

        sent = cli(*command.split()[1:])
        assert sent.returncode == 0, sent.stderr
        dispatches = stack.wait_dispatches_settled(3)
        [again] = [d for d in dispatches if d.seq == 3]
        assert (again.status, again.result, again.lease_holder) == (
            "succeeded",
            "delivered",
            box.runner_id,
        )
        # The respawned harness lived on: the agent died before pasting its boot prompt (never
        # in argv), and the operator's resend pasted the comment into it.
        assert token(1, 1) not in " ".join(second["argv"])
        wait_until(
            lambda: token(1, 1) in fake_harness.received(int(second["pid"])), seconds=DEADLINE
        )
        assert len(fake_harness.starts()) == 2
        after = [
            json.loads(line) for line in cli("dispatches", *data, "--json").stdout.splitlines()
        ]
        assert after == []  # sent again: nothing left for the operator
