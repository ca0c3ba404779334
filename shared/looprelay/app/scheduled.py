"""The HTTP face of a function Cloud Scheduler calls (the sweeper, the poller): one round per
POST, its summary as JSON.

Who may call is Cloud Run's IAM (only the scheduler's identity invokes); a round is bounded and
idempotent, so a stray call costs API quota, never a wrong effect.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from looprelay.app.messages import Request, Response, json_response
from looprelay.errors import Permanent, Transient


def scheduled_round(
    request: Request, run: Callable[[], Mapping[str, Any]], *, what: str, log: logging.Logger
) -> Response:
    """Run one round for a POST: 200 with its summary, 503 when GitHub or the store should be
    retried, 500 for what retrying cannot fix (the log names it). Never raises."""
    if request.method != "POST":
        return json_response(405, {"error": "only POST is accepted here"})
    try:
        summary = run()
    except Transient as exc:
        log.warning("%s failed, the scheduler will run it again: %s", what, exc)
        return json_response(503, {"error": "transient failure; retry"})
    except Permanent as exc:
        log.error("%s failed: %s", what, exc)
        return json_response(500, {"error": str(exc)})
    log.info("%s done", what, extra={"fields": dict(summary)})
    return json_response(200, summary)
