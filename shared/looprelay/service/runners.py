"""The runner API (``/runner/v1/...``): how runner agents register and stay known.

Runners call out only (no inbound port on their side). Every call but ``register`` carries
``Authorization: Bearer <runner_id>:<secret>``; an unknown, wrong or revoked credential gets 401
with a message telling the operator to register again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from looprelay.app.messages import Request, Response, json_response
from looprelay.config.model import RunnersConfig
from looprelay.core.model import DispatchRecord, EventRecord, RegistrationToken, RunnerRecord
from looprelay.errors import BadDelivery, Conflict, NotFound, Transient, Unauthorized
from looprelay.failover import Failover
from looprelay.logsampling import LogSampler
from looprelay.ports import Clock, RunnerRegistry, RunnerStatus, Store
from looprelay.service.lease_desk import LeaseDesk
from looprelay.service.runner_secrets import (
    credential_matches,
    hash_credential,
    new_registration_token,
    new_runner_id,
    new_runner_secret,
    parse_runner_bearer,
)
from looprelay.wire.runner_api import (
    API_PREFIX,
    ENDPOINTS,
    MAX_BODY_BYTES,
    Deregistered,
    Dispatch,
    EmptyBody,
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
)

log = logging.getLogger("looprelay.service.runners")

_REGISTER_AGAIN = "register it again with `looprelay runner register`"
NOTHING_TO_LEASE = Response(status=204, body=b"")
"""A poll's answer when nothing came within its wait."""


def lease_answer(leased: DispatchRecord | None) -> Response:
    """A poll's answer: 200 with the dispatch ``leased`` to the runner, 204 without one."""
    if leased is None:
        return NOTHING_TO_LEASE
    answer = Leased(dispatch=Dispatch.from_record(leased))
    return json_response(200, answer.model_dump(mode="json"))


