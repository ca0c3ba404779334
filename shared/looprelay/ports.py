"""The ports the core and the request handlers talk through; adapters implement them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:  # only named in annotations: the webhook, which stores none, never loads them
    from looprelay.core.model import (
        DeliveryRecord,
        DispatchRecord,
        EventRecord,
        InboxRecord,
        RegistrationToken,
        RunnerRecord,
        WorkItemRecord,
    )
    from looprelay.core.poll import PollCursor

MAX_TASK_BYTES = 1_000_000
"""A Cloud Task holds at most 1 MB, counting its name, URL and headers with the body; the
embedded queue holds bodies to the same bound."""
TASK_RESERVE_BYTES = 8_192
"""Room left in a task for what is not the body: its name, the worker's URL, the headers and
the OIDC token's service account and audience."""
MAX_TASK_BODY_BYTES = MAX_TASK_BYTES - TASK_RESERVE_BYTES
"""The largest body ingress puts in a task."""


@dataclass(frozen=True)
class Task:
    """A unit of work for the worker: a deterministic name and the bytes to POST. Queues
    need not keep order: the worker's inbox does (``service.inbox``)."""

    name: str
    body: bytes
    not_before: datetime | None = None
    """When the task is due (Cloud Tasks' ``scheduleTime``); None: at once."""


class Clock(Protocol):
    """Where the current time comes from (the core never reads a clock itself)."""

    def now(self) -> datetime:
        """Return the current time, timezone-aware UTC."""
        ...


class Queue(Protocol):
    """Hands tasks to the worker at least once; deduplicates by task name."""

    def enqueue(self, task: Task) -> bool:
        """Queue ``task``; return False when a task of that name was already queued.

        Raises ``Permanent`` for a task that can never be queued (too large, bad name) and
        ``Transient`` when the queue cannot be reached now.
        """
        ...


