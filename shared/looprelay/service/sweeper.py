"""The redelivery sweeper: ask GitHub again for the deliveries that never reached us.

GitHub never retries a failed webhook delivery by itself (docs: "Handling failed webhook
deliveries"). A scheduled run lists the App's attempts back to where the previous run left off
(its resume point, kept in the event log: ``sweep.completed`` at the end of a run, and on each
``sweep.redelivered`` as the run goes, so a run the platform cuts off still moves it), keeps the
guids no attempt of which succeeded and the ledger does not hold (``core.sweep``), and asks
GitHub to redeliver the newest attempt of each, oldest first, a configurable number per run. A
run stops when its page, time or redelivery budget is spent or GitHub says its rate limit is
reached; the resume point then stays at or before every failure it did not ask for, so the
next run picks them up. A redelivery that arrives twice is harmless: the ledger settles a
delivery once. The time budget (``sweeper.maxRunSeconds``) also bounds every call made in the
run (``deadlines``), and stays ``FINISH_SECONDS`` under the function's timeout (a test reads
both).

This module returns values; the HTTP answer of the scheduled function is ``app.sweep``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from looprelay import deadlines
from looprelay.config.model import SweeperConfig
from looprelay.core.model import EventRecord
from looprelay.core.sweep import (
    REDELIVERY_WINDOW,
    deliveries_to_redeliver,
    failed_deliveries,
    listing_start,
    next_resume_point,
)
from looprelay.errors import Permanent, Transient
from looprelay.ports import AppDelivery, Clock, GitHub, Store
from looprelay.service.expiry import DispatchExpiry

log = logging.getLogger("looprelay.service.sweeper")

REDELIVERED_EVENT = "sweep.redelivered"
SWEPT_EVENT = "sweep.completed"
"""One per run (not dry runs): its counts, and ``resume``, where the next run lists back to."""
PICKED_OUTCOMES = ("redelivered", "refused", "failed", "not asked")
"""``refused``: GitHub answered a 4xx; ``failed``: try again later (the run stops there);
``not asked``: after a failure, past the time budget, or in a dry run."""
_UNHANDLED = ("failed", "not asked")
FINISH_SECONDS = 30.0
"""What a run may take past its budget: the store's last writes and the answer. The
function's timeout must leave this much above ``sweeper.maxRunSeconds``."""


@dataclass(frozen=True)
class SweepReport:
    """What one sweep found and did."""

    listed: int
    failed: int
    in_ledger: int
    redelivered: int
    errors: int
    left: int
    """Failures found but not asked for (budget, rate limit): the next run asks for them."""
    complete: bool
    """The listing reached the resume point; when not, the next run lists that stretch again."""
    since: datetime
    resume: datetime
    picked: tuple[tuple[AppDelivery, str], ...] = field(default=())
    """Each attempt picked for redelivery, oldest first, and what became of it: one of
    ``PICKED_OUTCOMES``."""

    def counts(self) -> dict[str, int]:
        """The counts alone, for logs and JSON answers."""
        return {key: value for key, value in asdict(self).items() if type(value) is int}


@dataclass(frozen=True)
class Sweeper:
    """A sweep's parts, built once per process (``cloud.build_sweeper``)."""

    github: GitHub
    store: Store
    clock: Clock
    settings: SweeperConfig = field(default_factory=SweeperConfig)
    expiry: DispatchExpiry | None = None
    """Expires unserved dispatches on each run where polls must not read (the cloud)."""

    def run(self, *, dry_run: bool = False) -> SweepReport:
        """One sweep (and, unless ``dry_run``, one expiry run before it), both within
        ``settings.max_run_seconds``; raises as :func:`sweep`."""
        started = self.clock.now()
        with deadlines.within(self.settings.max_run_seconds):
            if self.expiry is not None and not dry_run:
                self.expiry.run()
            return sweep(
                self.github,
                self.store,
                self.clock,
                settings=self.settings,
                dry_run=dry_run,
                started=started,
            )


