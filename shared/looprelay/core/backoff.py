"""Retry waits, shaped like Cloud Tasks' RetryConfig.

The wait starts at ``min``, doubles ``max_doublings`` times, then grows linearly by the last
doubled step, and never exceeds ``max`` (Cloud Tasks RetryConfig reference: with min 10 s,
max 300 s and 3 doublings the waits are 10, 20, 40, 80, 160, 240, 300, 300 ...).
"""

from __future__ import annotations


def backoff_seconds(
    retry: int, *, min_backoff: float, max_backoff: float, max_doublings: int
) -> float:
    """Return how long to wait before retry number ``retry`` (1 = the first retry).

    Raises ``ValueError`` for a retry number below 1.
    """
    if retry < 1:
        raise ValueError(f"retry numbers start at 1, got {retry}")
    if retry - 1 <= max_doublings:
        wait = min_backoff * float(2 ** (retry - 1))
    else:
        wait = min_backoff * float(2**max_doublings * (retry - max_doublings))
    return min(wait, max_backoff)
