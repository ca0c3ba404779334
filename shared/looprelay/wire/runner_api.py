"""The runner API's request and answer bodies, and its endpoint table (``/runner/v1/...``).

One table (:data:`ENDPOINTS`) says which bodies each endpoint takes and which answers it gives;
the handlers route by it and ``schema/runner-api.openapi.json`` is generated from it, so the
document and the server cannot disagree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from looprelay.config.model import MAX_POLL_WAIT_SECONDS
from looprelay.core.model import (
    DISPATCH_KINDS,
    MAX_DETAIL_CHARS,
    MAX_PROMPT_CHARS,
    MAX_RUNNER_LABELS,
    DispatchRecord,
)
from looprelay.core.replies import MAX_REPLY_CHARS
from looprelay.wire.sessions import (
    SESSION_ENV,
    SessionCommentBody,
    SessionPosted,
    SessionToken,
    SessionTokenBody,
)
from looprelay.wire.strict import StrictBody as _Body

__all__ = [  # what a runner and a session need of the domain and of wire.sessions
    "DISPATCH_KINDS",
    "MAX_DETAIL_CHARS",
    "SESSION_ENV",
    "SessionCommentBody",
    "SessionPosted",
    "SessionToken",
    "SessionTokenBody",
]

API_PREFIX = "/runner/v1/"
MAX_BODY_BYTES = 1024 * 1024
"""Largest request body: a result's reply of ``MAX_REPLY_CHARS`` characters JSON-escaped as
``\\uXXXX`` pairs (12 bytes each, as Python's and requests' encoders write them) fits."""
# Each pattern is also stated in the OpenAPI document; checked with fullmatch, since re's "$"
# would let a trailing newline through where JSON Schema's does not.
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$"
_REPOSITORY_PATTERN = r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$"
_AGENT_ID_PATTERN = r"^([A-Za-z0-9_-]{1,64})?$"
_NAME = re.compile(_NAME_PATTERN)
_LABEL_PART = re.compile(_LABEL_PATTERN)
_REPOSITORY = re.compile(_REPOSITORY_PATTERN)


def _whole(value: object) -> object:
    # JSON Schema's "integer" includes 2.0, which strict parsing alone would refuse.
    return int(value) if isinstance(value, float) and value.is_integer() else value


_Whole = Annotated[int, BeforeValidator(_whole)]


class RegisterBody(_Body):
    """What an agent sends to exchange a registration token for credentials."""

    token: str = Field(min_length=1, max_length=200)
    name: str = Field(json_schema_extra={"pattern": _NAME_PATTERN})
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_RUNNER_LABELS,
        json_schema_extra={
            "propertyNames": {"pattern": _LABEL_PATTERN},
            "additionalProperties": {"type": "string", "pattern": _LABEL_PATTERN},
        },
    )
    version: str = Field(default="", max_length=64)
    capacity: _Whole = Field(default=1, ge=1, le=256)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _NAME.fullmatch(name):
            raise ValueError("name must be 1-63 of A-Z a-z 0-9 . _ - starting alphanumeric")
        return name

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not (_LABEL_PART.fullmatch(key) and _LABEL_PART.fullmatch(value)):
                raise ValueError(f"label {key[:64]!r} must be k=v of A-Z a-z 0-9 . _ / -")
        return labels


_SESSION_NAME_PATTERN = r"^loop-[A-Za-z0-9_-]{1,80}$"
MAX_HELD_SESSIONS = 1_000
"""Most sessions one heartbeat may name (held, or released after they moved away)."""


HarnessState = Literal["", "running", "exited", "idle"]
"""What a hosted session's harness is doing (``core.status`` words it for people): ``running``
(its process is alive), ``exited`` (its process ended, or its tmux session is gone), ``idle``
(a headless session between turns: nothing runs); "" from an agent that does not say."""
MAX_LAST_LINES_CHARS = 2000


class HeldSession(_Body):
    """A session the runner hosts, as its local ledger knows it, and its harness's state."""

    work_item: str = Field(min_length=1, max_length=300)
    endpoint: str = Field(min_length=1, max_length=300)
    session_name: str = Field(pattern=_SESSION_NAME_PATTERN)
    harness: HarnessState = Field(
        default="",
        description="The harness's state as the runner saw it for this heartbeat: running, "
        "exited (its process ended or its tmux session is gone), idle (headless, between "
        "turns); empty: not reported.",
    )
    exit_status: _Whole | None = Field(
        default=None, description="An exited harness's exit status, when known."
    )
    exited_at: datetime | None = Field(
        default=None, description="When an exited harness ended, as the runner knows it."
    )
    last_lines: str = Field(
        default="",
        max_length=MAX_LAST_LINES_CHARS,
        description="An exited harness's last screen lines (its own words on why).",
    )


