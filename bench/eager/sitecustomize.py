"""The ``eager`` receiver of ``bench/ingress.py``: ``looprelay up`` whose queue dispatches as
soon as no webhook is in flight, without waiting for the webhook to have been idle a moment.

The behaviour before ``IDLE_GRACE_SECONDS`` (``looprelay/app/webhook.py``), kept as a
benchmark-only patch so the two are measured in one run: ``bench/ingress.py`` puts this folder
on ``PYTHONPATH`` of that one ``looprelay up``.
"""

from __future__ import annotations

from looprelay.app import webhook

webhook.IDLE_GRACE_SECONDS = 0.0
