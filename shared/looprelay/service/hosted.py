"""Applying what a heartbeat says a runner hosts (``core.hosted``): sessions whose harness
ended are recorded ``exited`` (``session.exited``, with the pane's last lines) and the slots
nothing runs in any more are freed (``session.slot_freed``), so the state every view shows is
never older than one heartbeat and no slot outlives its harness."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from looprelay.core.hosted import Exited, HostedReport, looked_at, settle_hosted
from looprelay.core.model import DISPATCH_OPEN, EventRecord, RunnerRecord
from looprelay.core.status import EXITED
from looprelay.ports import Clock, Store, WorkItemStore
from looprelay.service.waker import DispatchWaker
from looprelay.wire.runner_api import HeldSession

log = logging.getLogger("looprelay.service.hosted")

MAX_SAVE_ROUNDS = 8
MAX_KEPT_LINES_CHARS = 500
"""How much of an exited harness's last lines the event log keeps."""


class HostedSessions:
    """Records the sessions' real state as runners report it on their heartbeats."""

    def __init__(
        self, *, work_items: WorkItemStore, store: Store, clock: Clock, waker: DispatchWaker | None
    ) -> None:
        self._items = work_items
        self._store = store
        self._clock = clock
        self._waker = waker

    def settle(
        self, runner: RunnerRecord, held: Sequence[HeldSession], *, held_all: bool, changed: bool
    ) -> None:
        """Record exited sessions and free the slots of ``runner`` nothing runs in, as its
        heartbeat's ``held`` (every session it hosts when ``held_all``) says. A runner that
        hosts nothing is looked at only when its heartbeat ``changed`` something (it came
        back, or its last harness ended): an idle runner's heartbeat reads nothing. Raises
        ``Transient`` when the store fails (the agent's next heartbeat says it again)."""
        reports = [
            HostedReport(h.work_item, h.endpoint, h.harness, h.exit_status, h.exited_at)
            for h in held
        ]
        look = bool(held) or (held_all and changed)
        slots = self._items.held_sessions(runner.runner_id) if look else {}
        refs = looked_at(reports, slots)
        if not refs:
            return
        items = self._items.get_work_items(refs)
        busy = {
            d.endpoint
            for ref in items
            for d in self._items.list_dispatches(statuses=DISPATCH_OPEN, work_item=ref)
        }
        settled = settle_hosted(
            reports,
            runner_id=runner.runner_id,
            held_all=held_all,
            slots=slots,
            work_items=items,
            busy=busy,
            now=self._clock.now(),
        )
        lines = {h.endpoint: h.last_lines for h in held}
        for exited in settled.exited:
            if self._record_exit(exited, runner):
                self._event(
                    "session.exited",
                    runner,
                    exited.work_item,
                    {
                        "endpoint": exited.endpoint,
                        "exit_status": exited.exit_status,
                        "exited_at": exited.exited_at.isoformat(),
                        "last_lines": lines.get(exited.endpoint, "")[-MAX_KEPT_LINES_CHARS:],
                    },
                )
        freed = [
            (endpoint, ref)
            for endpoint, ref in settled.freed.items()
            if self._items.release_session(runner.runner_id, endpoint=endpoint)
        ]
        for endpoint, ref in freed:
            reason = EXITED if endpoint in lines else "not-hosted"
            self._event("session.slot_freed", runner, ref, {"endpoint": endpoint, "reason": reason})
        if freed and self._waker is not None:
            self._waker.notify(runners=(runner.runner_id,))

    def _record_exit(self, exited: Exited, runner: RunnerRecord) -> bool:
        """Mark the session exited if it is still live on ``runner``; whether it was."""
        for _ in range(MAX_SAVE_ROUNDS):
            item = self._items.get_work_item(exited.work_item)
            session = item.sessions.get(exited.endpoint) if item else None
            if item is None or session is None:
                return False
            if session.status != "live" or session.runner_id != runner.runner_id:
                return False
            ended = session.model_copy(
                update={
                    "status": EXITED,
                    "exit_status": exited.exit_status,
                    "exited_at": exited.exited_at,
                }
            )
            updated = item.model_copy(
                update={"sessions": dict(item.sessions) | {exited.endpoint: ended}}
            )
            if self._items.save_work_item(updated, expected_version=item.version):
                log.info(
                    "%s's harness on runner %s exited (status %s)",
                    exited.endpoint,
                    runner.name,
                    exited.exit_status,
                    extra={"runner_id": runner.runner_id},
                )
                return True
        log.warning("the session record of %s stayed contended", exited.endpoint)
        return False

    def _event(self, name: str, runner: RunnerRecord, ref: str, data: dict[str, object]) -> None:
        self._store.append_event(
            EventRecord(
                name=name,
                at=self._clock.now(),
                work_item=ref,
                data={"runner_id": runner.runner_id, **data},
            )
        )