class ReleasedSession(HeldSession):
    """A session the runner stopped because it had moved to another runner, and how."""

    outcome: str = Field(default="", max_length=300)


class HeartbeatBody(_Body):
    """What an agent reports about itself on every heartbeat."""

    version: str = Field(default="", max_length=64)
    hostname: str = Field(
        default="",
        max_length=253,
        pattern=r"^[A-Za-z0-9._-]*$",
        description="The machine the agent runs on, shown on the operator's status page.",
    )
    capacity: _Whole = Field(default=1, ge=0, le=256)
    repositories: list[str] = Field(
        default_factory=list,
        max_length=200,
        json_schema_extra={"items": {"type": "string", "pattern": _REPOSITORY_PATTERN}},
    )
    harnesses: list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,39}$")]] = Field(
        default_factory=list,
        max_length=20,
        description="The coding-agent CLIs the agent can run (`claude`, `codex`...): work "
        "for another harness is never given to it. Not sent: any.",
    )
    workspace: bool = False
    sessions: _Whole = Field(default=0, ge=0, le=10_000)
    restarted: bool = Field(
        default=False,
        description="True on an agent process's first heartbeat: the leases this runner "
        "holds belong to a process that is gone, so the server offers them again at once.",
    )
    held: list[HeldSession] = Field(
        default_factory=list,
        max_length=MAX_HELD_SESSIONS,
        description="The sessions the runner hosts; the answer names those that moved away. "
        "A harness exit is named once, on the first heartbeat the server answers after it.",
    )
    held_all: bool = Field(
        default=False,
        description="True: held names every session the runner hosts (an empty list: none), "
        "so a session the server believes live on it and not named is gone and its slot free.",
    )
    released: list[ReleasedSession] = Field(
        default_factory=list,
        max_length=MAX_HELD_SESSIONS,
        description="Sessions the runner stopped since its last heartbeat because the "
        "server said they moved to another runner.",
    )
    agent_id: str = Field(
        default="",
        max_length=64,
        pattern=_AGENT_ID_PATTERN,
        description="This agent process's id, new at each start. While another agent's id "
        "is on record and that agent is live, the heartbeat is refused (409): one agent per "
        "runner's credentials.",
    )
    replaces: str = Field(
        default="",
        max_length=64,
        pattern=_AGENT_ID_PATTERN,
        description="The id of the agent that used this state directory before (it held "
        "the directory's lock, so it is gone): a restart is accepted at once.",
    )

    @field_validator("repositories")
    @classmethod
    def _repositories(cls, repositories: list[str]) -> list[str]:
        for repository in repositories:
            if not _REPOSITORY.fullmatch(repository):
                raise ValueError(f"{repository[:100]!r} is not owner/repo")
        return repositories


class PollBody(_Body):
    """A long poll for work."""

    wait_seconds: float = Field(
        default=25.0,
        ge=0,
        le=MAX_POLL_WAIT_SECONDS,
        description="Longest the poll may be held; the server holds it at most its "
        "`runners.pollWaitSeconds`.",
    )
    agent_id: str = Field(
        default="",
        max_length=64,
        pattern=_AGENT_ID_PATTERN,
        description="The polling agent process's id (as on its heartbeats); a poll of an "
        "agent other than the one on record is refused (409).",
    )