class Store(Protocol):
    """Durable state: the delivery ledger, the event log and the authorized logins' pins."""

    def begin_delivery(
        self, record: DeliveryRecord, *, event: EventRecord | None = None
    ) -> tuple[DeliveryRecord, bool]:
        """Create the ledger record unless one exists; return the stored record and whether
        this call created it. An existing unsettled record has its ``attempts`` counted up.
        ``event`` is written in the same write as the record, only by the call creating it.

        Raises ``Transient`` when the store is unavailable.
        """
        ...

    def settle_delivery(
        self,
        delivery_id: str,
        *,
        outcome: str,
        detail: str,
        at: datetime,
        event: EventRecord | None = None,
    ) -> bool:
        """Move a ``received`` delivery to its final ``outcome``; return False if it was
        already settled (or unknown). Exactly one caller ever gets True. ``event`` is appended
        in the same write: it exists exactly when this call settled the delivery.

        Raises ``ValueError`` for an outcome the ledger does not know, ``Transient`` when the
        store is unavailable.
        """
        ...

    def reopen_delivery(self, delivery_id: str) -> bool:
        """Put a ``failed`` delivery back to ``received`` for a replay, keeping when it was
        received; False if it is not failed."""
        ...

    def get_delivery(self, delivery_id: str) -> DeliveryRecord | None:
        """Return the ledger record of ``delivery_id``, or None."""
        ...

    def list_inbox(self, group: str, *, from_key: str, limit: int = 50) -> list[DeliveryRecord]:
        """Return up to ``limit`` deliveries of order ``group`` that are not settled and have
        an ``order_key`` at or after ``from_key``, smallest key first: the group's inbox, for
        its holder to hand off (``service.inbox``). Raises ``Transient``."""
        ...

    def take_inbox(
        self, group: str, *, holder: str, now: datetime, until: datetime
    ) -> InboxRecord | None:
        """Give ``holder`` the short lease on ``group``'s inbox until ``until`` if nobody holds
        it, its lease lapsed before ``now``, or ``holder`` holds it already; return the inbox
        as stored then (``knocks`` as counted so far). Otherwise count a knock, so the holder
        drains again before it may release, and return None. Exactly one of racing takers
        wins. Raises ``Transient``."""
        ...

    def keep_inbox(self, inbox: InboxRecord, *, until: datetime) -> InboxRecord | None:
        """Extend ``inbox.holder``'s lease to ``until`` and record the drain's ``drained_key``,
        ``stuck`` and ``stuck_since``, if it still holds the lease; return the inbox as stored
        (its ``knocks`` fresh), or None when the lease was lost. Raises ``Transient``."""
        ...

    def release_inbox(self, inbox: InboxRecord) -> bool:
        """Free the lease ``inbox.holder`` holds, recording the drain's state as ``keep_inbox``
        does, unless a knock came after ``inbox.knocks`` was read; False then (or when the
        lease was lost): drain again. Raises ``Transient``."""
        ...

    def free_inboxes(self) -> int:
        """Free every inbox lease, its state kept; return how many were held. Only for the one
        process that drains (``looprelay up`` holds the data directory's lock), starting:
        every holder it finds is dead, and waiting for their leases only delays the queue's
        retries. Raises ``Transient``."""
        ...

    def list_deliveries(
        self, *, outcome: str | None = None, limit: int = 100
    ) -> list[DeliveryRecord]:
        """Return ledger records, newest first, optionally only one ``outcome`` (a
        ``refused`` or ``ignored`` filter also matches every ``refused:<reason>`` or
        ``ignored:<reason>``)."""
        ...

    def append_event(self, event: EventRecord) -> None:
        """Add ``event`` to the log."""
        ...

    def list_events(
        self,
        *,
        delivery_id: str | None = None,
        work_item: str | None = None,
        name: str | None = None,
        after: str | None = None,
        since: datetime | None = None,
        newest: bool = False,
        limit: int = 1000,
    ) -> list[EventRecord]:
        """Return at most ``limit`` events in the order they were written, filtered by every
        argument given.

        ``after`` is the ``cursor`` of an event already seen, for following the log: up to
        ``limit`` events written after it, and a store whose writers race (Firestore) adds
        those committed shortly before it, which a follower may not have seen yet; the
        follower drops cursors it has seen (``service.follow``). ``since`` keeps events at
        or after that time. ``newest`` takes the newest ``limit`` instead of the oldest.
        """
        ...

    def pin_user_id(self, login: str, *, user_id: int, at: datetime) -> tuple[int, bool]:
        """Pin ``login`` (as given: the caller lower-cases it) to GitHub user ``user_id``
        unless it is pinned already; return the pinned id and whether this call pinned it.

        Exactly one of several racing calls pins; a pin is never replaced and, unlike the
        ledger and the event log, never expires. Raises ``Transient`` when the store is
        unavailable.
        """
        ...


@dataclass(frozen=True)
class SessionSlot:
    """The session slot a lease that starts a harness takes on the runner it is leased to
    (``core.slots.takes_slot``): one per endpoint, at most ``capacity`` per runner. ``frees``
    names the runners whose slot of the same endpoint the same write gives back (the session
    moved away from them, or their lease of it lapsed)."""

    endpoint: str
    work_item: str
    capacity: int
    frees: tuple[str, ...] = ()


