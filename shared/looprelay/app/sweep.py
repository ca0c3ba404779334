"""The sweeper function's HTTP face: one sweep per POST, its counts as JSON.

Who may call it is Cloud Run's IAM (only Cloud Scheduler's identity is an invoker); a sweep is
bounded and idempotent, so a stray call costs API quota, never a wrong effect.
"""

from __future__ import annotations

import logging

from looprelay.app.messages import Request, Response, json_response
from looprelay.errors import Permanent, Transient
from looprelay.service.sweeper import Sweeper

log = logging.getLogger("looprelay.service.sweeper")


class SweepHandler:
    """Answers the scheduler: 200 with the counts, 503 when GitHub or the store should be
    retried, 500 for what retrying cannot fix (the log names it)."""

    def __init__(self, sweeper: Sweeper) -> None:
        self._sweeper = sweeper

    def handle(self, request: Request) -> Response:
        """Sweep once for a POST; never raises."""
        if request.method != "POST":
            return json_response(405, {"error": "only POST is accepted here"})
        try:
            report = self._sweeper.run()
        except Transient as exc:
            log.warning("sweep failed, the scheduler will run it again: %s", exc)
            return json_response(503, {"error": "transient failure; retry"})
        except Permanent as exc:
            log.error("sweep failed: %s", exc)
            return json_response(500, {"error": str(exc)})
        counts = report.counts() | {"complete": report.complete}
        log.info("sweep done", extra={"fields": counts})
        return json_response(200, counts)