class RunnerApi:
    """Serves ``/runner/v1/...``; one instance serves many requests and threads."""

    def __init__(
        self,
        *,
        registry: RunnerRegistry,
        store: Store,
        clock: Clock,
        config: RunnersConfig,
        desk: LeaseDesk | None = None,
    ) -> None:
        """``desk`` serves poll/renew/results; without it only registration is served."""
        self._registry = registry
        self._desk = desk
        self._failover = (
            Failover(work_items=desk.work_items, store=store, clock=clock, waker=desk.waker)
            if desk is not None
            else None
        )
        self._store = store
        self._clock = clock
        self._config = config
        self._refusals = LogSampler()  # unauthenticated noise must not fill a disk
        self._routes: dict[str, Callable[[Request], Response]] = {
            "register": self._register,
            "heartbeat": self._heartbeat,
            "rotate": self._rotate,
            "deregister": self._deregister,
            "poll": self._poll,
            "renew": self._renew,
            "results": self._results,
        }
        # The documented table and the handlers must name the same endpoints.
        assert self._routes.keys() == ENDPOINTS.keys()

    def handle(self, request: Request) -> Response:
        """Answer one runner API request; never raises."""
        route = self._routes.get(request.path.removeprefix(API_PREFIX))
        if not request.path.startswith(API_PREFIX) or route is None:
            return json_response(404, {"error": "no such runner API path"})
        if request.method != "POST":
            return json_response(405, {"error": "only POST is accepted here"})
        return self._answer(lambda: route(request))

    @property
    def desk(self) -> LeaseDesk | None:
        """The lease desk serving poll, renew and results, if any."""
        return self._desk

    def admit_poll(self, request: Request) -> Response | tuple[RunnerRecord, PollBody]:
        """A poll's checks without its wait: the runner and body to poll for, or the final
        answer (401, 404, 422, 503...) when it is refused. Never raises.

        A server that waits without a thread (``app.longpoll``) uses it with
        ``LeaseDesk.try_lease``; :meth:`handle` serves the same poll on one thread.
        """
        if request.method != "POST":
            return json_response(405, {"error": "only POST is accepted here"})
        admitted: list[tuple[RunnerRecord, PollBody]] = []

        def admit() -> Response:
            runner = self._authenticate(request)
            self._work_desk()
            admitted.append((runner, _parse(request, PollBody)))
            return NOTHING_TO_LEASE

        refused = self._answer(admit)
        return admitted[0] if admitted else refused

    def _answer(self, route: Callable[[], Response]) -> Response:
        try:
            return route()
        except BadDelivery as exc:
            return json_response(exc.status, {"error": str(exc)})
        except NotFound as exc:
            return json_response(404, {"error": str(exc)})
        except Conflict as exc:
            return json_response(409, {"error": str(exc)})
        except Unauthorized as exc:
            self._refusals.warning(
                log,
                exc.status,
                "runner API refused: %s",
                exc,
                kind=f"runner API refusals with status {exc.status}",
            )
            return json_response(exc.status, {"error": str(exc)})
        except Transient as exc:
            log.error("runner API store failure: %s", exc)
            return json_response(503, {"error": "temporarily unavailable; retry"})

    def _register(self, request: Request) -> Response:
        body = _parse(request, RegisterBody)
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
        answer = Registered(runner_id=runner.runner_id, secret=secret, name=runner.name)
        return json_response(201, answer.model_dump())

    def _heartbeat(self, request: Request) -> Response:
        runner = self._authenticate(request)
        body = _parse(request, HeartbeatBody)
        status = RunnerStatus(
            version=body.version,
            # Sessions the runner may hold are set at registration (`runner register
            # --capacity`); a heartbeat that does not name them leaves them as registered.
            capacity=body.capacity if "capacity" in body.model_fields_set else runner.capacity,
            repositories=tuple(body.repositories),
            workspace=body.workspace,
            sessions=body.sessions,
        )
        if not self._registry.record_heartbeat(
            runner.runner_id, at=self._clock.now(), status=status
        ):
            raise Unauthorized(f"runner {runner.name} was revoked; {_REGISTER_AGAIN}")
        released, moved = 0, []
        if self._failover is not None:
            self._failover.note_released(runner, body.released)
            released = self._failover.release_leases(runner) if body.restarted else 0
            moved = self._failover.moved(runner, body.held)
        hints = HeartbeatHints(
            heartbeat_seconds=self._config.heartbeat_seconds,
            lost_after_seconds=self._config.lost_after_seconds,
            moved=moved,
            released_leases=released,
        )
        return json_response(200, hints.model_dump())

    def _rotate(self, request: Request) -> Response:
        runner = self._authenticate(request)
        _parse(request, EmptyBody)
        secret = new_runner_secret()
        if not self._registry.rotate_runner_secret(
            runner.runner_id, secret_hash=hash_credential(secret)
        ):
            raise Unauthorized(f"runner {runner.name} was revoked; {_REGISTER_AGAIN}")
        self._event("runner.rotated", runner, {"by": "runner"})
        return json_response(200, Rotated(runner_id=runner.runner_id, secret=secret).model_dump())

    def _deregister(self, request: Request) -> Response:
        """The runner removes itself (``looprelay runner remove``): revoked as an operator's
        ``runners revoke`` would, so a copy of its credentials left anywhere is worthless."""
        runner = self._authenticate(request)
        _parse(request, EmptyBody)
        if not self._registry.revoke_runner(runner.runner_id, at=self._clock.now()):
            raise Unauthorized(f"runner {runner.name} was revoked; {_REGISTER_AGAIN}")
        self._event("runner.deregistered", runner, {"name": runner.name})
        log.info("runner %s deregistered", runner.name, extra={"runner_id": runner.runner_id})
        return json_response(200, Deregistered(runner_id=runner.runner_id).model_dump())

    def _work_desk(self) -> LeaseDesk:
        if self._desk is None:
            raise BadDelivery("this server hands out no work", status=404)
        return self._desk

    def _poll(self, request: Request) -> Response:
        runner = self._authenticate(request)
        return lease_answer(self._work_desk().poll(runner, _parse(request, PollBody)))

    def _renew(self, request: Request) -> Response:
        runner = self._authenticate(request)
        until = self._work_desk().renew(runner, _parse(request, RenewBody))
        return json_response(200, Renewed(lease_expires_at=until.isoformat()).model_dump())

    def _results(self, request: Request) -> Response:
        runner = self._authenticate(request)
        status = self._work_desk().report(runner, _parse(request, ResultBody))
        return json_response(200, Reported(status=status).model_dump())

    def _authenticate(self, request: Request) -> RunnerRecord:
        parsed = parse_runner_bearer(request.headers.get("authorization", ""))
        runner = self._registry.get_runner(parsed[0]) if parsed else None
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


_M = TypeVar("_M", bound=BaseModel)


def _parse(request: Request, model: type[_M]) -> _M:
    if len(request.body) > MAX_BODY_BYTES:
        raise BadDelivery(f"body larger than {MAX_BODY_BYTES} bytes", status=413)
    try:
        return model.model_validate_json(request.body or b"{}")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
            for e in exc.errors(include_input=False)[:5]
        )
        raise BadDelivery(f"invalid request body: {problems}") from exc
