"""The process-wide budget for request bodies held in memory (issue 24, 3).

Every body a server reads is unverified while it arrives (its signature covers the whole of
it), so the budget caps what all of them hold together: 40 unsigned 24 MB bodies once held
about 1 GB. Big bodies draw on a share of their own, so an ordinary-size delivery still gets
in while they hold it; a body the budget cannot hold gets 503 with ``Retry-After``
(``app.asgi``).
"""

from __future__ import annotations

ORDINARY_BODY_BYTES = 1024 * 1024
"""The first this many bytes of each body come from the ordinary share of the body budget,
the rest from the big share: GitHub's payloads are far under 1 MB in practice."""
ORDINARY_BODIES_BYTES = 128 * 1024 * 1024
"""Bytes of bodies in flight, all requests together, within their first
``ORDINARY_BODY_BYTES`` (the ordinary share)."""
BIG_BODIES_BYTES = 64 * 1024 * 1024
"""Bytes of bodies in flight, all requests together, past their first
``ORDINARY_BODY_BYTES`` (the big share): what big unverified bodies may hold at once."""


class OverBudget(Exception):
    """The process' body budget cannot hold the body's next bytes now."""


class BodyBudget:
    """Bytes of request bodies held in memory across every request of one application.

    Each body's first ``ordinary_body`` bytes come from an ordinary share of
    ``ordinary_bytes``, its further bytes from a big share of ``big_bytes``, so big bodies
    (unverified while they arrive) can use up only their own share and an ordinary-size
    delivery still gets in. A body is charged as it arrives and released when its request
    ends (``Loan``). Used on the event loop's thread only.
    """

    def __init__(
        self,
        *,
        ordinary_body: int = ORDINARY_BODY_BYTES,
        ordinary_bytes: int = ORDINARY_BODIES_BYTES,
        big_bytes: int = BIG_BODIES_BYTES,
    ) -> None:
        self.ordinary_body = ordinary_body
        self._free = {"ordinary": ordinary_bytes, "big": big_bytes}

    def loan(self) -> Loan:
        """A new request's account, empty."""
        return Loan(self)

    def take(self, share: str, size: int) -> bool:
        """Take ``size`` bytes of ``share``; False (nothing taken) when it lacks them."""
        if self._free[share] < size:
            return False
        self._free[share] -= size
        return True

    def give(self, share: str, size: int) -> None:
        """Return ``size`` bytes to ``share``."""
        self._free[share] += size


class Loan:
    """What one request's body holds of a :class:`BodyBudget`."""

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self._held = {"ordinary": 0, "big": 0}

    def charge(self, size: int) -> None:
        """Hold ``size`` more bytes; raises ``OverBudget`` when the budget lacks them."""
        ordinary = min(size, max(0, self._budget.ordinary_body - self._held["ordinary"]))
        for share, part in (("ordinary", ordinary), ("big", size - ordinary)):
            if part and not self._budget.take(share, part):
                raise OverBudget
            self._held[share] += part

    def release(self) -> None:
        """Give back everything held (the request ended); again is harmless."""
        for share, size in self._held.items():
            self._budget.give(share, size)
            self._held[share] = 0
