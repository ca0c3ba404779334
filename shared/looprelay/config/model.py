"""The configuration: one pydantic model tree, the single list of options.

Loaded in one fixed order by :func:`load_config`: defaults, then the YAML file, then
``LOOPRELAY__section__key=value`` environment overrides. Secrets are referenced by the *name*
of an environment variable, so their values never appear in the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from looprelay.core.interaction import MODES
from looprelay.errors import ConfigError

ENV_OVERRIDE_PREFIX = "LOOPRELAY__"
GITHUB_MAX_PAYLOAD_BYTES = 25 * 1024 * 1024
"""GitHub never sends a payload above 25 MB (docs: webhook events and payloads)."""

DEFAULT_EVENTS = (
    "issues",
    "issue_comment",
    "pull_request",
    "pull_request_review",
    "pull_request_review_comment",
    "installation",
    "installation_repositories",
)
CI_EVENTS = ("check_run", "check_suite", "workflow_run", "status")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


_SECRET_SHAPES = re.compile(
    # GitHub's token prefixes (docs: "About authentication"), a classic 40-hex token, a PEM
    r"^(gh[pousr]_|github_pat_)|^[0-9a-fA-F]{40}$|-----BEGIN"
)


def _check_env_name(name: str) -> str:
    if _SECRET_SHAPES.search(name.strip()):
        # Never echoed: it is a secret pasted where the name of its variable belongs.
        raise ValueError(
            "this holds a NAME of a variable, and the value here looks like a token or key "
            "itself; put the secret in an environment variable (export NAME=...) and write "
            "NAME here"
        )
    if not _ENV_NAME.match(name):
        raise ValueError(
            f"{name!r} is not an environment-variable name; put the secret in an environment "
            "variable and write its name here, never the secret itself"
        )
    return name


# Owners: letters, digits, hyphens; repositories add "." and "_" ("." and ".." are not names).
REPOSITORY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/(?!\.\.?\Z)[A-Za-z0-9._-]{1,100}")


class PollConfig(_Section):
    """The poll ingress: GitHub's REST listings read on a schedule, no public URL needed
    (docs/polling.md)."""

    repositories: list[str] = Field(
        default_factory=list,
        description="Repositories (`owner/repo`) whose issues, pull requests, comments and "
        "reviews are polled, instead of or beside the webhook. Empty: no polling.",
    )
    interval_seconds: float = Field(
        default=30.0,
        ge=5,
        le=3600,
        description="Seconds between polls of each repository under `looprelay up` (the "
        "cloud's poller runs on `poller_schedule` in infra/).",
    )
    overlap_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="Each listing asks for changes since its cursor minus this much, so an "
        "item GitHub lists late is not missed; what is listed twice is deduplicated.",
    )

    @field_validator("repositories")
    @classmethod
    def _repository_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not REPOSITORY_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not owner/repo")
        return list(dict.fromkeys(names))


class GitHubConfig(_Section):
    """How looprelay talks to GitHub and proves deliveries came from it."""

    webhook_secrets: list[str] = Field(
        default_factory=list,
        description="Names of environment variables holding webhook secrets, primary first; "
        "older ones stay listed during a rotation. Empty under `looprelay up` means a secret "
        "generated in the data directory.",
    )
    api_url: str = Field(
        default="https://api.github.com",
        description="Base URL of the GitHub REST API (GitHub Enterprise: https://HOST/api/v3).",
    )
    app_id: int | None = Field(default=None, description="GitHub App id, for App auth.")
    private_key_env: str | None = Field(
        default=None, description="Environment variable holding the App's PEM private key."
    )
    private_key_file: str | None = Field(
        default=None,
        description="File holding the App's PEM private key (mode 0600), instead of "
        "`privateKeyEnv`; `looprelay app create` writes one into the data directory and names "
        "it in `github-app.yaml` there, which `looprelay up` reads beneath the config file.",
    )
    token_env: str | None = Field(
        default=None,
        description="Environment variable holding a token, instead of App auth (local use).",
    )
    poll: PollConfig = Field(
        default_factory=PollConfig, description="Polling GitHub instead of, or beside, the webhook."
    )

    @field_validator("webhook_secrets")
    @classmethod
    def _secret_names(cls, names: list[str]) -> list[str]:
        return [_check_env_name(name) for name in names]

    @field_validator("private_key_env", "token_env")
    @classmethod
    def _optional_name(cls, name: str | None) -> str | None:
        return None if name is None else _check_env_name(name)


class WebhookConfig(_Section):
    """The ingress function."""

    events: list[str] = Field(
        default_factory=lambda: list(DEFAULT_EVENTS),
        description="Events that are routed; any other event is acknowledged with 202 and "
        "recorded in the ledger as `ignored:event` (a ping as `pong`), never routed.",
    )
    ci_events: bool = Field(
        default=False,
        description="Also queue CI events (check_run, check_suite, workflow_run, status).",
    )
    max_body_bytes: int = Field(
        default=GITHUB_MAX_PAYLOAD_BYTES,
        gt=0,
        le=GITHUB_MAX_PAYLOAD_BYTES,
        description="Largest request body accepted; larger ones get 413.",
    )
    max_text_chars: int = Field(
        default=65_536,
        ge=256,
        le=200_000,
        description="Cap on each free-text field (comment, review or PR body) in the envelope.",
    )

    def allowed_events(self) -> frozenset[str]:
        """Return the events ingress queues."""
        return frozenset(self.events) | (frozenset(CI_EVENTS) if self.ci_events else frozenset())


class OidcConfig(_Section):
    """Who may call the worker in the cloud: the queue's OIDC identity."""

    service_account_email: str = Field(
        description="Service account Cloud Tasks signs its OIDC token as."
    )
    audience: str = Field(description="Audience of the token: the worker's URL.")
    platform_verifies_signature: bool = Field(
        default=False,
        description="Set only when Cloud Run's IAM invoker check guards the worker: Google "
        "then verifies the token itself and strips its signature, and looprelay checks the "
        "claims of such a token.",
    )