class WorkItemStore(Protocol):
    """Work items and their dispatches, written together so order and state never drift."""

    def get_work_item(self, ref: str) -> WorkItemRecord | None:
        """Return the work item ``ref``, or None."""
        ...

    def get_work_items(self, refs: Collection[str]) -> dict[str, WorkItemRecord]:
        """Return the work items of ``refs`` that exist, by ref, in one round trip (the lease
        desk reads every work item with an open dispatch on each poll)."""
        ...

    def find_work_item_for_pull_request(self, pr_ref: str) -> WorkItemRecord | None:
        """Return the work item a pull request was linked to, or None."""
        ...

    def list_work_items(self, *, limit: int = 100) -> list[WorkItemRecord]:
        """Return at most ``limit`` work items, the most recently decided on first (never
        decided on: last), for the operator's status view."""
        ...

    def save_work_item(
        self,
        record: WorkItemRecord,
        *,
        expected_version: int,
        dispatches: Sequence[DispatchRecord] = (),
    ) -> bool:
        """Write ``record`` (its version becomes ``expected_version + 1``) and create
        ``dispatches``, all or nothing, if the stored version is still ``expected_version``
        (0: the work item must not exist yet). A dispatch whose id exists is left as it is,
        unless it is ``held`` (``core.model.DISPATCH_HELD``): then the one given replaces it
        (a resume makes it ``pending``, a stop settles it). Only the router writes held
        dispatches, under the work item's version, so no other writer races that replacement.

        Returns False on a version conflict (reload, decide again). Raises ``Transient``.
        """
        ...

    def get_dispatch(self, dispatch_id: str) -> DispatchRecord | None:
        """Return the dispatch, or None."""
        ...

    def list_dispatches(
        self, *, statuses: Sequence[str] = (), work_item: str | None = None, limit: int = 500
    ) -> list[DispatchRecord]:
        """Return dispatches oldest first, filtered by status (any of) and work item."""
        ...

    def list_dispatch_heads(
        self,
        *,
        statuses: Sequence[str],
        repositories: Collection[str] | None = None,
        limit: int = 500,
    ) -> list[DispatchRecord]:
        """Return, per work item and session endpoint, its lowest-``seq`` dispatch among those
        in ``statuses``, oldest first: what may go next, without reading the line behind each
        head.
        ``repositories`` (any case) keeps only those dispatches: a runner asks for what it
        serves, so a backlog it cannot take never hides what it can."""
        ...

    def expire_dispatch(
        self, dispatch_id: str, *, now: datetime, detail: str
    ) -> DispatchRecord | None:
        """Settle a ``pending`` dispatch nobody took in time as ``failed`` with result
        ``expired`` and ``detail``; return it, or None when it is not pending."""
        ...

    def reopen_dispatch(self, dispatch_id: str, *, now: datetime) -> DispatchRecord | None:
        """Offer an ``expired`` dispatch again (``pending``); None when it is not expired."""
        ...

    def lease_dispatch(
        self,
        dispatch_id: str,
        *,
        runner_id: str,
        now: datetime,
        until: datetime,
        slot: SessionSlot | None = None,
    ) -> DispatchRecord | None:
        """Lease the dispatch to ``runner_id`` if it is pending or its lease lapsed before
        ``now``; return the leased record, or None when another runner holds it.
        Exactly one of several racing runners wins.

        With ``slot``, the same atomic write gives ``runner_id`` the session slot of
        ``slot.endpoint`` (kept, re-dated, if it holds it already), and the lease is refused
        (None) when the runner holds ``slot.capacity`` slots of other endpoints: racing
        spawns never put more sessions on a runner than its capacity. The same write frees
        the endpoint's slot on each runner of ``slot.frees``.
        """
        ...

    def held_sessions(self, runner_id: str) -> dict[str, str]:
        """Return the session slots ``runner_id`` holds: endpoint -> work item ref."""
        ...

    def release_session(self, runner_id: str, *, endpoint: str) -> bool:
        """Free the slot of ``endpoint`` on ``runner_id`` (its session ended or moved);
        False when it held none."""
        ...

    def renew_lease(
        self, dispatch_id: str, *, runner_id: str, now: datetime, until: datetime
    ) -> bool:
        """Extend the lease ``runner_id`` still holds; False if it holds it no longer."""
        ...

    def finish_dispatch(
        self,
        dispatch_id: str,
        *,
        runner_id: str,
        status: str,
        result: str,
        now: datetime,
        detail: str = "",
    ) -> bool:
        """Record the lease holder's result (``succeeded``, ``failed``, or ``pending`` to offer
        it again) and its ``detail``; False when ``runner_id`` does not hold the lease."""
        ...


