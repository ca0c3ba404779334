"""Rate-limited log lines: at most a few like lines per minute, then one line counting the rest.

Anyone on the internet can send requests that are refused (an unsigned webhook, a bad token),
and a warning per refusal would let them fill the operator's disk. Scenario, with the defaults:
a scanner sends 5,000 unsigned POSTs in a minute. The first 10 are logged as usual, the other
4,990 are counted; the first refusal of the next minute logs "4990 more ... not logged" before
its own line. A lone mistake (a secret typed wrong) is always logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

LINES_PER_WINDOW = 10
"""Lines of one kind logged per window; the rest are counted."""
WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class Sample:
    """Whether to log this line, and how many like ones the window that just ended left out
    (non-zero once per window, with the first line after it: log that count too)."""

    log: bool
    left_out: int = 0


@dataclass
class _Window:
    started: float
    logged: int = 0
    left_out: int = 0


class LogSampler:
    """Decides which of many like log lines to write: the first ``limit`` of each key in every
    ``window`` seconds. Keys come from a small fixed set (an HTTP status); thread-safe."""

    def __init__(
        self,
        *,
        limit: int = LINES_PER_WINDOW,
        window: float = WINDOW_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``monotonic`` is the clock (seconds). Raises ``ValueError`` unless ``limit`` ≥ 1 and
        ``window`` > 0."""
        if limit < 1 or window <= 0:
            raise ValueError(
                f"a log sampler needs limit >= 1 and window > 0, not {limit}, {window}"
            )
        self._limit = limit
        self._window = window
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._windows: dict[Hashable, _Window] = {}

    def admit(self, key: Hashable) -> Sample:
        """Count one line of kind ``key`` and say whether to log it. Never raises."""
        now = self._monotonic()
        with self._lock:
            window = self._windows.get(key)
            left_out = 0
            if window is None or now - window.started >= self._window:
                left_out = window.left_out if window else 0
                window = self._windows[key] = _Window(now)
            if window.logged < self._limit:
                window.logged += 1
                return Sample(True, left_out)
            window.left_out += 1
            return Sample(False)

    def warning(
        self,
        logger: logging.Logger,
        key: Hashable,
        message: str,
        *args: object,
        kind: str,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        """Log ``message % args`` as a warning if the sample of ``key`` takes it, after a line
        counting the ones the window before left out; ``kind`` names them in that line (for
        example "webhook rejections with status 401"). Never raises."""
        sample = self.admit(key)
        if sample.left_out:
            logger.warning(
                "%d more %s were not logged (at most %d every %g s are)",
                sample.left_out,
                kind,
                self._limit,
                self._window,
                extra={"fields": {"not_logged": sample.left_out}},
            )
        if sample.log:
            logger.warning(message, *args, extra=extra)
