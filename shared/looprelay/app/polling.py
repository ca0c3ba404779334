"""``looprelay up``'s poll ingress: one background thread polling every configured repository
each ``github.poll.intervalSeconds`` (``service.poller``). In the cloud the ``poller``
function runs one round per Cloud Scheduler call instead (``app.sweep``'s sibling)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from looprelay import deadlines
from looprelay.app.messages import Request, Response
from looprelay.app.scheduled import scheduled_round
from looprelay.service.poller import Poller

log = logging.getLogger("looprelay.service.poller")

JOIN_SECONDS = 30.0
"""How long stopping waits for a round in progress (its calls have GitHub's timeouts)."""
ROUND_BUDGET_SECONDS = 90.0
"""A scheduled round's time budget (``deadlines``), 30 s under the poller function's 120 s
timeout (infra/main.tf): a call that cannot finish in it fails its repository's poll, whose
cursors stay, instead of the platform cutting the round off mid-write."""


class PollLoop:
    """Polls in a daemon thread until stopped; a round's failure is logged and the next one
    comes on time (each repository's own failures are on its cursors, and backed off)."""

    def __init__(self, poller: Poller, *, interval_seconds: float) -> None:
        self._poller, self._interval = poller, interval_seconds
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start polling; a second call does nothing."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="looprelay-poller", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Poll no more, letting a round in progress finish first."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(JOIN_SECONDS)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._poller.run()
            except Exception:  # the store, or a bug: the loop must outlive one bad round
                log.exception("a poll round failed; the next comes in %.0f s", self._interval)
            self._stopped.wait(self._interval)


class PollHandler:
    """The ``poller`` function's face (``app.scheduled``): one round per POST from Cloud
    Scheduler, within ``ROUND_BUDGET_SECONDS``, each repository's report as JSON."""

    def __init__(self, poller: Poller) -> None:
        self._poller = poller

    def handle(self, request: Request) -> Response:
        """Poll once for a POST; never raises."""
        return scheduled_round(request, self._round, what="poll round", log=log)

    def _round(self) -> dict[str, Any]:
        with deadlines.within(ROUND_BUDGET_SECONDS):
            reports = self._poller.run()
        return {
            "queued": sum(r.queued for r in reports),
            "repositories": [
                {
                    "repository": r.repository,
                    "queued": r.queued,
                    "seen": r.seen,
                    "unchanged": r.unchanged,
                    "error": r.error,
                    "skipped": r.skipped,
                }
                for r in reports
            ],
        }
