"""The runner API's service: how runner agents register, stay known and take work.

Runners call out only (no inbound port on their side). Every call but ``register`` carries
``Authorization: Bearer <runner_id>:<secret>``; an unknown, wrong or revoked credential raises
``Unauthorized`` with a message telling the operator to register again. One method per
operation takes the parsed body (``wire.runner_api``) and returns the answer model; HTTP (the
paths, the body parsing, the status codes) is ``app.runner_http``'s.

``RunnerRecords`` (a bounded cache per instance, told of every change to a runner) holds the
runners authenticated lately, so an idle runner's polls and heartbeats read nothing:
authentication takes the runner from it when the secret matches, and a heartbeat that
reports no new status only records that the runner is alive
(``RunnerRegistry.record_alive``, a write that reads nothing).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from looprelay.config.model import RunnersConfig
from looprelay.core.identity import second_agent, second_agent_message
from looprelay.core.model import DispatchRecord, EventRecord, RegistrationToken, RunnerRecord
from looprelay.core.scheduling import is_live, reports_new_status
from looprelay.errors import Conflict, NotFound, Unauthorized
from looprelay.ports import Clock, RunnerRegistry, RunnerStatus, Store
from looprelay.service.failover import Failover
from looprelay.service.hosted import HostedSessions
from looprelay.service.lease_desk import LeaseDesk
from looprelay.service.runner_cache import RunnerRecords
from looprelay.service.runner_secrets import (
    credential_matches,
    hash_credential,
    new_registration_token,
    new_runner_id,
    new_runner_secret,
    parse_runner_bearer,
)
from looprelay.service.session_comments import SessionComments
from looprelay.wire.runner_api import (
    Deregistered,
    Dispatch,
    HeartbeatBody,
    HeartbeatHints,
    Leased,
    PollBody,
    RegisterBody,
    Registered,
    RenewBody,
    Renewed,
    Reported,
    ResultBody,
    Rotated,
    SessionCommentBody,
    SessionPosted,
    SessionToken,
    SessionTokenBody,
)

log = logging.getLogger("looprelay.service.runners")

_REGISTER_AGAIN = "register it again with `looprelay runner register`"


def leased(dispatch: DispatchRecord | None) -> Leased | None:
    """A poll's answer: the dispatch leased to the runner, or None when none came."""
    return None if dispatch is None else Leased(dispatch=Dispatch.from_record(dispatch))