class WorkerConfig(_Section):
    """The worker function."""

    oidc: OidcConfig | None = Field(
        default=None,
        description="Verify Cloud Tasks OIDC tokens (required in the cloud). Unset under "
        "`looprelay up`, where a shared secret in the data directory is used.",
    )


class SqliteConfig(_Section):
    """The embedded store."""

    path: str | None = Field(
        default=None, description="Database file; default `looprelay.db` in the data directory."
    )


class FirestoreConfig(_Section):
    """The cloud store."""

    project: str | None = Field(
        default=None, description="Google Cloud project; default from the environment."
    )
    database: str = Field(default="(default)", description="Firestore database id.")
    collection_prefix: str = Field(
        default="", description="Prefix of every collection name, to share a database."
    )


class StoreConfig(_Section):
    """Where durable state lives."""

    backend: Literal["sqlite", "firestore"] = Field(
        default="sqlite", description="`sqlite` (embedded) or `firestore` (cloud)."
    )
    retention_days: int = Field(
        default=7,
        ge=3,
        description="Days ledger records and events are kept; at least GitHub's 3-day "
        "redelivery window.",
    )
    sqlite: SqliteConfig = Field(default_factory=SqliteConfig, description="SQLite settings.")
    firestore: FirestoreConfig = Field(
        default_factory=FirestoreConfig, description="Firestore settings."
    )


class RetryConfig(_Section):
    """How often and how late a failed task is tried again (Cloud Tasks' RetryConfig)."""

    max_attempts: int = Field(default=25, ge=1, description="Attempts before a dead letter.")
    min_backoff_seconds: float = Field(
        default=1.0, gt=0, description="Wait before the first retry."
    )
    max_backoff_seconds: float = Field(default=300.0, gt=0, description="Longest wait.")
    max_doublings: int = Field(
        default=16, ge=0, description="Times the wait doubles before growing linearly."
    )


class EmbeddedQueueConfig(_Section):
    """The SQLite-backed queue of `looprelay up`."""

    concurrency: int = Field(default=4, ge=1, le=64, description="Tasks dispatched at once.")
    dedup_window_seconds: int = Field(
        default=3600, ge=60, description="How long a finished task's name blocks a duplicate."
    )
    dispatch_deadline_seconds: float = Field(
        default=60.0, gt=0, description="How long one POST to the worker may take."
    )


