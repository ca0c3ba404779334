"""Test doubles shared by the runner API and agent suites: a hand-moved clock, the store trio."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from looprelay.ports import Clock, RunnerRegistry, Store, WorkItemStore
from looprelay.service.status import StatusReader

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


class SteppingClock:
    """The ``Clock`` port; it moves only when the test moves it."""

    def __init__(self, start: datetime = T0) -> None:
        self.current = start

    def now(self) -> datetime:
        return self.current

    def advance(self, seconds: float) -> None:
        self.current += timedelta(seconds=seconds)


@dataclass(frozen=True)
class Stores:
    """The three stores the runner API uses, all of one backend."""

    registry: RunnerRegistry
    work_items: WorkItemStore
    events: Store


def status_json(stores: Stores, clock: Clock, *, lost_after_seconds: float) -> dict[str, Any]:
    """The view ``looprelay status --json`` prints, read from ``stores`` as of ``clock``."""
    reader = StatusReader(
        store=stores.events,
        work_items=stores.work_items,
        runners=stores.registry,
        clock=clock,
        lost_after=timedelta(seconds=lost_after_seconds),
    )
    view: dict[str, Any] = reader.read().model_dump(mode="json")
    return view
