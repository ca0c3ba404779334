"""What a runner learns on a heartbeat after time away (``/runner/v1/heartbeat``).

Scenario: an agent is SIGKILLed holding leases and restarted at once. Its first heartbeat says
``restarted``: the leases its runner holds belong to the dead process, so they are offered
again now (``lease.released``), not after ``leaseSeconds``; the new process leases them again
and its ledger reports what the dead one had done, never applying anything twice. Every
heartbeat names the sessions the agent hosts; those the server has since respawned on another
runner are answered as ``moved``, the agent stops their harnesses and says so on its next
heartbeat (``session.released``).
"""

from __future__ import annotations

import logging

from looprelay.core.failover import Held, moved_away
from looprelay.core.model import DispatchRecord, EventRecord, RunnerRecord
from looprelay.ports import Clock, Store, WorkItemStore
from looprelay.service.waker import DispatchWaker
from looprelay.wire.runner_api import HeldSession, MovedSession, ReleasedSession

log = logging.getLogger("looprelay.service.failover")

MAX_RELEASED_LEASES = 500
"""Leased dispatches looked through for a restarted runner's own; far above any capacity."""
_RELEASED = "runner-restarted"


class Failover:
    """Releases a restarted runner's leases and tells a runner which sessions moved away."""

    def __init__(
        self, *, work_items: WorkItemStore, store: Store, clock: Clock, waker: DispatchWaker | None
    ) -> None:
        self._items = work_items
        self._store = store
        self._clock = clock
        self._waker = waker

    def release_leases(self, runner: RunnerRecord) -> int:
        """Offer again every dispatch ``runner`` holds a lease on; how many there were.

        Expects that the runner's agent process just started, so none of them is in hand.
        Raises ``Transient`` when the store fails (the agent retries its heartbeat).
        """
        now = self._clock.now()
        held = [
            d
            for d in self._items.list_dispatches(statuses=("leased",), limit=MAX_RELEASED_LEASES)
            if d.lease_holder == runner.runner_id
        ]
        released: list[DispatchRecord] = []
        for dispatch in held:
            # Back to pending without a result: the restarted agent's ledger will say what
            # became of it when it leases it again.
            if self._items.finish_dispatch(
                dispatch.dispatch_id,
                runner_id=runner.runner_id,
                status="pending",
                result=_RELEASED,
                now=now,
                detail="the runner's agent restarted while holding it; offered again",
            ):
                released.append(dispatch)
                self._event(
                    "lease.released",
                    runner,
                    {"dispatch_id": dispatch.dispatch_id, "reason": _RELEASED},
                    delivery_id=dispatch.delivery_id,
                    work_item=dispatch.work_item,
                )
        if released and self._waker is not None:
            self._waker.notify(released)
        return len(released)

    def moved(self, runner: RunnerRecord, held: list[HeldSession]) -> list[MovedSession]:
        """Return the sessions of ``held`` that now live on another runner.

        Raises ``Transient`` when the store fails.
        """
        if not held:
            return []
        items = self._items.get_work_items({h.work_item for h in held})
        sessions = [Held(h.work_item, h.endpoint, h.session_name) for h in held]
        return [
            MovedSession(
                work_item=m.held.work_item,
                endpoint=m.held.endpoint,
                session_name=m.held.session_name,
                runner_id=m.runner_id,
            )
            for m in moved_away(sessions, items, runner_id=runner.runner_id)
        ]

    def note_released(self, runner: RunnerRecord, released: list[ReleasedSession]) -> None:
        """Log each session ``runner`` stopped because it moved away (``session.released``)."""
        for session in released:
            log.info(
                "runner %s stopped its copy of %s (moved away): %s",
                runner.name,
                session.endpoint,
                session.outcome,
                extra={"runner_id": runner.runner_id},
            )
            self._event(
                "session.released",
                runner,
                {
                    "endpoint": session.endpoint,
                    "session_name": session.session_name,
                    "outcome": session.outcome,
                },
                work_item=session.work_item,
            )

    def _event(
        self,
        name: str,
        runner: RunnerRecord,
        data: dict[str, object],
        *,
        work_item: str | None = None,
        delivery_id: str | None = None,
    ) -> None:
        self._store.append_event(
            EventRecord(
                name=name,
                at=self._clock.now(),
                delivery_id=delivery_id,
                work_item=work_item,
                data={"runner_id": runner.runner_id, **data},
            )
        )