class RenewBody(_Body):
    """Keep a lease while the dispatch is being applied."""

    dispatch_id: str = Field(min_length=1, max_length=100)


AgentEventName = Literal[
    "workspace.prepared",
    "workspace.cleaned",
    "workspace.trusted",
    "workspace.trust_failed",
    "workspace.untrusted_config_restored",
    "skill.installed",
    "skill.install_failed",
    "session.id_replaced",
    "session.sandboxed",
]
"""Events a runner may report with a result; the server logs each beside the dispatch's own."""
MAX_AGENT_EVENTS = 16
MAX_AGENT_EVENT_VALUE_CHARS = 300


_EventKey = Annotated[str, Field(max_length=40)]
_EventValue = Annotated[str, Field(max_length=MAX_AGENT_EVENT_VALUE_CHARS)]


class AgentEvent(_Body):
    """Something the runner did while applying a dispatch (a tree prepared, a folder trusted)."""

    name: AgentEventName
    data: dict[_EventKey, _EventValue] = Field(default_factory=dict, max_length=8)


class ResultBody(_Body):
    """What the runner did with a dispatch it leased."""

    dispatch_id: str = Field(min_length=1, max_length=100)
    status: Literal["spawned", "delivered", "done", "failed"]
    reason: str = Field(default="", max_length=100)
    retryable: bool = False
    detail: str = Field(default="", max_length=2000)
    session_id: str | None = Field(default=None, max_length=100)
    tmux_target: str | None = Field(default=None, pattern=r"^loop-[A-Za-z0-9_-]{1,80}$")
    tmux_socket: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    resumed: bool = False
    reply: str = Field(
        default="",
        max_length=MAX_REPLY_CHARS,
        description="A headless turn's answer, or a short note that it failed, for the server "
        "to post on the work item (or its pull request); empty: nothing to post.",
    )
    events: list[AgentEvent] = Field(default_factory=list, max_length=MAX_AGENT_EVENTS)


class EmptyBody(_Body):
    """No fields."""


class Registered(BaseModel):
    """The credentials a registration buys; the secret is shown this once."""

    runner_id: str
    secret: str
    name: str


class MovedSession(BaseModel):
    """A session the runner still hosts that now lives on another runner (it was declared
    lost meanwhile): its harness must stop."""

    work_item: str
    endpoint: str
    session_name: str
    runner_id: str
    """The runner the session lives on now."""


class HeartbeatHints(BaseModel):
    """How often the server wants to hear from the runner, and what changed while it was
    away."""

    heartbeat_seconds: int
    lost_after_seconds: int
    moved: list[MovedSession] = Field(default_factory=list)
    released_leases: int = 0
    """Leases of a restarted runner's earlier process offered again by this heartbeat."""


class Rotated(BaseModel):
    """A runner's new secret; the old one stops working now."""

    runner_id: str
    secret: str


class Deregistered(BaseModel):
    """A runner removed at its own request: its credentials stop working now."""

    runner_id: str


class DispatchHead(BaseModel):
    """A pull request session's tree: ``fork`` heads are untrusted and run only at the
    approved ``sha``, with agent config restored from ``base_ref`` (see ``docs/security.md``)."""

    model_config = ConfigDict(frozen=True)

    fork: bool
    sha: str = ""
    base_ref: str = ""


class Dispatch(BaseModel):
    """One thing a runner must do for one session, as the runner receives it.

    The store's record (``core.model.DispatchRecord``) also holds what only the server needs:
    status, results, GitHub's ids. The agent imports this type, never the store's.
    """

    model_config = ConfigDict(frozen=True)

    dispatch_id: str
    delivery_id: str
    work_item: str
    endpoint: str
    seq: int
    kind: str
    repository: str
    session_name: str
    session_id: str
    harness: str = "claude"
    runner_kind: str = "tmux"
    interaction: str = "work-item"
    prompt: str = Field(default="", max_length=MAX_PROMPT_CHARS)
    boot_prompt: str = Field(default="", max_length=MAX_PROMPT_CHARS)
    """For a deliver: what a fresh harness starts with when the session's harness is gone and
    its conversation cannot be resumed; "": the prompt. An older agent ignores it."""
    labels: dict[str, str] = Field(default_factory=dict)
    resume: bool = False
    """For a spawn: resume the conversation ``session_id`` names (a respawn), else start it."""
    closing: bool = False
    """For a cleanup: the work item closed (a runner may keep its checkout on close)."""
    head: DispatchHead | None = None
    """For a pull request's own session: its tree's source and trust; None for a work item's
    session. A runner refuses a pull request session without one (fail closed)."""
    runner_id: str | None = None
    attempts: int = 0
    lease_expires_at: datetime | None = None
    created_at: datetime

    @classmethod
    def from_record(cls, record: DispatchRecord) -> Dispatch:
        """The runner's view of the store's ``record``."""
        return cls.model_validate(record.model_dump(include=set(cls.model_fields)))


