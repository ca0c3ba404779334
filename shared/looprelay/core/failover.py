"""Which sessions a returning runner still hosts that live elsewhere now.

Scenario: runner A hosts work item #7's session and falls silent (killed, or cut off) past
``lostAfterSeconds``. A comment on #7 is taken by runner B, which respawns the session there;
the work item now records B as the session's runner. When A is heard from again it names the
sessions its ledger holds; each one whose work item records another runner has moved away, and
A must stop its harness, or #7 would have two harnesses answering one issue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from looprelay.core.model import WorkItemRecord


@dataclass(frozen=True)
class Held:
    """A session a runner says it hosts."""

    work_item: str
    endpoint: str
    session_name: str


@dataclass(frozen=True)
class Moved:
    """A held session that the work item records on another runner."""

    held: Held
    runner_id: str


def moved_away(
    held: Iterable[Held], work_items: Mapping[str, WorkItemRecord], *, runner_id: str
) -> list[Moved]:
    """Return the sessions of ``held`` that ``work_items`` (by ref) record on a runner other
    than ``runner_id``. A work item or session the server no longer has is left alone: its
    end comes as a cleanup or terminate dispatch. Never raises."""
    moved = []
    for session in held:
        item = work_items.get(session.work_item)
        record = item.sessions.get(session.endpoint) if item else None
        if record is not None and record.runner_id not in (None, runner_id):
            moved.append(Moved(session, record.runner_id))
    return moved
