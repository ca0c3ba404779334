"""Retry waits follow Cloud Tasks' documented curve."""

from __future__ import annotations

import pytest

from looprelay.core.backoff import backoff_seconds


class TestBackoffSeconds:
    def test_follows_the_cloud_tasks_reference_example(self) -> None:
        # RetryConfig reference: min 10 s, max 300 s, 3 doublings.
        waits = [
            backoff_seconds(n, min_backoff=10, max_backoff=300, max_doublings=3)
            for n in range(1, 9)
        ]
        assert waits == [10, 20, 40, 80, 160, 240, 300, 300]

    def test_zero_doublings_grows_linearly(self) -> None:
        waits = [
            backoff_seconds(n, min_backoff=1, max_backoff=100, max_doublings=0) for n in range(1, 5)
        ]
        assert waits == [1, 2, 3, 4]

    def test_never_exceeds_the_maximum(self) -> None:
        assert backoff_seconds(1000, min_backoff=1, max_backoff=5, max_doublings=16) == 5

    def test_rejects_retry_numbers_below_one(self) -> None:
        with pytest.raises(ValueError, match="start at 1"):
            backoff_seconds(0, min_backoff=1, max_backoff=5, max_doublings=1)
