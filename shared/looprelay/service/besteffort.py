"""GitHub side effects as decoration: a failure is logged and recorded, never raised."""

from __future__ import annotations

import logging
from collections.abc import Callable

from looprelay.core.model import EventRecord
from looprelay.errors import Permanent, Transient
from looprelay.ports import Clock, Store

log = logging.getLogger("looprelay.github")


def best_effort(
    call: Callable[[], object],
    *,
    store: Store,
    clock: Clock,
    delivery_id: str | None,
    work_item: str | None,
    context: dict[str, object] | None = None,
) -> None:
    """Run one GitHub call; on ``Transient``/``Permanent`` record ``github.failed`` (with
    ``context``, e.g. the dispatch id) instead."""
    try:
        call()
    except (Transient, Permanent) as exc:
        log.warning("GitHub side effect failed: %s", exc, extra={"delivery_id": delivery_id})
        store.append_event(
            EventRecord(
                name="github.failed",
                at=clock.now(),
                delivery_id=delivery_id,
                work_item=work_item,
                severity="WARNING",
                data={**(context or {}), "error": str(exc)[:500]},
            )
        )