def sweep(
    github: GitHub,
    store: Store,
    clock: Clock,
    *,
    settings: SweeperConfig | None = None,
    window: timedelta = REDELIVERY_WINDOW,
    dry_run: bool = False,
    started: datetime | None = None,
) -> SweepReport:
    """Redeliver the App's failed deliveries since the last run's resume point that the
    ledger lacks, within ``settings``' budgets, and record the next resume point.

    A ``Permanent`` answer to one redelivery is counted and the next is tried; a ``Transient``
    one (GitHub unwell or rate-limiting) ends the run, as one while listing ends the listing.
    ``dry_run`` picks but asks for nothing and records nothing. The time budget counts from
    ``started`` (default now). Each redelivery's event records where the next run would list
    back to were this one cut off right after it. Raises ``Permanent`` when the
    deliveries cannot be listed at all (no App auth, a 4xx) and ``Transient`` when the store
    cannot be read or written.
    """
    settings = settings or SweeperConfig()
    now = clock.now()
    stop_at = (started or now) + timedelta(seconds=settings.max_run_seconds)
    since = listing_start(last_resume_point(store), now=now, window=window)
    listed, complete = _list(github, since, clock, stop_at, settings.max_pages_per_run)
    failed = failed_deliveries(listed, now=now, window=window)
    held = {d.guid for d in failed if store.get_delivery(d.guid) is not None}
    pending = deliveries_to_redeliver(failed, settled_guids=held)
    chosen = pending[: settings.redeliveries_per_run]

    def resume_after(asked: int) -> datetime:
        # Were the run to stop once ``asked`` of ``chosen`` were asked for (none failed: a
        # failure ends the asking), the rest would be left for the next run.
        left = pending[len(chosen) :] + chosen[asked:]
        return next_resume_point(start=since, listed=listed, complete=complete, unhandled=left)

    if dry_run:
        outcomes = ["not asked"] * len(chosen)
    else:
        outcomes = _redeliver(
            github, store, clock, chosen, stop_at=stop_at, resume_after=resume_after
        )
    unhandled = pending[len(chosen) :] + [
        d for d, outcome in zip(chosen, outcomes, strict=True) if outcome in _UNHANDLED
    ]
    resume = next_resume_point(start=since, listed=listed, complete=complete, unhandled=unhandled)
    report = SweepReport(
        listed=len(listed),
        failed=len(failed),
        in_ledger=len(held),
        redelivered=outcomes.count("redelivered"),
        errors=outcomes.count("refused") + outcomes.count("failed"),
        left=len(unhandled),
        complete=complete,
        since=since,
        resume=resume,
        picked=tuple(zip(chosen, outcomes, strict=True)),
    )
    if not dry_run:
        store.append_event(_swept(report, at=clock.now()))
    return report


def last_resume_point(store: Store) -> datetime | None:
    """Where the previous run said the next one lists back to: at its end, or with its last
    redelivery if it was cut off before; None before the first run (or once the event log has
    expired it: the next run then lists GitHub's whole window)."""
    newest = [
        event
        for name in (SWEPT_EVENT, REDELIVERED_EVENT)
        for event in store.list_events(name=name, newest=True, limit=1)
        if "resume" in event.data  # redeliveries recorded before progress was
    ]
    if not newest:
        return None
    last = max(newest, key=lambda event: (event.at, event.name == SWEPT_EVENT))
    return datetime.fromisoformat(str(last.data["resume"]))


def _list(
    github: GitHub, since: datetime, clock: Clock, stop_at: datetime, max_pages: int
) -> tuple[list[AppDelivery], bool]:
    """The attempts listed back to ``since`` and whether the listing got there; stops early at
    ``max_pages``, at ``stop_at``, or when GitHub says to (``Transient``), keeping what it has.
    """
    listed: list[AppDelivery] = []
    try:
        for count, page in enumerate(github.app_delivery_pages(since=since), start=1):
            listed.extend(page.deliveries)
            if page.last:
                return listed, True
            if count >= max_pages or clock.now() >= stop_at:
                log.warning(
                    "the run's page or time budget is spent at %d pages; the next run lists "
                    "this stretch again",
                    count,
                )
                return listed, False
    except Transient as exc:
        if not listed:
            raise
        log.warning("listing stopped early; the next run lists this stretch again: %s", exc)
        return listed, False
    return listed, True


def _redeliver(
    github: GitHub,
    store: Store,
    clock: Clock,
    chosen: list[AppDelivery],
    *,
    stop_at: datetime,
    resume_after: Callable[[int], datetime],
) -> list[str]:
    """Ask for each of ``chosen`` in turn, recording each redelivery with the resume point
    ``resume_after`` gives once it was asked for; return their outcomes (``PICKED_OUTCOMES``)."""
    outcomes = ["not asked"] * len(chosen)
    for index, delivery in enumerate(chosen):
        if clock.now() >= stop_at:
            log.warning("the run's time budget is spent; the rest wait for the next run")
            break
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
        store.append_event(_redelivered(delivery, at=clock.now(), resume=resume_after(index + 1)))
        outcomes[index] = "redelivered"
    return outcomes


def _redelivered(delivery: AppDelivery, *, at: datetime, resume: datetime) -> EventRecord:
    return EventRecord(
        name=REDELIVERED_EVENT,
        at=at,
        delivery_id=delivery.guid,
        data={
            "attempt": delivery.id,
            "event": delivery.event,
            "status_code": delivery.status_code,
            "delivered_at": delivery.delivered_at.isoformat(),
            "resume": resume.isoformat(),
        },
    )


def _swept(report: SweepReport, *, at: datetime) -> EventRecord:
    return EventRecord(
        name=SWEPT_EVENT,
        at=at,
        severity="INFO" if report.complete and not report.left else "WARNING",
        data={
            **report.counts(),
            "complete": report.complete,
            "since": report.since.isoformat(),
            "resume": report.resume.isoformat(),
        },
    )