class CloudTasksConfig(_Section):
    """Google Cloud Tasks."""

    project: str = Field(default="", description="Project of the queue.")
    location: str = Field(default="", description="Region of the queue.")
    queue: str = Field(default="looprelay", description="Queue name.")
    worker_url: str = Field(default="", description="URL of the worker function.")
    service_account_email: str = Field(
        default="", description="Identity whose OIDC token the queue attaches."
    )
    dispatch_deadline_seconds: int = Field(
        default=60, ge=15, le=1800, description="How long the queue waits for the worker."
    )
    api_endpoint: str | None = Field(
        default=None, description="Override of the Cloud Tasks endpoint (tests only)."
    )


class QueueConfig(_Section):
    """How deliveries travel from ingress to the worker."""

    backend: Literal["embedded", "cloudtasks"] = Field(
        default="embedded", description="`embedded` (SQLite) or `cloudtasks`."
    )
    retry: RetryConfig = Field(default_factory=RetryConfig, description="Retry policy.")
    embedded: EmbeddedQueueConfig = Field(
        default_factory=EmbeddedQueueConfig, description="Embedded queue settings."
    )
    cloudtasks: CloudTasksConfig = Field(
        default_factory=CloudTasksConfig, description="Cloud Tasks settings."
    )


DEFAULT_PHASES: tuple[tuple[str, str, bool], ...] = (
    ("brainstorming", "Brainstorm the problem and options", False),
    ("requirements-definition", "Write requirements", False),
    ("requirements-approval", "Human approval of the requirements", False),
    ("design", "Write the design", False),
    # Opt-in, and listed where it runs: right after the design it reviews.
    ("design-critic-review", "Critic review of the design", True),
    ("test-planning", "Plan the tests", False),
    ("design-approval", "Human approval of the design", False),
    ("tasks-breakdown", "Break the work into tasks", False),
    ("implementation", "Implement", False),
    ("verification", "Verify against the requirements", False),
    ("self-review", "Self-review the change", False),
    ("critic-review", "Critic review", False),
    ("security-review", "Security review", False),
    ("evidence", "Collect evidence", False),
    ("capability-docs", "Update capability docs", False),
    ("reviewer-briefing", "Brief the reviewer", False),
    ("human-approval", "Human approval of the result", False),
)
"""The shipped outer loop's selectable phases (the predecessor's C7 rows)."""


class PhaseConfig(_Section):
    """One selectable phase of the phase-selection checklist."""

    token: str = Field(description="Row token, `[a-z0-9][a-z0-9-]*`.")
    label: str = Field(description="What the phase does, shown next to its row.")
    opt_in: bool = Field(default=False, description="Runs only when ticked (unticked by default).")


class ControlConfig(_Section):
    """Control keywords in comments."""

    require_start_command: bool = Field(
        default=True,
        description="An armed work item starts only on an authorized `start` command; when "
        "false, the arming label alone starts it.",
    )
    keywords: dict[str, str] = Field(
        default_factory=dict,
        description="Keyword per command (`start`, `stop`, `pause`, `resume`, `execute`, "
        "`cleanup`); unset ones are `the-loop <command>`; an empty string disables one.",
    )


class InteractionConfig(_Section):
    """Where sessions take their answers from (seeds 000-002)."""

    mode: Any = Field(
        default="work-item",
        json_schema_extra={"enum": list(MODES)},
        description="`work-item` (default: questions go to GitHub comments) or `cli` (a human "
        "is attached). Trimmed and lower-cased; the schema declares only these two, while at "
        "run time any other value means `work-item` and logs a warning naming it.",
    )


class AuthorizedUser(_Section):
    """One person in ``routing.authorizedUsers`` named by login and pinned to their user id."""

    login: str = Field(description="GitHub login (case-insensitive).")
    id: int = Field(gt=0, description="Numeric GitHub user id (`gh api users/LOGIN --jq .id`).")


def _authorized_user(index: int, entry: dict[str, Any]) -> AuthorizedUser:
    try:
        return AuthorizedUser.model_validate(entry)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'entry'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ValueError(
            f"entry {index} must be {{login: LOGIN, id: NUMERIC_ID}} ({problems})"
        ) from None


HarnessName = Literal["claude", "cursor-agent", "codex", "gemini", "copilot"]
"""The harnesses of ``agent/harnesses``' registry."""
HOSTABLE_HARNESSES = ("claude", "codex", "gemini", "copilot")
"""The harnesses a runner can host in tmux (``agent/harnesses``: ``hostable``)."""