class Leased(BaseModel):
    """A dispatch now leased to the polling runner."""

    dispatch: Dispatch


class Renewed(BaseModel):
    """The new end of the lease."""

    lease_expires_at: str


class Reported(BaseModel):
    """What the server made of a result: ``succeeded``, ``failed`` or ``pending`` (offered
    again)."""

    status: str


class ErrorAnswer(BaseModel):
    """Every refusal: what is wrong and what to do."""

    error: str


@dataclass(frozen=True)
class Endpoint:
    """One ``POST /runner/v1/<name>`` endpoint."""

    summary: str
    body: type[BaseModel]
    answers: Mapping[int, type[BaseModel] | None]
    security: str = "runnerSecret"
    """``runnerSecret``, ``sessionToken`` (a session's own token), or "" (none)."""
    errors: tuple[int, ...] = field(default=(400, 401, 413, 503))


ENDPOINTS: Mapping[str, Endpoint] = {
    "register": Endpoint(
        "Exchange a registration token for a runner id and secret.",
        RegisterBody,
        {201: Registered},
        security="",
    ),
    "heartbeat": Endpoint(
        "Report liveness, capacity and what the runner serves.",
        HeartbeatBody,
        {200: HeartbeatHints},
        errors=(400, 401, 409, 413, 503),  # 409: another live agent serves this runner
    ),
    "rotate": Endpoint("Replace this runner's secret.", EmptyBody, {200: Rotated}),
    "deregister": Endpoint(
        "Remove this runner: its credentials stop working, as if an operator revoked it.",
        EmptyBody,
        {200: Deregistered},
    ),
    "poll": Endpoint(
        "Long-poll for the next dispatch this runner may take; leases it.",
        PollBody,
        {200: Leased, 204: None},
        errors=(400, 401, 409, 413, 503),  # 409: another live agent serves this runner
    ),
    "renew": Endpoint(
        "Extend the lease of a dispatch being applied.",
        RenewBody,
        {200: Renewed},
        errors=(400, 401, 409, 413, 503),
    ),
    "results": Endpoint(
        "Report what the runner did with a leased dispatch.",
        ResultBody,
        {200: Reported},
        errors=(400, 401, 404, 409, 413, 503),
    ),
    "session-token": Endpoint(
        "Mint the token a session's harness speaks with (only its hash is kept).",
        SessionTokenBody,
        {201: SessionToken},
        errors=(400, 401, 404, 409, 413, 503),  # 409: the lease is not this runner's
    ),
    "session-comment": Endpoint(
        "Post a session's comment on its work item or pull request, as the App.",
        SessionCommentBody,
        {201: SessionPosted},
        security="sessionToken",
        errors=(400, 401, 404, 413, 502, 503),  # 404: the server has no GitHub client
    ),
    "session-ask": Endpoint(
        "Post a session's question and mark the session awaiting input until a human answers.",
        SessionCommentBody,
        {201: SessionPosted},
        security="sessionToken",
        errors=(400, 401, 404, 413, 502, 503),
    ),
}


def runner_bearer(runner_id: str, secret: str) -> str:
    """Return the ``Authorization`` header value a runner sends (``service.runner_secrets``
    parses it)."""
    return f"Bearer {runner_id}:{secret}"
