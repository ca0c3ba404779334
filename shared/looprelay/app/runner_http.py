"""The runner API's HTTP face: ``POST /runner/v1/<name>`` to one ``RunnerApi`` method.

Here a request's path picks the operation, its bearer header and JSON body become the
runner and the ``wire.runner_api`` body the service takes, and the service's answer or error
becomes the status and JSON body ``schema/runner-api.openapi.json`` documents. ``app.longpoll``
serves it on the event loop, in ``looprelay up`` and in the cloud's runners function alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from looprelay.app.messages import Request, Response, json_response
from looprelay.core.model import DispatchRecord, RunnerRecord
from looprelay.errors import BadDelivery, Conflict, NotFound, Transient, Unauthorized
from looprelay.logsampling import LogSampler
from looprelay.service.runners import RunnerApi, leased
from looprelay.wire.runner_api import (
    API_PREFIX,
    ENDPOINTS,
    MAX_BODY_BYTES,
    EmptyBody,
    HeartbeatBody,
    PollBody,
    RegisterBody,
    RenewBody,
    ResultBody,
    SessionCommentBody,
    SessionTokenBody,
)

log = logging.getLogger("looprelay.service.runners")

NOTHING_TO_LEASE = Response(status=204, body=b"")
"""A poll's answer when nothing came within its wait."""

_M = TypeVar("_M", bound=BaseModel)


def parse_body(request: Request, model: type[_M]) -> _M:
    """``request``'s JSON body as ``model`` (an empty body is ``{}``); ``BadDelivery`` (413
    or 400) naming at most five problems when it is too large or does not fit."""
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


def answer(endpoint: str, result: BaseModel | None) -> Response:
    """The service's ``result`` for ``endpoint`` with the status the endpoint table gives
    its type (None: the answer without a body, a poll's 204)."""
    if result is None:
        return NOTHING_TO_LEASE
    status = next(
        code for code, model in ENDPOINTS[endpoint].answers.items() if model is type(result)
    )
    return json_response(status, result.model_dump(mode="json"))


def lease_answer(dispatch: DispatchRecord | None) -> Response:
    """A poll's answer: 200 with the dispatch leased to the runner, 204 without one."""
    return answer("poll", leased(dispatch))


def _runner(api: RunnerApi, request: Request) -> RunnerRecord:
    return api.authenticate(request.headers.get("authorization", ""))


def _worker(api: RunnerApi, request: Request) -> RunnerRecord:
    """The runner calling an endpoint of the lease desk: checked before its body is, so a
    server without work answers 404 whatever the body."""
    runner = _runner(api, request)
    api.work_desk()
    return runner


def _register(api: RunnerApi, request: Request) -> BaseModel | None:
    return api.register(parse_body(request, RegisterBody))


def _heartbeat(api: RunnerApi, request: Request) -> BaseModel | None:
    runner = _runner(api, request)
    return api.heartbeat(runner, parse_body(request, HeartbeatBody))


def _rotate(api: RunnerApi, request: Request) -> BaseModel | None:
    runner = _runner(api, request)
    parse_body(request, EmptyBody)
    return api.rotate(runner)


def _deregister(api: RunnerApi, request: Request) -> BaseModel | None:
    runner = _runner(api, request)
    parse_body(request, EmptyBody)
    return api.deregister(runner)


def _admitted_poll(api: RunnerApi, request: Request) -> tuple[RunnerRecord, PollBody]:
    """A poll's runner and body, checked (``Unauthorized``, ``NotFound`` on a server without
    work, ``BadDelivery``, ``Conflict`` for a second agent)."""
    runner = _worker(api, request)
    body = parse_body(request, PollBody)
    api.admit_poll(runner, body)
    return runner, body


def _poll(api: RunnerApi, request: Request) -> BaseModel | None:
    # One look, never a wait: ``app.longpoll`` serves polls, waiting on the event loop
    # between looks; this answers a call that reaches the handler itself.
    runner, _body = _admitted_poll(api, request)
    return leased(api.work_desk().try_lease(runner))


def _renew(api: RunnerApi, request: Request) -> BaseModel | None:
    runner = _worker(api, request)
    return api.renew(runner, parse_body(request, RenewBody))


def _results(api: RunnerApi, request: Request) -> BaseModel | None:
    runner = _worker(api, request)
    return api.results(runner, parse_body(request, ResultBody))


def _session_token(api: RunnerApi, request: Request) -> BaseModel | None:
    runner = _runner(api, request)
    return api.session_token(runner, parse_body(request, SessionTokenBody))


def _session_says(ask: bool) -> Callable[[RunnerApi, Request], BaseModel | None]:
    """A session endpoint: its caller is the session its token names, not a runner."""

    def operation(api: RunnerApi, request: Request) -> BaseModel | None:
        body = parse_body(request, SessionCommentBody)
        return api.session_comment(request.headers.get("authorization", ""), body, ask=ask)

    return operation


_OPERATIONS: dict[str, Callable[[RunnerApi, Request], BaseModel | None]] = {
    "register": _register,
    "heartbeat": _heartbeat,
    "rotate": _rotate,
    "deregister": _deregister,
    "poll": _poll,
    "renew": _renew,
    "results": _results,
    "session-token": _session_token,
    "session-comment": _session_says(ask=False),
    "session-ask": _session_says(ask=True),
}
# The documented table and the operations must name the same endpoints.
assert _OPERATIONS.keys() == ENDPOINTS.keys()


class RunnerHttp:
    """Answers ``/runner/v1/...`` requests with ``api``; one instance serves many threads."""

    def __init__(self, api: RunnerApi) -> None:
        self._api = api
        self._refusals = LogSampler()  # unauthenticated noise must not fill a disk

    def handle(self, request: Request) -> Response:
        """Answer one runner API request, a poll waiting on this thread; never raises."""
        name = request.path.removeprefix(API_PREFIX)
        operation = _OPERATIONS.get(name)
        if not request.path.startswith(API_PREFIX) or operation is None:
            return json_response(404, {"error": "no such runner API path"})
        if request.method != "POST":
            return json_response(405, {"error": "only POST is accepted here"})
        return self._answer(lambda: answer(name, operation(self._api, request)))

    def admit_poll(self, request: Request) -> Response | tuple[RunnerRecord, PollBody]:
        """A poll's checks without its wait: the runner and body to poll for, or the final
        answer (401, 404, 422, 503...) when it is refused. Never raises.

        ``app.longpoll`` uses it with ``LeaseDesk.try_lease`` to wait without a thread;
        :meth:`handle` answers a poll with one look and no wait.
        """
        if request.method != "POST":
            return json_response(405, {"error": "only POST is accepted here"})
        admitted: list[tuple[RunnerRecord, PollBody]] = []

        def admit() -> Response:
            admitted.append(_admitted_poll(self._api, request))
            return NOTHING_TO_LEASE

        refused = self._answer(admit)
        return admitted[0] if admitted else refused

    def _answer(self, operation: Callable[[], Response]) -> Response:
        """``operation``'s response, or the refusal its error earns."""
        try:
            return operation()
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
