"""The redelivery sweeper: ask GitHub again for the deliveries that never reached us.

GitHub never retries a failed webhook delivery by itself (docs: "Handling failed webhook
deliveries"). A scheduled run lists the App's attempts of the past 3 days, keeps the guids no
attempt of which succeeded and the ledger does not hold (``core.sweep``), and asks GitHub to
redeliver the newest attempt of each, a bounded number per run. A redelivery that arrives twice
is harmless: ingress names the task after the delivery and the ledger settles it once.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from looprelay.app.messages import Request, Response, json_response
from looprelay.core.model import EventRecord
from looprelay.core.sweep import REDELIVERY_WINDOW, deliveries_to_redeliver, failed_deliveries
from looprelay.errors import Permanent, Transient
from looprelay.ports import AppDelivery, Clock, GitHub, Store

log = logging.getLogger("looprelay.service.sweeper")

REDELIVERED_EVENT = "sweep.redelivered"
DEFAULT_LIMIT = 50
"""Redeliveries per run: a flood of failures drains over a few runs instead of one burst."""
MAX_PAGES = 10
"""Pages of 100 attempts read per run; past the newest 1,000 attempts a failure is missed."""


@dataclass(frozen=True)
class SweepReport:
    """What one sweep found and did."""

    listed: int
    failed: int
    in_ledger: int
    redelivered: int
    errors: int
    picked: tuple[tuple[AppDelivery, str], ...] = ()
    """Each attempt picked for redelivery, newest first, and what became of it: one of
    ``PICKED_OUTCOMES``."""

    def counts(self) -> dict[str, int]:
        """The counts alone, for logs and JSON answers."""
        return {key: value for key, value in asdict(self).items() if key != "picked"}


PICKED_OUTCOMES = ("redelivered", "refused", "failed", "not asked")
"""``refused``: GitHub answered a 4xx; ``failed``: try again later (the run stops there);
``not asked``: after a failure, or in a dry run."""


def sweep(
    github: GitHub,
    store: Store,
    clock: Clock,
    *,
    window_days: int = REDELIVERY_WINDOW.days,
    limit: int = DEFAULT_LIMIT,
    max_pages: int = MAX_PAGES,
    dry_run: bool = False,
) -> SweepReport:
    """Redeliver the App's failed deliveries of the last ``window_days`` the ledger lacks.

    At most ``limit`` per run, newest first, each recorded as a ``sweep.redelivered`` event.
    A ``Permanent`` answer to one redelivery is counted and the next is tried; a ``Transient``
    one is counted and ends the run (the rest wait for the next run). ``dry_run`` picks but asks
    for nothing. Raises ``Transient``/``Permanent`` when the deliveries cannot be listed and
    ``Transient`` when the store cannot be read.
    """
    now, window = clock.now(), timedelta(days=window_days)
    listed = github.list_app_deliveries(since=now - window, max_pages=max_pages)
    failed = failed_deliveries(listed, now=now, window=window)
    held = {d.guid for d in failed if store.get_delivery(d.guid) is not None}
    chosen = deliveries_to_redeliver(
        listed, settled_guids=held, now=now, window=window, limit=limit
    )
    outcomes = ["not asked"] * len(chosen) if dry_run else _redeliver(github, store, chosen, now)
    return SweepReport(
        listed=len(listed),
        failed=len(failed),
        in_ledger=len(held),
        redelivered=outcomes.count("redelivered"),
        errors=outcomes.count("refused") + outcomes.count("failed"),
        picked=tuple(zip(chosen, outcomes, strict=True)),
    )


def _redeliver(github: GitHub, store: Store, chosen: list[AppDelivery], now: datetime) -> list[str]:
    """Ask for each of ``chosen`` in turn; return their outcomes (see ``PICKED_OUTCOMES``)."""
    outcomes = ["not asked"] * len(chosen)
    for index, delivery in enumerate(chosen):
        try:
            github.redeliver(delivery_id=delivery.id)
        except Permanent as exc:
            outcomes[index] = "refused"
            log.warning("redelivery refused: %s", exc, extra={"delivery_id": delivery.guid})
            continue
        except Transient as exc:
            # GitHub is unwell or rate-limiting: asking for the rest now would only fail too.
            outcomes[index] = "failed"
            log.warning("redelivery failed; the rest wait for the next run: %s", exc)
            break
        store.append_event(_redelivered(delivery, at=now))
        outcomes[index] = "redelivered"
    return outcomes


class SweepHandler:
    """The sweeper function's handler: one sweep per POST, its counts as JSON.

    Who may call it is Cloud Functions' IAM (only Cloud Scheduler's identity is an invoker);
    a sweep is bounded and idempotent, so a stray call costs API quota, never a wrong effect.
    """

    def __init__(
        self, *, github: GitHub, store: Store, clock: Clock, limit: int = DEFAULT_LIMIT
    ) -> None:
        self._github, self._store, self._clock, self._limit = github, store, clock, limit

    def handle(self, request: Request) -> Response:
        """Sweep once; 200 with the counts, 503 when GitHub or the store should be retried,
        500 for what retrying cannot fix (the log names it). Never raises."""
        if request.method != "POST":
            return json_response(405, {"error": "only POST is accepted here"})
        try:
            report = sweep(self._github, self._store, self._clock, limit=self._limit)
        except Transient as exc:
            log.warning("sweep failed, the scheduler will run it again: %s", exc)
            return json_response(503, {"error": "transient failure; retry"})
        except Permanent as exc:
            log.error("sweep failed: %s", exc)
            return json_response(500, {"error": str(exc)})
        log.info("sweep done", extra={"fields": report.counts()})
        return json_response(200, report.counts())


def _redelivered(delivery: AppDelivery, *, at: datetime) -> EventRecord:
    return EventRecord(
        name=REDELIVERED_EVENT,
        at=at,
        delivery_id=delivery.guid,
        data={
            "attempt": delivery.id,
            "event": delivery.event,
            "status_code": delivery.status_code,
            "delivered_at": delivery.delivered_at.isoformat(),
        },
    )
