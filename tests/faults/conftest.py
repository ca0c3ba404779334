"""Fixtures every fault test of ``looprelay up`` shares."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.faults.deliveries import Up


@pytest.fixture
def running() -> Iterator[list[Up]]:
    """The ``looprelay up`` processes a test starts (append each); all SIGKILLed at the end."""
    started: list[Up] = []
    yield started
    for up in started:
        up.stop(signal.SIGKILL)
