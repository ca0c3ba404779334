"""A time budget shared by the outbound calls one piece of work makes.

The queue waits a dispatch deadline (60 s by default) for the worker's answer; past it, it
counts the attempt failed and sends another while the first may still be running. So the
worker gives the delivery's handler a budget under that deadline (``within``), and an adapter
making a call asks ``seconds_left`` to size its timeout, and gives up with ``Transient`` rather
than start a call or a retry wait the budget cannot hold: the queue then retries the task.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_deadline: ContextVar[float | None] = ContextVar("looprelay_deadline", default=None)


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Run the block with ``seconds`` from now as the budget of the calls made in it (an
    enclosing, tighter budget still holds)."""
    deadline = time.monotonic() + seconds
    outer = _deadline.get()
    token = _deadline.set(deadline if outer is None else min(outer, deadline))
    try:
        yield
    finally:
        _deadline.reset(token)


def seconds_left() -> float | None:
    """Seconds left of the current budget (0 or less: spent); None outside any budget."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()