DispatchRing: TypeAlias = "Callable[[Iterable[DispatchRecord] | None, Collection[str]], None]"
"""Told what a push of the feed opened: the dispatches that may be leasable now (None:
anything may have), and the runners a settled lease may have freed a slot on
(``service.waker.DispatchWaker.notify``)."""


class DispatchFeed(Protocol):
    """The open dispatches as the store last pushed them: one listener per process, so a
    waiting poll learns of new work without reading the store."""

    def open_dispatches(self) -> Sequence[DispatchRecord] | None:
        """Return every open dispatch as of the last change pushed (prompts left out), or
        None while the feed is not live: the caller must then look at the store itself."""
        ...

    def start(self) -> None:
        """Start listening in this process (the one that serves: never before a fork);
        once a process, a second call does nothing."""
        ...

    def close(self) -> None:
        """Stop listening; :meth:`open_dispatches` answers None from then on."""
        ...


@dataclass(frozen=True)
class RunnerStatus:
    """What a runner reports about itself on a heartbeat."""

    version: str = ""
    capacity: int = 1
    repositories: tuple[str, ...] = ()
    workspace: bool = False
    sessions: int = 0
    agent_id: str = ""
    """The agent process sending it (``core.identity``); empty from an agent that names none."""
    hostname: str = ""
    """The machine the agent runs on, for the operator's status view."""
    harnesses: tuple[str, ...] = ()
    """The coding-agent CLIs the agent can run; empty from an agent that names none."""

    def record_fields(self) -> dict[str, Any]:
        """The runner record's fields this status sets, as the registries store them."""
        return {
            "version": self.version,
            "capacity": self.capacity,
            "repositories": list(self.repositories),
            "workspace": self.workspace,
            "sessions": self.sessions,
            "agent_id": self.agent_id,
            "hostname": self.hostname,
            "harnesses": list(self.harnesses),
        }


class RunnerRegistry(Protocol):
    """Registration tokens and registered runners. Each change to a runner's record (revoke,
    rotate, a heartbeat with a new status) is announced to ``RunnerChanges`` in the same
    write; ``record_alive`` announces nothing."""

    def add_registration_token(self, token: RegistrationToken) -> None:
        """Store a newly minted (hashed) registration token."""
        ...

    def consume_registration_token(self, token_hash: str, *, at: datetime) -> bool:
        """Mark the token used; True only for the first use before it expires."""
        ...

    def add_runner(self, runner: RunnerRecord) -> None:
        """Store a newly registered runner; raises ``ValueError`` if the id exists."""
        ...

    def get_runner(self, runner_id: str) -> RunnerRecord | None:
        """Return the runner, or None; ``last_seen_at`` is its latest heartbeat, whichever
        way it was recorded."""
        ...

    def get_runners(self, runner_ids: Collection[str]) -> dict[str, RunnerRecord]:
        """Return the runners of ``runner_ids`` that exist (revoked ones too), by id, each as
        ``get_runner`` returns it, in one round trip (the lease desk asks for the runners its
        candidates are pinned to)."""
        ...

    def list_runners(self) -> list[RunnerRecord]:
        """Return every runner, revoked ones too, oldest registration first, each as
        ``get_runner`` returns it."""
        ...

    def find_checkout_runner(self) -> str | None:
        """The id of a runner that is not revoked and can give a pull request a checkout of
        its own (``core.slots.can_make_checkout``), or None; in a read or two whatever the
        fleet's size, as the router asks it per delivery."""
        ...

    def list_last_seen(self, runner_ids: Collection[str]) -> dict[str, datetime]:
        """Return when the runners of ``runner_ids`` were last heard from, by runner id, in
        one round trip: for each added with a ``last_seen_at`` or heard from through this
        port, what ``get_runner`` says; a runner never heard from is left out. It may answer
        for a revoked or unknown runner, and leave out one last heard from by an older
        version: callers keep the later of it and the record they hold
        (``core.scheduling.with_last_seen``)."""
        ...

    def revoke_runner(self, runner_id: str, *, at: datetime) -> bool:
        """Revoke the runner; False if unknown or already revoked."""
        ...

    def rotate_runner_secret(self, runner_id: str, *, secret_hash: str) -> bool:
        """Replace the runner's secret hash; False if unknown or revoked."""
        ...

    def record_heartbeat(self, runner_id: str, *, at: datetime, status: RunnerStatus) -> bool:
        """Note that the runner is alive and what it reports; False if unknown or revoked."""
        ...

    def record_alive(self, runner_id: str, *, at: datetime) -> None:
        """Note that the runner, authenticated just now and reporting the status its record
        holds, is alive at ``at``. It reads nothing, so it cannot tell whether the runner was
        revoked meanwhile (authentication refuses revoked runners); it never makes an unknown
        runner known nor a revoked one unrevoked."""
        ...