class RoutingConfig(_Section):
    """Policy and routing in the worker."""

    authorized_users: list[str | int | AuthorizedUser] = Field(
        default_factory=list,
        description="Whose events and commands count: `{login, id}` objects (the login pinned "
        "to that numeric user id), numeric user ids, or bare logins (case-insensitive; each is "
        "pinned to the first user id seen with it, kept in the store, and a warning at start "
        "names them). An event whose login carries another id than the pinned one is refused "
        "and logged. Empty means nobody (fail closed); CI events have no actor and pass.",
    )

    close_ends_session: Literal["authorized", "anyone"] = Field(
        default="authorized",
        description="Whose closing of an issue or pull request ends its session: `authorized` "
        "(people in `authorizedUsers`; a close by anyone else is refused and the session keeps "
        "running) or `anyone` (anyone's close ends it, only an authorized one cleans up).",
    )
    paused_events: Literal["hold", "drop"] = Field(
        default="hold",
        description="What becomes of a comment or event for a paused work item: `hold` keeps "
        "it (its comment is answered so) and delivers it, in order, after `the-loop resume` "
        "(a stop, cleanup or close drops what is held; past 50 held, more are dropped); `drop` "
        "drops it, and its comment is answered that it will not reach the session.",
    )
    answer_strangers: bool = Field(
        default=False,
        description="Whether a comment by someone not in `authorizedUsers`, on a work item "
        "looprelay tracks, gets a marked answer saying it was not acted on. Off by default: "
        "looprelay does not talk to strangers.",
    )
    bot_logins: list[str] = Field(
        default_factory=list,
        description="Logins of looprelay's own App bot (e.g. `looprelay[bot]`); their events "
        "are dropped before anything else.",
    )
    auto_execute_label: str = Field(
        default="the-loop: auto-execute", description="The label that arms a work item."
    )
    pr_session_wait_seconds: float = Field(
        default=300.0,
        ge=0,
        description="How long a pull request's own session may wait for a runner to start it; "
        "past it, the pull request's events go to the work item's session instead, and "
        "`session.pr_session_declined` says so (reason `pr-session-not-taken`).",
    )
    order_wait_seconds: float = Field(
        default=5.0,
        ge=0,
        le=600,
        description="How long deliveries whose handler keeps failing hold back the others of "
        "their issue or pull request, counted from the first failure (waiting for one's turn "
        "is no failure); after it the others go ahead and the event `delivery.went_ahead` "
        "names what they went ahead of.",
    )
    comment_window_seconds: float = Field(
        default=1.0,
        ge=0,
        le=30,
        description="How far apart in receipt new comments may be and still be handed off in "
        "the order GitHub created them (a burst that arrives shuffled); a new comment waits this "
        "long after the latest received of its run before it is handed off.",
    )
    max_comment_run_seconds: float = Field(
        default=3.0,
        ge=0,
        le=60,
        description="How long one such run of comments may last: a steady stream is handed off "
        "anyway.",
    )
    review_turns: bool = Field(
        default=True,
        description="A pull-request review reaches its session as one turn: the review's body "
        "and its inline comments (with file and line), in one prompt. Each delivery is still "
        "settled once in the ledger; a comment that names a command is handed off alone.",
    )
    comment_burst_turns: bool = Field(
        default=False,
        description="A burst of one author's new issue comments (a run, as "
        "`commentWindowSeconds` says) reaches the session as one turn.",
    )
    turn_window_seconds: float = Field(
        default=2.0,
        ge=0,
        le=30,
        description="How long after a turn's first delivery was received its other deliveries "
        "may join it (GitHub sends a review's within about a second); a review waits this long "
        "before it is handed off.",
    )
    control: ControlConfig = Field(default_factory=ControlConfig, description="Commands.")
    interaction: InteractionConfig = Field(
        default_factory=InteractionConfig, description="Interaction mode."
    )
    session_per_pr: Any = Field(
        default="cross-repository",
        description="Which pull requests get their own session: `never`, `cross-repository` "
        "or `always`; `true`/`false` mean `cross-repository`/`never`; anything else warns and "
        "means `cross-repository`. A work item's frozen checklist answer overrides it.",
    )
    fork_sessions: Literal["approval", "off"] = Field(
        default="approval",
        description="Whether a pull request from a fork may get a session of its own: "
        "`approval` (only at a head an authorized person approved by commenting the start "
        "command on the pull request; a later push needs a new approval) or `off` (never; its "
        "events go to the work item's session, told the code is untrusted). See "
        "docs/security.md.",
    )
    harness: HarnessName = Field(
        default="claude",
        description="The coding agent sessions run. `claude`, `codex`, `gemini` and `copilot` "
        "are hosted in tmux or run headless; `cursor-agent` runs headless only (`runnerKind: "
        "process`).",
    )
    harness_labels: dict[str, HarnessName] = Field(
        default_factory=dict,
        max_length=20,
        description="Labels that pick the coding agent of a work item's new sessions, for "
        'example `{"agent: codex": codex}`: a session spawned while its issue or pull '
        "request carries one of these labels (the first listed wins) runs that harness instead "
        "of `harness`. A session keeps its harness for life (a resume never changes it); a "
        "runner that lacks it is never given the work, and the wait says `harness-missing`.",
    )
    runner_kind: Literal["tmux", "process"] = Field(
        default="tmux",
        description="`tmux` (interactive, attachable) or `process` (headless `-p` runs).",
    )
    headless_replies: bool = Field(
        default=True,
        description="Post what a headless (`process`) turn says as a comment on the work item, "
        "or on the pull request of a PR session: its answer (cut to GitHub's 65,536-character "
        "limit), or a short 😕 note with the harness's message when it fails. `false` posts "
        "neither; reactions and the event log stay.",
    )
    prompt_template: str | None = Field(
        default=None,
        description="Path of an operator's event-prompt template (Jinja2, rendered sandboxed); "
        "default the bundled one.",
    )
    spawn_prompt_template: str | None = Field(
        default=None,
        description="Path of an operator's spawn-prompt template; default the bundled one.",
    )
    phases: list[PhaseConfig] = Field(
        default_factory=lambda: [
            PhaseConfig(token=t, label=label, opt_in=o) for t, label, o in DEFAULT_PHASES
        ],
        description="Selectable phases of the phase-selection checklist, in order. Default: "
        + ", ".join(
            f"`{token}`" + (" (opt-in)" if opt_in else "") for token, _, opt_in in DEFAULT_PHASES
        )
        + ".",
    )

    @field_validator("interaction", mode="before")
    @classmethod
    def _interaction_block(cls, block: Any) -> Any:
        # `interaction:` left empty (null) or not a mapping declares nothing: the default.
        return block if isinstance(block, Mapping) else {}

    @field_validator("authorized_users", mode="before")
    @classmethod
    def _pinned_users(cls, entries: Any) -> Any:
        # A mapping can only mean {login, id}: report what is wrong with it, not also that it
        # is neither a string nor a number.
        if not isinstance(entries, list):
            return entries
        return [_authorized_user(n, e) if isinstance(e, dict) else e for n, e in enumerate(entries)]

    @model_validator(mode="after")
    def _hostable_harness(self) -> RoutingConfig:
        # A harness that cannot live in a tmux pane would fail every spawn on the runner.
        if self.runner_kind == "tmux" and self.harness not in HOSTABLE_HARNESSES:
            raise ValueError(
                f"harness {self.harness} runs headless only: set runnerKind: process with it"
            )
        for label, harness in self.harness_labels.items():
            if not label.strip():
                raise ValueError("harnessLabels: a label name is empty")
            if self.runner_kind == "tmux" and harness not in HOSTABLE_HARNESSES:
                raise ValueError(
                    f"harnessLabels: {label!r} picks {harness}, which runs headless only: set "
                    "runnerKind: process with it"
                )
        return self


