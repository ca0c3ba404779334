"""The deliveries of the status page: folded by what they are about, and one delivery's page
(``/status/deliveries/ID``) with the events it caused. Values in, rows out, as ``core.status``.

An event's fields are shown shortened to one line each; no prompt or comment body is in an event.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from looprelay.core.model import DeliveryRecord, EventRecord
from looprelay.core.status import DeliveryRow, delivery_row, short_text


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True)


class DeliveryFold(_Row):
    """The recent deliveries about one issue or pull request, newest first."""

    subject: str
    url: str
    deliveries: list[DeliveryRow]


class EventRow(_Row):
    """One event of a delivery's log, its fields shortened to one line each."""

    name: str
    at: datetime
    severity: str
    work_item: str | None
    data: dict[str, str]


class DeliveryPage(_Row):
    """One delivery and the events it caused, for ``/status/deliveries/ID``."""

    generated_at: datetime
    delivery: DeliveryRow
    events: list[EventRow]


def fold_deliveries(rows: Sequence[DeliveryRow]) -> list[DeliveryFold]:
    """``rows`` (newest first) grouped by what they are about, the group with the newest
    delivery first; deliveries about no issue or pull request share one group ("")."""
    groups: dict[str, list[DeliveryRow]] = {}
    for row in rows:
        groups.setdefault(row.subject, []).append(row)
    return [
        DeliveryFold(subject=subject, url=members[0].subject_url, deliveries=members)
        for subject, members in groups.items()
    ]


def build_delivery_page(
    delivery: DeliveryRecord, events: Sequence[EventRecord], *, now: datetime
) -> DeliveryPage:
    """The page of ``delivery`` and its ``events`` (in the order written). Never raises."""
    return DeliveryPage(
        generated_at=now,
        delivery=delivery_row(delivery),
        events=[
            EventRow(
                name=event.name,
                at=event.at,
                severity=event.severity,
                work_item=event.work_item,
                data={str(key): short_text(_text(value)) for key, value in event.data.items()},
            )
            for event in events
        ],
    )


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
