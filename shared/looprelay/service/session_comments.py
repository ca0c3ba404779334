"""Sessions that speak on GitHub: ``looprelay session comment`` and ``ask``, through the runner API.

A runner asks for a session's token while it holds the lease of a dispatch that starts a
harness (:meth:`SessionComments.issue_token`); only the token's hash is kept, on the session's
record, and a newer token replaces it. The harness presents the token, naming its session, and
its text is posted as the App (the server's GitHub client, never the operator's account) on the
session's endpoint, cut to GitHub's limit, with the loop-prevention marker. An ``ask`` also marks
the session awaiting input until a human's comment reaches it (``core.plan``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from looprelay.core.model import EventRecord, RunnerRecord, SessionRecord, WorkItemRecord
from looprelay.core.replies import reply_body
from looprelay.core.status import TURN_RUNNING
from looprelay.core.workitems import parse_ref
from looprelay.errors import BadDelivery, Conflict, NotFound, Permanent, Transient, Unauthorized
from looprelay.ports import Clock, GitHub, Store, WorkItemStore
from looprelay.service.comments import post_once
from looprelay.service.runner_secrets import (
    credential_matches,
    hash_credential,
    new_session_token,
    parse_session_bearer,
)
from looprelay.wire.runner_api import (
    SessionCommentBody,
    SessionPosted,
    SessionToken,
    SessionTokenBody,
)

SAVE_ROUNDS = 8
"""Compare-and-set rounds on a work item the worker is writing at the same time."""
COMMENT_EVENT, ASK_EVENT = "session.comment", "session.awaiting_input"
_HARNESS_KINDS = frozenset({"spawn", "deliver"})
_ENDED = frozenset({"terminated", "cleaned"})
_REFUSED = (
    "this session token is not {endpoint}'s (another session's, or one replaced by a respawn); "
    "run `looprelay session` from the session's own tree, with the environment it started with"
)


class SessionComments:
    """Mints session tokens for runners and posts what sessions say; one instance serves many
    requests and threads. ``github`` None: a server without GitHub credentials posts nothing."""

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

    def issue_token(self, runner: RunnerRecord, body: SessionTokenBody) -> SessionToken:
        """A new token for the session of the dispatch ``runner`` holds the lease of; it
        replaces the session's earlier one. Raises ``NotFound`` (no such dispatch, or its
        session is gone), ``Conflict`` (the lease is not ``runner``'s), ``BadDelivery`` (a
        dispatch that starts no harness) and ``Transient`` (the store)."""
        dispatch = self._items.get_dispatch(body.dispatch_id)
        if dispatch is None:
            raise NotFound(f"no dispatch {body.dispatch_id}")
        if dispatch.status != "leased" or dispatch.lease_holder != runner.runner_id:
            raise Conflict(f"the lease of {dispatch.dispatch_id} is not this runner's")
        if dispatch.kind not in _HARNESS_KINDS:
            raise BadDelivery(f"a {dispatch.kind} dispatch starts no harness to give a token")
        token = new_session_token()
        self._update(
            dispatch.work_item,
            dispatch.endpoint,
            lambda session: session.model_copy(
                update={
                    "token_hash": hash_credential(token),
                    "installation_id": dispatch.installation_id,
                    # Asked for just before the harness starts: the turn or spawn begins now.
                    "activity": TURN_RUNNING if dispatch.runner_kind == "process" else "starting",
                    "active_at": self._clock.now(),
                }
            ),
        )
        return SessionToken(token=token, work_item=dispatch.work_item, endpoint=dispatch.endpoint)

    def post(self, authorization: str, body: SessionCommentBody, *, ask: bool) -> SessionPosted:
        """Post ``body``'s text as the App on the session's endpoint, once per ``body.key``;
        with ``ask`` the session then awaits input. Raises ``Unauthorized`` unless
        ``authorization`` carries this very session's token, ``NotFound`` when this server has
        no GitHub client, ``BadDelivery`` (502) when GitHub refuses, ``Transient``."""
        item, session = self._authenticate(authorization, body)
        if self._github is None:
            raise NotFound("this server has no GitHub credentials (github.*) to post with")
        text = reply_body(body.body)
        number = parse_ref(session.endpoint).number
        kind = "session-ask" if ask else "session-comment"
        try:
            comment_id = post_once(
                self._github,
                installation_id=session.installation_id,
                repository=session.repository or item.repository,
                number=number,
                body=text,
                kind=kind,
                marker_id=body.key,
                bot_logins=self._bot_logins,
            )
        except Permanent as exc:
            raise BadDelivery(f"GitHub refused the comment: {exc}", status=502) from exc
        now = self._clock.now()
        self._update(
            item.ref,
            session.endpoint,
            lambda current: current.model_copy(
                update={
                    "activity": "asked" if ask else "commented",
                    "active_at": now,
                    "awaiting_input_at": now if ask else current.awaiting_input_at,
                }
            ),
        )
        cut = text != body.body.strip()
        self._store.append_event(
            EventRecord(
                name=ASK_EVENT if ask else COMMENT_EVENT,
                at=now,
                work_item=item.ref,
                data={
                    "endpoint": session.endpoint,
                    "comment_id": comment_id,
                    "runner_id": session.runner_id,
                    "chars": len(text),
                    "cut": cut,
                },
            )
        )
        return SessionPosted(
            comment_id=comment_id, on=session.endpoint, cut=cut, awaiting_input=ask
        )

    def _authenticate(
        self, authorization: str, body: SessionCommentBody
    ) -> tuple[WorkItemRecord, SessionRecord]:
        token = parse_session_bearer(authorization)
        if token is None:
            raise Unauthorized("send Authorization: Bearer <the session's LOOPRELAY_SESSION_TOKEN>")
        item = self._items.get_work_item(body.work_item)
        session = item.sessions.get(body.endpoint) if item is not None else None
        stored = session.token_hash if session is not None else ""
        # Compared even without a stored hash, so a miss takes as long as a wrong token.
        matches = credential_matches(token, stored or "0" * 64) and bool(stored)
        if item is None or session is None or not matches:
            raise Unauthorized(_REFUSED.format(endpoint=body.endpoint[:300]))
        if session.status in _ENDED:
            raise Unauthorized(f"session {session.endpoint} has ended ({session.status})")
        return item, session

    def _update(
        self,
        ref: str,
        endpoint: str,
        change: Callable[[SessionRecord], SessionRecord],
    ) -> None:
        """Save ``change`` of the session at ``endpoint``; raises ``NotFound`` when it is
        gone and ``Transient`` when the work item stays contended."""
        for _ in range(SAVE_ROUNDS):
            item = self._items.get_work_item(ref)
            session = item.sessions.get(endpoint) if item is not None else None
            if item is None or session is None or session.status in _ENDED:
                raise NotFound(f"no live session {endpoint} on {ref}")
            changed = change(session)
            if changed == session:
                return
            sessions = dict(item.sessions) | {endpoint: changed}
            if self._items.save_work_item(
                item.model_copy(update={"sessions": sessions}), expected_version=item.version
            ):
                return
        raise Transient(f"the session record of {endpoint} stayed contended")
