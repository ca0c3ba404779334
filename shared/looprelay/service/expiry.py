"""Expire the dispatches no live runner serves (``core.expiry``), from the lease desk.

Runs at most once a minute per process, on a runner's poll: each run reads the oldest
``SCAN_LIMIT`` pending dispatches and the runner list, settles the unserved ones ``failed`` /
``expired`` and records a ``dispatch.expired`` event for each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from looprelay.config.model import RunnersConfig
from looprelay.core.expiry import expiry_detail, unserved
from looprelay.core.model import DispatchRecord, EventRecord
from looprelay.core.scheduling import is_live
from looprelay.ports import Clock, RunnerRegistry, Store, WorkItemStore

log = logging.getLogger("looprelay.service.lease_desk")

EXPIRED_EVENT = "dispatch.expired"
REPLAYED_EVENT = "dispatch.replayed"
SCAN_LIMIT = 500
"""Oldest pending dispatches read per run; a larger backlog drains over several runs."""
EVERY_SECONDS = 60.0


class DispatchExpiry:
    """Expires unserved dispatches, throttled to one run a minute per process."""

    def __init__(
        self,
        *,
        work_items: WorkItemStore,
        registry: RunnerRegistry,
        store: Store,
        clock: Clock,
        config: RunnersConfig,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._items, self._registry, self._store = work_items, registry, store
        self._clock, self._config, self._monotonic = clock, config, monotonic
        self._next_run = 0.0
        self._lock = threading.Lock()

    def maybe_run(self) -> list[DispatchRecord]:
        """Run unless a run started less than ``EVERY_SECONDS`` ago; return what it expired.
        Raises ``Transient`` when the stores fail (the next poll tries again)."""
        with self._lock:
            if self._monotonic() < self._next_run:
                return []
            self._next_run = self._monotonic() + EVERY_SECONDS
        return self.run()

    def run(self) -> list[DispatchRecord]:
        """Expire the unserved dispatches among the oldest pending ones; return them."""
        now = self._clock.now()
        lost_after = timedelta(seconds=self._config.lost_after_seconds)
        live = [
            r for r in self._registry.list_runners() if is_live(r, now=now, lost_after=lost_after)
        ]
        pending = self._items.list_dispatches(statuses=("pending",), limit=SCAN_LIMIT)
        after = timedelta(seconds=self._config.unserved_expiry_seconds)
        expired = []
        for dispatch in unserved(pending, live, now=now, after=after):
            record = self._items.expire_dispatch(
                dispatch.dispatch_id, now=now, detail=expiry_detail(dispatch, now=now)
            )
            if record is not None:
                self._store.append_event(_event(EXPIRED_EVENT, record, at=now))
                expired.append(record)
        if expired:
            log.warning(
                "%d dispatches expired: no live runner serves their repositories",
                len(expired),
                extra={"fields": {"repositories": sorted({d.repository for d in expired})}},
            )
        return expired


def replay_dispatch(
    work_items: WorkItemStore, store: Store, dispatch_id: str, *, now: datetime
) -> DispatchRecord | None:
    """Offer an expired dispatch again and record it; None when it is not expired."""
    record = work_items.reopen_dispatch(dispatch_id, now=now)
    if record is not None:
        store.append_event(_event(REPLAYED_EVENT, record, at=now))
    return record


def _event(name: str, dispatch: DispatchRecord, *, at: datetime) -> EventRecord:
    return EventRecord(
        name=name,
        at=at,
        delivery_id=dispatch.delivery_id,
        work_item=dispatch.work_item,
        severity="WARNING" if name == EXPIRED_EVENT else "INFO",
        data={
            "dispatch_id": dispatch.dispatch_id,
            "repository": dispatch.repository,
            "detail": dispatch.detail,
        },
    )
