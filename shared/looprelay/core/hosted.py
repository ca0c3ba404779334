"""What a heartbeat's report of the sessions a runner hosts changes on the server.

Scenario: runner A hosts #7's tmux session (live, one slot). Its harness is killed. A's next
heartbeat names the session ``exited`` (status 137, since 14:02): the session is recorded
exited, so every view shows it so, its slot is free, and the next event on #7 respawns it.
Runner B comes back after its copy of #8 moved away and says it hosts nothing (``held_all``):
the slot the server still counted on B for #8 is freed. An endpoint with a dispatch open is
left alone until it settles: the dispatch itself (a respawn, a stop) says what became of it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from looprelay.core.model import WorkItemRecord
from looprelay.core.status import EXITED  # a harness's state and its session's status alike


@dataclass(frozen=True)
class HostedReport:
    """One session a runner says it hosts, and its harness's state (``wire.runner_api``)."""

    work_item: str
    endpoint: str
    harness: str = ""
    exit_status: int | None = None
    exited_at: datetime | None = None


@dataclass(frozen=True)
class Exited:
    """A session the server believed live on the runner whose harness is gone."""

    work_item: str
    endpoint: str
    exit_status: int | None
    exited_at: datetime


@dataclass(frozen=True)
class Settled:
    """What to write: sessions now exited, and the runner's slots (endpoint -> work item)
    to free."""

    exited: tuple[Exited, ...]
    freed: Mapping[str, str]


def settle_hosted(
    reports: Iterable[HostedReport],
    *,
    runner_id: str,
    held_all: bool,
    slots: Mapping[str, str],
    work_items: Mapping[str, WorkItemRecord],
    busy: Collection[str],
    now: datetime,
) -> Settled:
    """Settle what runner ``runner_id`` reports it hosts (``reports``; every session when
    ``held_all``) against the slots the server counts on it (``slots``: endpoint -> work
    item) and the work items (by ref) of both. ``busy`` are endpoints with a dispatch open:
    left as they are. Never raises."""
    named = {report.endpoint: report for report in reports}
    exited: dict[str, Exited] = {}
    for endpoint, report in named.items():
        if report.harness == EXITED and endpoint not in busy:
            item = work_items.get(report.work_item)
            if _live_here(item, endpoint, runner_id):
                since = min(report.exited_at or now, now)
                exited[endpoint] = Exited(report.work_item, endpoint, report.exit_status, since)
    if held_all:
        for endpoint, ref in slots.items():
            gone = endpoint not in named and endpoint not in busy
            if gone and _live_here(work_items.get(ref), endpoint, runner_id):
                exited[endpoint] = Exited(ref, endpoint, None, now)
    freed = {
        endpoint: ref
        for endpoint, ref in slots.items()
        if endpoint not in busy
        and (endpoint in exited or (held_all and endpoint not in named) or _ended(named, endpoint))
    }
    return Settled(tuple(exited.values()), freed)


def looked_at(reports: Iterable[HostedReport], slots: Mapping[str, str]) -> set[str]:
    """The work items a heartbeat's settling needs to read: those of the runner's slots and
    of the sessions it reports exited (none, the usual idle heartbeat: no read)."""
    refs = set(slots.values())
    refs.update(r.work_item for r in reports if r.harness == EXITED)
    return refs


def _live_here(item: WorkItemRecord | None, endpoint: str, runner_id: str) -> bool:
    session = item.sessions.get(endpoint) if item else None
    return (
        session is not None
        and session.status == "live"
        and session.runner_id == runner_id
        and session.runner_kind == "tmux"
    )


def _ended(named: Mapping[str, HostedReport], endpoint: str) -> bool:
    report = named.get(endpoint)
    return report is not None and report.harness == EXITED
