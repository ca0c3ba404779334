"""The sweeper function's HTTP face: one sweep per POST, its counts as JSON
(``app.scheduled``)."""

from __future__ import annotations

import logging
from typing import Any

from looprelay.app.messages import Request, Response
from looprelay.app.scheduled import scheduled_round
from looprelay.service.sweeper import Sweeper

log = logging.getLogger("looprelay.service.sweeper")


class SweepHandler:
    """Answers the scheduler: 200 with the counts, 503 when GitHub or the store should be
    retried, 500 for what retrying cannot fix (the log names it)."""

    def __init__(self, sweeper: Sweeper) -> None:
        self._sweeper = sweeper

    def handle(self, request: Request) -> Response:
        """Sweep once for a POST; never raises."""
        return scheduled_round(request, self._sweep, what="sweep", log=log)

    def _sweep(self) -> dict[str, Any]:
        report = self._sweeper.run()
        return report.counts() | {"complete": report.complete}