MAX_POLL_WAIT_SECONDS = 3600
"""Longest any long poll is held: Cloud Run's and Cloud Functions' longest request."""


class RunnersConfig(_Section):
    """Runner agents: registration, liveness and leases."""

    registration_token_ttl_seconds: int = Field(
        default=3600,
        ge=60,
        le=7 * 24 * 3600,
        description="Default lifetime of a registration token (`looprelay runners token`).",
    )
    lost_after_seconds: int = Field(
        default=120, ge=30, description="A runner silent this long is lost."
    )
    heartbeat_seconds: int = Field(
        default=30, ge=5, description="How often a runner agent sends its heartbeat."
    )
    poll_wait_seconds: int = Field(
        default=25,
        ge=1,
        le=MAX_POLL_WAIT_SECONDS,
        description="Longest a long poll for work is held open (a runner asking for less "
        "gets less). Minutes cut an idle runner's requests where nothing in front of the "
        "server ends a quiet request sooner (the cloud deployment holds polls 300 s; a "
        "proxy in front of `looprelay up` may cut them at 60 s).",
    )
    lease_seconds: int = Field(
        default=60, ge=10, description="How long a leased dispatch stays with its runner."
    )
    runner_list_max_age_seconds: int = Field(
        default=5,
        ge=0,
        le=60,
        description="How stale the runner API's cached liveness of a runner may be when "
        "choosing a dispatch depends on it (a session's runner: a silent runner is noticed "
        "that much later; 0 reads it on every choice).",
    )
    cached_runners: int = Field(
        default=20_000,
        ge=0,
        le=1_000_000,
        description="Runners one instance of the runner API keeps in memory after reading "
        "them (about 1 KiB each; the least recently used leave first): an idle runner's "
        "polls and heartbeats read nothing while it is held, so keep it above the runners "
        "that reach one instance. Changes to a runner (revoke, rotate, a new status) reach "
        "every instance through a small feed, whatever this is.",
    )
    unserved_expiry_seconds: int = Field(
        default=24 * 3600,
        ge=60,
        description="A pending dispatch no live runner serves the repository of is settled "
        "failed (result `expired`) after this long; `looprelay dispatches replay` offers it "
        "again.",
    )


