"""The ``switch`` receiver of ``bench/ingress.py``: ``looprelay up`` with the interpreter's
thread switch interval at 0.5 ms instead of CPython's 5 ms.

An experiment, not a mode looprelay offers: when the worker's threads hold the GIL, the event
loop that has a webhook to answer waits up to the switch interval for it. ``bench/ingress.py``
puts this folder on ``PYTHONPATH`` of that one ``looprelay up``.
"""

from __future__ import annotations

import sys

sys.setswitchinterval(0.0005)