RunnerChanged = Callable[[Collection[str] | None], None]
"""Told the ids of runners whose records changed, or None when changes may have been missed
(the feed dropped): then no record read before may be trusted."""


class RunnerChanges(Protocol):
    """Which runners' records changed (revoked, secret rotated, a new status reported), as
    the store pushes it: a small feed of changes, not the fleet, so an instance can keep the
    runners it authenticates in a bounded cache and read only on a miss
    (``service.runner_cache.RunnerRecords``)."""

    def start(self, on_change: RunnerChanged) -> None:
        """Start listening in this process (the one that serves: never before a fork),
        telling ``on_change`` (on the feed's thread; it must not block) each change from
        then on; once a process, a second call does nothing."""
        ...

    def live(self) -> bool:
        """Whether the feed has pushed in this process and not dropped since: only then is a
        change to a runner sure to be told."""
        ...

    def close(self) -> None:
        """Stop listening; :meth:`live` answers False from then on."""
        ...


@dataclass(frozen=True)
class CommentText:
    """A comment as read back from GitHub: who wrote it and what it says now."""

    comment_id: int
    author_login: str
    body: str


@dataclass(frozen=True)
class AppDelivery:
    """One attempt GitHub made to deliver a webhook to the App (docs: "REST API endpoints for
    GitHub App webhooks"); a redelivery is a new attempt with the same ``guid``."""

    id: int
    guid: str
    """The ``X-GitHub-Delivery`` header: the ledger's key."""
    delivered_at: datetime
    status_code: int
    redelivery: bool
    event: str


@dataclass(frozen=True)
class DeliveryPage:
    """One page of the App's delivery attempts, newest first."""

    deliveries: list[AppDelivery]
    last: bool
    """The listing ends here: it reached the time asked for, or GitHub has no more."""


class GitHub(Protocol):
    """The few GitHub REST calls looprelay makes: the worker's on behalf of one App
    installation, the sweeper's as the App itself.

    ``installation_id`` is None with token auth. Every method raises ``Transient`` on 5xx,
    rate limits and network errors (after its own short retry budget) and ``Permanent`` on
    4xx answers that retrying cannot fix.
    """

    def create_comment(
        self, *, installation_id: int | None, repository: str, number: int, body: str
    ) -> int:
        """Post ``body`` on issue or pull request ``number``; return the new comment's id."""
        ...

    def find_comment_with(
        self, *, installation_id: int | None, repository: str, number: int, needle: str
    ) -> int | None:
        """Return the id of a comment on ``number`` whose body contains ``needle`` (used to
        make posting idempotent: the marker carries the delivery or dispatch id)."""
        ...

    def get_comment(
        self, *, installation_id: int | None, repository: str, comment_id: int
    ) -> CommentText | None:
        """Read an issue comment's current author and body; None when it is gone."""
        ...

    def add_reaction(
        self,
        *,
        installation_id: int | None,
        repository: str,
        comment_id: int,
        comment_kind: str,
        content: str,
    ) -> None:
        """React to an ``issue`` comment or a ``review`` comment (content: ``eyes``,
        ``hooray``, ``confused``, ...); reacting twice is harmless."""
        ...

    def app_delivery_pages(self, *, since: datetime) -> Iterator[DeliveryPage]:
        """Yield the App's webhook delivery attempts newest first, a page at a time, back to
        ``since`` (aware); older attempts on the last page are left out. Needs App auth:
        raises ``Permanent`` without it. A rate limit raises ``Transient`` at once: the pages
        already yielded stay good."""
        ...

    def redeliver(self, *, delivery_id: int) -> None:
        """Ask GitHub to deliver the attempt ``delivery_id`` (an ``AppDelivery.id``) again; a
        retried request may deliver it twice, which the ledger absorbs. Needs App auth."""
        ...


