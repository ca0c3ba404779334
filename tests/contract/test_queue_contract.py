"""The Queue contract: the embedded queue and Cloud Tasks must agree on every case."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from looprelay.errors import Permanent
from looprelay.ports import MAX_TASK_BYTES, Task
from tests.queue_harness import QueueHarness


class TestEnqueue:
    def test_a_new_name_is_queued_with_its_body_unchanged(
        self, queue_harness: QueueHarness
    ) -> None:
        body = '{"delivery_id": "d-1", "text": "naïve ✓"}'.encode()
        assert queue_harness.queue.enqueue(Task(name="gh-abc123", body=body)) is True
        assert queue_harness.held() == {"gh-abc123": body}

    def test_the_same_name_twice_is_a_duplicate_and_keeps_the_first_body(
        self, queue_harness: QueueHarness
    ) -> None:
        assert queue_harness.queue.enqueue(Task(name="gh-dup", body=b"first")) is True
        assert queue_harness.queue.enqueue(Task(name="gh-dup", body=b"second")) is False
        assert queue_harness.held() == {"gh-dup": b"first"}

    def test_different_names_are_independent(self, queue_harness: QueueHarness) -> None:
        for index in range(5):
            assert queue_harness.queue.enqueue(Task(name=f"gh-{index}", body=b"{}"))
        assert sorted(queue_harness.held()) == [f"gh-{index}" for index in range(5)]

    def test_a_task_over_one_megabyte_is_refused_and_nothing_is_queued(
        self, queue_harness: QueueHarness
    ) -> None:
        with pytest.raises(Permanent, match="1000000"):
            queue_harness.queue.enqueue(Task(name="gh-big", body=b"x" * (MAX_TASK_BYTES + 1)))
        assert queue_harness.held() == {}
        assert queue_harness.queue.enqueue(Task(name="gh-big", body=b"{}")) is True

    @pytest.mark.parametrize("name", ["", "has space", "slash/name", "x" * 501, "ünï"])
    def test_an_invalid_task_name_is_refused(self, queue_harness: QueueHarness, name: str) -> None:
        with pytest.raises(Permanent, match="task name"):
            queue_harness.queue.enqueue(Task(name=name, body=b"{}"))
        assert queue_harness.held() == {}

    def test_a_task_is_due_at_once_unless_it_names_a_later_moment(
        self, queue_harness: QueueHarness
    ) -> None:
        later = datetime.now(UTC) + timedelta(seconds=90)
        assert queue_harness.queue.enqueue(Task(name="gh-now", body=b"{}"))
        assert queue_harness.queue.enqueue(Task(name="wk-later", body=b"{}", not_before=later))
        now_due = queue_harness.due("gh-now")
        assert now_due is None or now_due <= time.time()
        assert queue_harness.due("wk-later") == pytest.approx(later.timestamp(), abs=0.001)

    def test_a_moment_already_past_is_due_at_once(self, queue_harness: QueueHarness) -> None:
        """A wake queued late (the worker was slow) runs at once, not never."""
        past = datetime.now(UTC) - timedelta(seconds=5)
        assert queue_harness.queue.enqueue(Task(name="wk-past", body=b"{}", not_before=past))
        due = queue_harness.due("wk-past")
        assert due is None or due <= time.time()
