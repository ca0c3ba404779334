"""What a runner's result means outside the dispatch: the session's record, the event log,
and progress on GitHub (🎉 delivered, 😕 failed, an attach comment after a first spawn and after
a respawn on another runner, and a headless turn's answer or failure note as a reply on the
work item or its pull request)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from looprelay.config.templates import ATTACH_COMMENT, bundled_template
from looprelay.core.attach import attach_command, runner_socket
from looprelay.core.model import DispatchRecord, EventRecord, RunnerRecord, WorkItemRecord
from looprelay.core.render import render_comment
from looprelay.core.replies import (
    MAX_FAILURE_NOTE_CHARS,
    REPLY_MARKER_KIND,
    cut_to,
    failure_note,
    reply_body,
)
from looprelay.core.workitems import parse_ref
from looprelay.errors import Transient
from looprelay.ports import Clock, GitHub, Store, WorkItemStore
from looprelay.service.besteffort import best_effort
from looprelay.service.comments import post_once

if TYPE_CHECKING:
    from looprelay.wire.runner_api import ResultBody

log = logging.getLogger("looprelay.service.results")

MAX_SAVE_ROUNDS = 8
MAX_KEPT_DETAIL_CHARS = 500
"""How much of a result's detail the event log and the dispatch keep."""
_TURN_KINDS = frozenset({"spawn", "deliver"})
_ACTIVITY = {"spawned": "spawned", "delivered": "pasted"}
"""What the status page says a session last did, by result (a headless turn: answered)."""


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
        headless_replies: bool = True,
    ) -> None:
        """``headless_replies`` (``routing.headlessReplies``) posts what headless turns say."""
        self._items = work_items
        self._store = store
        self._github = github
        self._clock = clock
        self._bot_logins = tuple(bot_logins)
        self._headless_replies = headless_replies

    def record(
        self,
        dispatch: DispatchRecord,
        runner: RunnerRecord,
        result: ResultBody,
        *,
        final_status: str,
        announce: bool,
    ) -> None:
        """Log one accepted result and tell GitHub (after :meth:`place_session` and the
        dispatch's settle); never raises for GitHub trouble."""
        name = "dispatch.succeeded" if final_status == "succeeded" else "dispatch.failed"
        self._event(
            name,
            dispatch,
            {
                "status": result.status,
                "reason": result.reason,
                "runner_id": runner.runner_id,
                "final": final_status,
                "detail": result.detail[:MAX_KEPT_DETAIL_CHARS],
            },
        )
        for reported in result.events:
            self._event(reported.name, dispatch, {"runner_id": runner.runner_id, **reported.data})
        if result.reason == "resume-failed":
            self._event(
                "session.resume_failed",
                dispatch,
                {"runner_id": runner.runner_id, "session_id": result.session_id},
            )
        # A headless first turn is its spawn: it answers ``done`` where tmux says ``spawned``.
        first_turn = dispatch.kind == "spawn" and _turn_taken(dispatch, result)
        if result.status == "spawned" or first_turn:
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
        self._github_progress(dispatch, runner, result, final_status, announce=announce)

    def place_session(
        self, dispatch: DispatchRecord, runner: RunnerRecord, result: ResultBody, final: str
    ) -> bool:
        """Record where ``dispatch``'s session lives after ``result`` (the lease holder's, before
        its dispatch settles); True when its spawn is to be announced (pass it on to
        :meth:`record`): the first (not yet announced, not a respawn), or one on another runner
        than before (failover: the old attach comment names a runner the session left). Raises
        ``Transient`` when the store fails or the work item stays contended (the runner reports
        again; the dispatch is not settled)."""
        for _ in range(MAX_SAVE_ROUNDS):
            item = self._items.get_work_item(dispatch.work_item)
            session = item.sessions.get(dispatch.endpoint) if item else None
            if item is None or session is None or session.status in {"cleaned", "terminated"}:
                return False
            first = not session.announced and not result.resumed
            moved = session.runner_id not in (None, runner.runner_id)
            announce = result.status == "spawned" and (first or moved)
            now = self._clock.now()
            if final == "failed" and dispatch.kind in {"spawn", "deliver"}:
                changes: dict[str, object] = {
                    "status": "lost",
                    "activity": f"{dispatch.kind} failed",
                    "active_at": now,
                }
            elif result.status in {"spawned", "delivered"} or _turn_taken(dispatch, result):
                changes = {
                    "status": "live",
                    "runner_id": runner.runner_id,
                    "announced": session.announced or announce,
                    "activity": _ACTIVITY.get(result.status, "turn answered"),
                    "active_at": now,
                }
                if result.session_id:
                    changes["session_id"] = result.session_id
                if result.status == "spawned" or (
                    dispatch.kind == "spawn" and result.status == "done"
                ):
                    changes["spawned_at"] = now
                    changes["tmux_socket"] = result.tmux_socket or None
            else:
                return False
            placed = session.model_copy(update=changes)
            if placed == session:
                return announce  # a paste into a live session: its record already says so
            updated = item.model_copy(
                update={"sessions": dict(item.sessions) | {dispatch.endpoint: placed}}
            )
            if self._items.save_work_item(updated, expected_version=item.version):
                return announce
        # Nothing settles with its session unplaced: the runner reports again.
        raise Transient(f"the session record of {dispatch.endpoint} stayed contended")

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
        reply = self._reply_text(dispatch, result, final)
        if reply:
            self._best_effort(dispatch, lambda: self._reply(dispatch, item, reply))

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
                "attach_command": attach_command(
                    socket=result.tmux_socket or runner_socket(runner.runner_id),
                    session=result.tmux_target or dispatch.session_name,
                ),
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

    def _reply_text(self, dispatch: DispatchRecord, result: ResultBody, final: str) -> str:
        """The text a headless turn leaves on GitHub: its answer, or a short note on failure."""
        headless_turn = dispatch.runner_kind == "process" and dispatch.kind in _TURN_KINDS
        if not (self._headless_replies and headless_turn):
            return ""
        if final == "succeeded":
            return reply_body(result.reply)
        # A runner that sent no note still gets one, naming only the reason: its detail may
        # hold local paths that do not belong on a public issue.
        note = result.reply.strip() or failure_note(dispatch.harness, result.reason)
        return cut_to(note, MAX_FAILURE_NOTE_CHARS)

    def _reply(self, dispatch: DispatchRecord, item: WorkItemRecord, text: str) -> None:
        """Post ``text`` once on the session's endpoint: the work item, or the pull request a
        PR session works on (its ref names the number; the dispatch names the repository)."""
        assert self._github is not None
        try:
            number = parse_ref(dispatch.endpoint).number
        except ValueError:
            log.warning("no reply for %s: its endpoint is no ref", dispatch.dispatch_id)
            return
        post_once(
            self._github,
            installation_id=dispatch.installation_id,
            repository=dispatch.repository or item.repository,
            number=number,
            body=text,
            kind=REPLY_MARKER_KIND,
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


def _turn_taken(dispatch: DispatchRecord, result: ResultBody) -> bool:
    """A headless turn answered (``done``): its session lives on that runner as a tmux one
    would, so later turns resume there and its pull requests may get sessions of their own."""
    return result.status == "done" and dispatch.kind in {"spawn", "deliver"}