class SweeperConfig(_Section):
    """The redelivery sweep: the cloud's scheduled sweeper and `looprelay deliveries sweep`."""

    redeliveries_per_run: int = Field(
        default=1000,
        ge=0,
        le=100_000,
        description="Most redeliveries one run asks GitHub for; the rest wait for the next run.",
    )
    max_pages_per_run: int = Field(
        default=1200,
        ge=1,
        le=100_000,
        description="Most pages of 100 delivery attempts one run lists (1,200: 15 minutes at "
        "130 deliveries a second); a run cut short lists the same stretch again next time.",
    )
    max_run_seconds: float = Field(
        default=240.0,
        gt=0,
        description="A run stops listing and asking after this long and leaves the rest for "
        "the next, and no call it makes outlasts it; keep it 30 s under the sweeper "
        "function's timeout (300 s in infra/).",
    )


class ServerConfig(_Section):
    """The listener of `looprelay up`."""

    host: str = Field(default="127.0.0.1", description="Address to bind; loopback by default.")
    port: int = Field(default=8484, ge=0, le=65535, description="Port to bind (0 = any free).")
    max_connections: int | None = Field(
        default=None,
        ge=16,
        description="Most connections open at once (each waiting agent poll holds one). Unset: "
        "as many as the descriptor limit (`ulimit -n`, raised to its hard limit) allows, less "
        "256 kept for files.",
    )
    operator_token_env: str | None = Field(
        default=None,
        description="Name of an environment variable holding a token (at least 16 characters) "
        "that opens `/status` to callers off this machine, sent as `Authorization: Bearer "
        "TOKEN`. Unset: `/status` answers only callers on this machine.",
    )

    @field_validator("operator_token_env")
    @classmethod
    def _optional_name(cls, name: str | None) -> str | None:
        return None if name is None else _check_env_name(name)