class RunnerApi:
    """The runner API's operations; one instance serves many requests and threads.

    Each raises ``Unauthorized``, ``NotFound``, ``Conflict`` or ``Transient`` (the store
    failed: retry) instead of answering.
    """

    def __init__(
        self,
        *,
        registry: RunnerRegistry,
        store: Store,
        clock: Clock,
        config: RunnersConfig,
        desk: LeaseDesk | None = None,
        records: RunnerRecords | None = None,
        sessions: SessionComments | None = None,
    ) -> None:
        """``desk`` serves poll/renew/results; without it only registration is served.
        ``records`` spares authentication its read of a runner read lately. ``sessions``
        serves the session endpoints (``looprelay session``)."""
        self._sessions = sessions
        self._registry = registry
        self._records = records
        self._desk = desk
        self._failover = (
            Failover(work_items=desk.work_items, store=store, clock=clock, waker=desk.waker)
            if desk is not None
            else None
        )
        self._hosted = (
            HostedSessions(work_items=desk.work_items, store=store, clock=clock, waker=desk.waker)
            if desk is not None
            else None
        )
        self._store = store
        self._clock = clock
        self._config = config

    @property
    def desk(self) -> LeaseDesk | None:
        """The lease desk serving poll, renew and results, if any."""
        return self._desk

    def authenticate(self, authorization: str) -> RunnerRecord:
        """The runner an ``Authorization`` header value names and proves, for every call but
        ``register``. Raises ``Unauthorized`` for a missing, unknown, wrong or revoked one."""
        parsed = parse_runner_bearer(authorization)
        runner = self._lookup(*parsed) if parsed else None
        if (
            parsed is None
            or runner is None
            or not credential_matches(parsed[1], runner.secret_hash)
        ):
            raise Unauthorized(
                "unknown runner or wrong secret; if an operator ran `looprelay runners rotate`, "
                "put the new secret in this runner's credentials file, else "
                f"{_REGISTER_AGAIN}"
            )
        if runner.revoked:
            raise Unauthorized(f"runner {runner.name} was revoked; {_REGISTER_AGAIN}")
        return runner

    def _lookup(self, runner_id: str, secret: str) -> RunnerRecord | None:
        # Fail closed: the cache vouches only for a runner it holds whose secret matches.
        # Anything else is decided on a read: its feed not live, a runner not read lately,
        # a rotation it has not heard of.
        if self._records is None:
            return self._registry.get_runner(runner_id)
        held = self._records.find(runner_id)
        if held is not None and credential_matches(secret, held.secret_hash):
            return held
        mark = self._records.mark()
        runner = self._registry.get_runner(runner_id)
        if runner is not None:
            self._records.keep(runner, mark)
        return runner

    def register(self, body: RegisterBody) -> Registered:
        """Exchange a single-use registration token for a new runner's id and secret."""
        now = self._clock.now()
        if not self._registry.consume_registration_token(hash_credential(body.token), at=now):
            raise Unauthorized(
                "registration token is unknown, expired or already used; mint a new one with "
                "`looprelay runners token`"
            )
        secret = new_runner_secret()
        runner = RunnerRecord(
            runner_id=new_runner_id(),
            name=body.name,
            labels=body.labels,
            secret_hash=hash_credential(secret),
            registered_at=now,
            last_seen_at=None,  # heard from once its agent runs: until then it is not live
            version=body.version,
            capacity=body.capacity,
        )
        self._registry.add_runner(runner)
        self._event("runner.registered", runner, {"name": runner.name, "labels": runner.labels})
        log.info("runner %s registered", runner.name, extra={"runner_id": runner.runner_id})
        return Registered(runner_id=runner.runner_id, secret=secret, name=runner.name)

    def heartbeat(self, runner: RunnerRecord, body: HeartbeatBody) -> HeartbeatHints:
        """Record that ``runner`` is alive and what it serves; settle the sessions it reports
        released, held elsewhere, lost to a restart, or exited (``service.hosted``). Raises
        ``Conflict`` for a second live agent on ``runner``'s credentials (``core.identity``)."""
        now = self._clock.now()
        lost_after = timedelta(seconds=self._config.lost_after_seconds)
        self._one_agent(runner, agent_id=body.agent_id, replaces=body.replaces, now=now)
        status = RunnerStatus(
            version=body.version,
            # Sessions the runner may hold are set at registration (`runner register
            # --capacity`); a heartbeat that does not name them leaves them as registered.
            capacity=body.capacity if "capacity" in body.model_fields_set else runner.capacity,
            repositories=tuple(body.repositories),
            workspace=body.workspace,
            sessions=body.sessions,
            agent_id=body.agent_id or runner.agent_id,
            hostname=body.hostname or runner.hostname,
            harnesses=tuple(body.harnesses)
            if "harnesses" in body.model_fields_set
            else tuple(runner.harnesses),
        )
        changed = reports_new_status(runner, status)
        if not changed:
            # Authentication has just refused a revoked runner: no need to read it again.
            self._registry.record_alive(runner.runner_id, at=now)
        elif not self._registry.record_heartbeat(runner.runner_id, at=now, status=status):
            raise Unauthorized(f"runner {runner.name} was revoked; {_REGISTER_AGAIN}")
        released, moved = 0, []
        if self._failover is not None:
            self._failover.note_released(runner, body.released)
            released = self._failover.release_leases(runner) if body.restarted else 0
            moved = self._failover.moved(runner, body.held)
        if self._hosted is not None:
            # An idle runner's heartbeat is looked at only when it comes back (restarted, or
            # silent past lostAfterSeconds) or reports a change: else it reads nothing.
            back = body.restarted or not is_live(runner, now=now, lost_after=lost_after)
            self._hosted.settle(runner, body.held, held_all=body.held_all, changed=changed or back)
        return HeartbeatHints(
            heartbeat_seconds=self._config.heartbeat_seconds,
            lost_after_seconds=self._config.lost_after_seconds,
            moved=moved,
            released_leases=released,
        )

    def admit_poll(self, runner: RunnerRecord, body: PollBody) -> None:
        """Refuse (``Conflict``) a poll of an agent other than the one ``runner``'s last
        heartbeat named while that one is live; the record the cache held is read again
        first (a restart's first heartbeat may not have reached it)."""
        if not body.agent_id or body.agent_id == runner.agent_id or not runner.agent_id:
            return
        fresh = self._registry.get_runner(runner.runner_id) or runner
        self._one_agent(fresh, agent_id=body.agent_id, replaces="", now=self._clock.now())

    def _one_agent(
        self, runner: RunnerRecord, *, agent_id: str, replaces: str, now: datetime
    ) -> None:
        lost_after = timedelta(seconds=self._config.lost_after_seconds)
        if second_agent(
            runner, agent_id=agent_id, replaces=replaces, now=now, lost_after=lost_after
        ):
            self._event("runner.second_agent_refused", runner, {"agent_id": agent_id})
            raise Conflict(second_agent_message(runner, lost_after=lost_after))

    def rotate(self, runner: RunnerRecord) -> Rotated:
        """Replace ``runner``'s secret; the old one stops working."""
        secret = new_runner_secret()
        if not self._registry.rotate_runner_secret(
            runner.runner_id, secret_hash=hash_credential(secret)
        ):
            raise Unauthorized(f"runner {runner.name} was revoked; {_REGISTER_AGAIN}")
        self._event("runner.rotated", runner, {"by": "runner"})
        return Rotated(runner_id=runner.runner_id, secret=secret)

    def deregister(self, runner: RunnerRecord) -> Deregistered:
        """The runner removes itself (``looprelay runner remove``): revoked as an operator's
        ``runners revoke`` would, so a copy of its credentials left anywhere is worthless."""
        if not self._registry.revoke_runner(runner.runner_id, at=self._clock.now()):
            raise Unauthorized(f"runner {runner.name} was revoked; {_REGISTER_AGAIN}")
        self._event("runner.deregistered", runner, {"name": runner.name})
        log.info("runner %s deregistered", runner.name, extra={"runner_id": runner.runner_id})
        return Deregistered(runner_id=runner.runner_id)

    def work_desk(self) -> LeaseDesk:
        """The lease desk; ``NotFound`` on a server that hands out no work."""
        if self._desk is None:
            raise NotFound("this server hands out no work")
        return self._desk

    def renew(self, runner: RunnerRecord, body: RenewBody) -> Renewed:
        """Extend the lease ``runner`` holds on a dispatch being applied."""
        until = self.work_desk().renew(runner, body)
        return Renewed(lease_expires_at=until.isoformat())

    def results(self, runner: RunnerRecord, body: ResultBody) -> Reported:
        """Record what ``runner`` did with a dispatch it leased."""
        return Reported(status=self.work_desk().report(runner, body))

    def session_token(self, runner: RunnerRecord, body: SessionTokenBody) -> SessionToken:
        """Mint the token of the session whose dispatch ``runner`` holds
        (``SessionComments.issue_token``); ``NotFound`` on a server without sessions."""
        return self._session_desk().issue_token(runner, body)

    def session_comment(
        self, authorization: str, body: SessionCommentBody, *, ask: bool
    ) -> SessionPosted:
        """Post what a session says (``SessionComments.post``); ``NotFound`` on a server
        without sessions."""
        return self._session_desk().post(authorization, body, ask=ask)

    def _session_desk(self) -> SessionComments:
        if self._sessions is None:
            raise NotFound("this server serves no sessions")
        return self._sessions

    def _event(self, name: str, runner: RunnerRecord, data: dict[str, object]) -> None:
        self._store.append_event(
            EventRecord(
                name=name, at=self._clock.now(), data={"runner_id": runner.runner_id, **data}
            )
        )


def mint_registration_token(registry: RunnerRegistry, *, now: datetime, ttl: timedelta) -> str:
    """Create a single-use registration token valid for ``ttl``; only its hash is stored.

    Returns the token, to be shown to the operator once.
    """
    token = new_registration_token()
    registry.add_registration_token(
        RegistrationToken(token_hash=hash_credential(token), created_at=now, expires_at=now + ttl)
    )
    return token
