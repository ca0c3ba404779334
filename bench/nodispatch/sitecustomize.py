"""The ``nodispatch`` receiver of ``bench/ingress.py``: ``looprelay up`` whose queue never
dispatches, so no worker runs beside the webhook.

Not a mode looprelay offers (nothing acked would ever be routed): ``bench/ingress.py`` puts this
folder on ``PYTHONPATH`` of that one ``looprelay up``. The acks stay durable; set against the
looprelay row it shows what the worker, running in the same process on the same two cores,
costs the webhook.
"""

from __future__ import annotations

from looprelay.app import compose


def _start_without_dispatchers(self: compose.LocalApp, *, host: str, port: int) -> None:
    """Leave the queue's dispatchers stopped: tasks are enqueued and stay queued."""


compose.LocalApp.start = _start_without_dispatchers  # type: ignore[method-assign]