@dataclass(frozen=True)
class Listing:
    """A REST listing read to its last page (``Link: rel="next"``), or found unchanged."""

    items: list[dict[str, Any]]
    etag: str
    """The first page's ``ETag``, to ask with next time (``If-None-Match``)."""
    unchanged: bool = False
    """GitHub answered 304 Not Modified to the ``etag`` given: ``items`` is empty."""
    quota_reset: float | None = None
    """Epoch seconds until which the rate limit is spent (the last answer said
    ``x-ratelimit-remaining: 0``): call no more before then."""


class GitHubListings(Protocol):
    """The reads the poll ingress makes (docs: "REST API endpoints for issues", "... for issue
    comments", "... for pull request review comments", "... for pull request reviews", "...
    for issue events"), on behalf of the repository's installation (None: token auth).

    Every method raises ``RateLimited`` at once when GitHub asks to wait (a poll never waits
    a rate limit out, nor calls through it), ``Transient`` on 5xx and network errors after
    its own short retry budget, and ``Permanent`` on a 4xx retrying cannot fix.
    """

    def list_all(
        self,
        *,
        installation_id: int | None,
        repository: str,
        path: str,
        params: Mapping[str, str],
        etag: str = "",
        max_pages: int = 10,
        back_to: datetime | None = None,
    ) -> Listing:
        """GET ``/repos/{repository}/{path}`` with ``params`` and ``per_page=100``, every
        page up to ``max_pages``; with ``etag``, asked conditionally (a 304 costs no quota).
        ``back_to``: the listing is newest first, and pages stop once one reaches an item
        ``created_at`` before it."""
        ...

    def get_object(
        self, *, installation_id: int | None, repository: str, path: str = ""
    ) -> dict[str, Any] | None:
        """GET ``/repos/{repository}/{path}`` (the repository itself when ``path`` is empty);
        None when GitHub answers 404 (deleted, or not visible to the credentials)."""
        ...

    def repository_installation(self, repository: str) -> int | None:
        """The App's installation on ``repository`` (``GET /repos/{o}/{r}/installation``, as
        the App); None with token auth, which needs none."""
        ...


class PollCursors(Protocol):
    """Where each listing of each polled repository stands (``core.poll.PollCursor``): one
    poller writes them, so a plain write suffices; they never expire."""

    def get_poll_cursor(self, repository: str, listing: str) -> PollCursor | None:
        """Return the cursor of ``listing`` of ``repository`` (any case), or None."""
        ...

    def save_poll_cursor(self, cursor: PollCursor) -> None:
        """Write ``cursor`` over the one of its repository and listing. Raises ``Transient``
        when the store is unavailable."""
        ...

    def list_poll_cursors(self) -> list[PollCursor]:
        """Return every cursor, by repository and listing."""
        ...


class TaskAuthenticator(Protocol):
    """Proves a request to the worker came from the queue."""

    def authenticate(self, headers: Mapping[str, str]) -> None:
        """Return if the request is the queue's; raise ``Unauthorized`` otherwise."""
        ...