class Config(_Section):
    """The whole configuration file."""

    github: GitHubConfig = Field(default_factory=GitHubConfig, description="GitHub.")
    webhook: WebhookConfig = Field(default_factory=WebhookConfig, description="Ingress.")
    worker: WorkerConfig = Field(default_factory=WorkerConfig, description="Worker.")
    store: StoreConfig = Field(default_factory=StoreConfig, description="Store.")
    queue: QueueConfig = Field(default_factory=QueueConfig, description="Queue.")
    routing: RoutingConfig = Field(default_factory=RoutingConfig, description="Routing.")
    runners: RunnersConfig = Field(default_factory=RunnersConfig, description="Runners.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="Local server.")
    sweeper: SweeperConfig = Field(default_factory=SweeperConfig, description="Redelivery sweep.")


APP_FRAGMENT_FILE = "github-app.yaml"
"""The config fragment ``looprelay app create`` writes into the data directory."""


def load_config(
    path: str | Path | None,
    *,
    environ: Mapping[str, str] | None = None,
    data_dir: Path | None = None,
) -> Config:
    """Load the configuration: defaults, then ``data_dir``'s ``github-app.yaml`` (what
    ``looprelay app create`` wrote, when there is one), then the YAML at ``path``, then env
    overrides.

    Expects ``path`` to be a YAML mapping (or None for defaults only). Raises ``ConfigError``
    naming the file and the key when the file is missing, not YAML, or does not validate.
    """
    env = os.environ if environ is None else environ
    source = str(path) if path else "defaults"
    data: dict[str, Any] = {}
    fragment = data_dir / APP_FRAGMENT_FILE if data_dir is not None else None
    if fragment is not None and fragment.is_file():
        data = _app_fragment(fragment)
        source = f"{fragment} + {source}"
    if path:
        _merge(data, _read_yaml(Path(path)))
    overrides = _apply_env_overrides(data, env)
    try:
        # Keys are spelled as documented (camelCase) only: a field's Python name in the file is
        # an unknown key, never a silent second spelling.
        return Config.model_validate(data, by_name=False)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source, overrides)) from exc


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from exc
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return loaded


def _app_fragment(path: Path) -> dict[str, Any]:
    """The fragment's ``github`` section, its ``privateKeyFile`` resolved against its directory
    (the data directory may move)."""
    github = _read_yaml(path).get("github")
    if not isinstance(github, dict):
        raise ConfigError(f"{path}: holds no github section; run `looprelay app create` again")
    key_file = github.get("privateKeyFile")
    if isinstance(key_file, str):
        github["privateKeyFile"] = str(path.parent / key_file)
    return {"github": github}


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> None:
    """Put ``top`` over ``base`` in place, section by section."""
    for key, value in top.items():
        below = base.get(key)
        if isinstance(below, dict) and isinstance(value, Mapping):
            _merge(below, value)
        else:
            base[key] = value


def _apply_env_overrides(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """``LOOPRELAY__store__backend=firestore`` sets ``store.backend``; values are YAML.

    Section and key names match in any case and with or without underscores
    (``LOOPRELAY__RUNNERS__LOST_AFTER_SECONDS``), as shells spell them. Returns which variable
    set each dotted key, so an error names the variable. Raises ``ConfigError`` for a value that
    is not YAML or a key below one that is not a section.
    """
    overrides: dict[str, str] = {}
    for name, raw in sorted(env.items()):
        if not name.startswith(ENV_OVERRIDE_PREFIX):
            continue
        keys = _model_keys([key for key in name[len(ENV_OVERRIDE_PREFIX) :].split("__") if key])
        if not keys:
            continue
        node = data
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment {name}: {key} is not a section")
            node = child
        try:
            node[keys[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise ConfigError(
                f"environment {name}: the value is not valid YAML ({problem}); quote it"
            ) from exc
        overrides[".".join(keys)] = name
    return overrides


def _model_keys(keys: list[str]) -> list[str]:
    """Spell each key the way the config models do (their camelCase alias), as far down as
    the models go; a key no field matches is kept, to be reported as unknown."""
    model: type[BaseModel] | None = Config
    spelled = []
    for key in keys:
        if model is None:
            spelled.append(key)
            continue
        wanted = key.replace("_", "").lower()
        match = next(
            (
                (field.alias or field_name, field.annotation)
                for field_name, field in model.model_fields.items()
                if field_name.replace("_", "").lower() == wanted
            ),
            None,
        )
        if match is None:
            spelled.append(key)
            model = None
            continue
        spelled.append(match[0])
        annotation = match[1]
        model = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
    return spelled


def _describe(exc: ValidationError, source: str, overrides: Mapping[str, str]) -> str:
    lines = [f"{source}: the configuration is not valid:"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        origin = next(
            (f" (set by {name})" for dotted, name in overrides.items() if key.startswith(dotted)),
            "",
        )
        if error["type"] == "extra_forbidden":
            last = str(error["loc"][-1]) if error["loc"] else ""
            hint = f"did you mean {to_camel(last)}? " if "_" in last else ""
            lines.append(
                f"  {key}: unknown key{origin} ({hint}see docs/config.md for the keys there are)"
            )
        else:
            lines.append(f"  {key}: {error['msg']}{origin}")
    return "\n".join(lines)
