"""What a runner's result means outside the dispatch: the session's record, the event log,
and progress on GitHub (🎉 delivered, 😕 failed, one attach comment after a first spawn)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from looprelay.besteffort import best_effort
from looprelay.comments import post_once
from looprelay.core.render import render_comment
from looprelay.ports import Clock, GitHub, Store, WorkItemStore
from looprelay.records import DispatchRecord, EventRecord, RunnerRecord, WorkItemRecord
from looprelay.templateloader import ATTACH_COMMENT, bundled_template

if TYPE_CHECKING:
    from looprelay.runnerapi_models import ResultBody

log = logging.getLogger("looprelay.progress")

MAX_SAVE_ROUNDS = 8


class Progress:
    """Records results; GitHub is optional (no credentials under a bare ``looprelay up``)."""

    def __init__(
        self,
        *,
        work_items: WorkItemStore,
        store: Store,
        github: GitHub | None,
        clock: Clock,
        bot_logins: Collection[str] = (),
    ) -> None:
        self._items = work_items
        self._store = store
        self._github = github
        self._clock = clock
        self._bot_logins = tuple(bot_logins)

    def record(
        self,
        dispatch: DispatchRecord,
        runner: RunnerRecord,
        result: ResultBody,
        *,
        final_status: str,
    ) -> None:
        """Apply one accepted result; never raises for GitHub trouble."""
        first_spawn = self._update_session(dispatch, runner, result, final_status)
        name = "dispatch.succeeded" if final_status == "succeeded" else "dispatch.failed"
        self._event(
            name,
            dispatch,
            {
                "status": result.status,
                "reason": result.reason,
                "runner_id": runner.runner_id,
                "final": final_status,
                "detail": result.detail[:500],
            },
        )
        if result.reason == "resume-failed":
            self._event(
                "session.resume_failed",
                dispatch,
                {"runner_id": runner.runner_id, "session_id": result.session_id},
            )
        if result.status == "spawned":
            self._event(
                "session.respawned" if result.resumed else "session.spawned",
                dispatch,
                {
                    "interaction": dispatch.interaction,
                    "harness": dispatch.harness,
                    "runner": dispatch.runner_kind,
                    "runner_id": runner.runner_id,
                    "tmux_target": result.tmux_target,
                    "session_id": result.session_id,
                },
            )
        if final_status == "pending":
            return
        self._github_progress(dispatch, runner, result, final_status, announce=first_spawn)

    def _update_session(
        self, dispatch: DispatchRecord, runner: RunnerRecord, result: ResultBody, final: str
    ) -> bool:
        """Record where the session now lives; True when this was its first announceable
        spawn (not yet announced, not a respawn)."""
        for _ in range(MAX_SAVE_ROUNDS):
            item = self._items.get_work_item(dispatch.work_item)
            session = item.sessions.get(dispatch.endpoint) if item else None
            if item is None or session is None or session.status in {"cleaned", "terminated"}:
                return False
            announce = result.status == "spawned" and not session.announced and not result.resumed
            if final == "failed" and dispatch.kind in {"spawn", "deliver"}:
                changes: dict[str, object] = {"status": "lost"}
            elif result.status in {"spawned", "delivered"}:
                changes = {
                    "status": "live",
                    "runner_id": runner.runner_id,
                    "announced": session.announced or announce,
                }
                if result.session_id:
                    changes["session_id"] = result.session_id
                if result.status == "spawned":
                    changes["spawned_at"] = self._clock.now()
            else:
                return False
            sessions = dict(item.sessions) | {dispatch.endpoint: session.model_copy(update=changes)}
            updated = item.model_copy(update={"sessions": sessions})
            if self._items.save_work_item(updated, expected_version=item.version):
                return announce
        log.warning("session record of %s stayed contended; left as it was", dispatch.endpoint)
        return False

    def _github_progress(
        self,
        dispatch: DispatchRecord,
        runner: RunnerRecord,
        result: ResultBody,
        final: str,
        *,
        announce: bool,
    ) -> None:
        if self._github is None:
            return
        item = self._items.get_work_item(dispatch.work_item)
        if item is None:
            return
        if dispatch.comment_id is not None and dispatch.kind in {"spawn", "deliver"}:
            github = self._github
            self._best_effort(
                dispatch,
                lambda: github.add_reaction(
                    installation_id=dispatch.installation_id,
                    repository=item.repository,
                    comment_id=dispatch.comment_id or 0,
                    comment_kind=dispatch.comment_kind or "issue",
                    content="hooray" if final == "succeeded" else "confused",
                ),
            )
        if announce and dispatch.runner_kind == "tmux":
            self._best_effort(dispatch, lambda: self._announce(dispatch, runner, result, item))

    def _best_effort(self, dispatch: DispatchRecord, call: Callable[[], object]) -> None:
        best_effort(
            call,
            store=self._store,
            clock=self._clock,
            delivery_id=dispatch.delivery_id,
            work_item=dispatch.work_item,
            context={"dispatch_id": dispatch.dispatch_id},
        )

    def _announce(
        self,
        dispatch: DispatchRecord,
        runner: RunnerRecord,
        result: ResultBody,
        item: WorkItemRecord,
    ) -> None:
        assert self._github is not None
        body = render_comment(
            bundled_template(ATTACH_COMMENT),
            {
                "endpoint": dispatch.endpoint,
                "runner_name": runner.name,
                "harness": dispatch.harness,
                "interaction": dispatch.interaction,
                "tmux_socket": result.tmux_socket or "looprelay",
                "session_name": result.tmux_target or dispatch.session_name,
            },
        )
        post_once(
            self._github,
            installation_id=dispatch.installation_id,
            repository=item.repository,
            number=item.number,
            body=body,
            kind="attach",
            marker_id=dispatch.dispatch_id,
            bot_logins=self._bot_logins,
        )

    def _event(self, name: str, dispatch: DispatchRecord, data: dict[str, object]) -> None:
        self._store.append_event(
            EventRecord(
                name=name,
                at=self._clock.now(),
                delivery_id=dispatch.delivery_id,
                work_item=dispatch.work_item,
                data={"dispatch_id": dispatch.dispatch_id, **data},
            )
        )
