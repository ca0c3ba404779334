"""Harness for the routing acceptance scenarios: the real worker, over real HTTP, on each store.

A :class:`Relay` is one deployment of the worker's side: a ``Worker`` (shared-secret auth, as
under ``looprelay up``) whose handler is the real ``Router``, served over real HTTP by
looprelay's ASGI stack (``tests.app_server``; one server per session, a path per deployment: see
:class:`_Switchboard`), talking to a loopback fake GitHub through ``GitHubRest``. Deliveries
are real octokit payloads (``tests/fixtures/github``) adapted per scenario, projected with
``project_envelope`` exactly as ingress does and POSTed with the bearer secret, as the queue
would.

The ``backend`` fixture holds the durable state (ledger and events, work items and dispatches,
runners) of one store technology: SQLite, or Firestore on the emulator. ``relay(**overrides)``
builds a deployment over it with the routing config overridden; calling it twice in a test
models an operator changing the config between deliveries (same state, new policy).
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from looprelay.adapters.github.auth import TokenAuth
from looprelay.adapters.github.rest import GitHubRest
from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator
from looprelay.adapters.sqlite.runners import SqliteRunnerRegistry
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore
from looprelay.app.messages import Request, Response, json_response
from looprelay.app.services import build_router
from looprelay.app.worker_http import worker_handler
from looprelay.config.model import Config, RoutingConfig, SqliteConfig, StoreConfig
from looprelay.config.routing import TemplateSource, routing_policy
from looprelay.core.envelope import project_envelope
from looprelay.core.model import (
    DeliveryRecord,
    DispatchRecord,
    EventRecord,
    RunnerRecord,
    WorkItemRecord,
)
from looprelay.ports import RunnerRegistry, RunnerStatus, Store, WorkItemStore
from looprelay.service.results import Progress
from looprelay.service.route import Router
from looprelay.service.worker import Worker
from looprelay.wire.runner_api import ResultBody
from tests.app_server import AppServer
from tests.fake_github import APP_LOGIN, FakeComment, FakeGitHub
from tests.samples import payload

SECRET = "routing-scenarios-worker-secret"
TOKEN = "ghp_routing_scenarios"
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
REPOSITORY = "Codertocat/Hello-World"
"""The repository as the payloads spell it."""
REPO = "codertocat/hello-world"
"""The same repository as looprelay keeps it (refs are lower case)."""
OTHER_REPOSITORY = "Codertocat/Hello-World-Docs"
AUTO_LABEL = "the-loop: auto-execute"
AUTHORIZED = ["octocat", "codertocat"]
MAX_TEXT_CHARS = Config().webhook.max_text_chars
USER_IDS = {"codertocat": 21031067, "octocat": 583231, "mallory": 9_000_001, "drive-by": 9_000_002}

BACKENDS = ["sqlite", pytest.param("firestore", marks=pytest.mark.firestore)]


def ref(number: int, repository: str = REPO) -> str:
    """The work-item ref of ``repository#number`` as looprelay writes it."""
    return f"github:{repository.lower()}#{number}"


class TickingClock:
    """The ``Clock`` port: starts at ``NOW`` and moves 1 ms per reading, so order is stable."""

    def __init__(self) -> None:
        self._at = NOW
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            self._at += timedelta(milliseconds=1)
            return self._at


# --- payloads: real octokit shapes, adapted per scenario -------------------------------------


def user(login: str) -> dict[str, Any]:
    """A GitHub user object shaped like the fixtures' ``sender``."""
    shaped: dict[str, Any] = payload("issues.opened")["sender"]
    return shaped | {
        "login": login,
        "id": USER_IDS.get(login.lower(), 9_999_999),
        "url": f"https://api.github.com/users/{login}",
        "html_url": f"https://github.com/{login}",
    }


def _label(name: str) -> dict[str, Any]:
    return {"id": 1362934390, "node_id": "MDU6TGFiZWwx", "name": name, "color": "ededed"}


def issue_payload(
    action: str,
    *,
    number: int = 1,
    sender: str = "Codertocat",
    labels: tuple[str, ...] = (),
    label: str | None = None,
    body: str = "",
) -> dict[str, Any]:
    """An ``issues`` delivery (from ``issues.opened``) for ``number`` with ``action``."""
    data = payload("issues.opened")
    data["action"] = action
    issue = data["issue"]
    issue["number"] = number
    issue["labels"] = [_label(name) for name in labels]
    issue["body"] = body
    issue["state"] = "closed" if action == "closed" else "open"
    data["sender"] = user(sender)
    if label is not None:
        data["label"] = _label(label)
    return data


def comment_payload(
    body: str,
    *,
    comment_id: int,
    author: str | None = "Codertocat",
    number: int = 1,
    action: str = "created",
    on_pull_request: bool = False,
    labels: tuple[str, ...] = (),
) -> dict[str, Any]:
    """An ``issue_comment`` delivery (from ``issue_comment.created``); ``author`` None is a
    deleted account (``"user": null``)."""
    data = payload("issue_comment.created")
    data["action"] = action
    issue = data["issue"]
    issue["number"] = number
    issue["labels"] = [_label(name) for name in labels]
    if on_pull_request:
        issue["pull_request"] = {
            "url": f"https://api.github.com/repos/{REPOSITORY}/pulls/{number}",
            "html_url": f"https://github.com/{REPOSITORY}/pull/{number}",
        }
    comment = data["comment"]
    comment["id"] = comment_id
    comment["body"] = body
    comment["user"] = user(author) if author else None
    data["sender"] = user(author or "ghost")
    return data


def pr_payload(
    action: str = "synchronize",
    *,
    number: int = 2,
    body: str = "",
    head_ref: str = "changes",
    repository: str = REPOSITORY,
    head_repository: str | None = None,
    sender: str = "Codertocat",
    merged: bool = False,
) -> dict[str, Any]:
    """A ``pull_request`` delivery (from ``pull_request.opened``) for PR ``repository#number``."""
    data = payload("pull_request.opened")
    data["action"] = action
    data["number"] = number
    data["repository"]["full_name"] = repository
    data["repository"]["name"] = repository.split("/")[1]
    _shape_pr(data["pull_request"], number, body, head_ref, repository, head_repository)
    data["pull_request"]["merged"] = merged
    data["pull_request"]["state"] = "closed" if action == "closed" else "open"
    data["sender"] = user(sender)
    return data


def review_comment_payload(
    body: str,
    *,
    comment_id: int,
    author: str = "Codertocat",
    number: int = 2,
    pr_body: str = "",
    head_ref: str = "changes",
) -> dict[str, Any]:
    """A ``pull_request_review_comment`` delivery on PR ``number`` of the repository."""
    data = payload("pull_request_review_comment.created")
    _shape_pr(data["pull_request"], number, pr_body, head_ref, REPOSITORY, None)
    data["comment"]["id"] = comment_id
    data["comment"]["body"] = body
    data["comment"]["user"] = user(author)
    data["sender"] = user(author)
    return data


def check_run_payload(*pull_requests: int) -> dict[str, Any]:
    """A ``check_run`` delivery (actor-less CI) naming ``pull_requests`` of the repository."""
    data = payload("check_run.completed")
    template = data["check_run"]["pull_requests"][0]
    data["check_run"]["pull_requests"] = [
        copy.deepcopy(template) | {"number": number} for number in pull_requests
    ]
    return data


def _shape_pr(
    pr: dict[str, Any],
    number: int,
    body: str,
    head_ref: str,
    repository: str,
    head_repository: str | None,
) -> None:
    pr["number"] = number
    pr["body"] = body
    pr["head"]["ref"] = head_ref
    pr["head"]["repo"]["full_name"] = head_repository or repository
    pr["base"]["repo"]["full_name"] = repository


# --- state of one store technology ------------------------------------------------------------


@dataclass
class Backend:
    """The durable state a deployment works on, of one store technology."""

    name: str
    store: Store
    work_items: WorkItemStore
    runners: RunnerRegistry
    sqlite_path: Path | None = None


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Empty ledger, work items and runners: SQLite in ``tmp_path``, or Firestore (emulator)."""
    if request.param == "firestore":
        yield Backend(
            "firestore",
            request.getfixturevalue("firestore_store"),
            request.getfixturevalue("firestore_work_item_store"),
            request.getfixturevalue("firestore_runner_registry"),
        )
        return
    path = tmp_path / "store.db"
    store, items, runners = (
        SqliteStore(path),
        SqliteWorkItemStore(path),
        SqliteRunnerRegistry(path),
    )
    yield Backend("sqlite", store, items, runners, sqlite_path=path)
    for each in (store, items, runners):
        each.close()


# --- one deployment ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """A delivery this test sent: its id, the worker's answer, and the comment it carried."""

    delivery_id: str
    status: int
    answer: dict[str, Any]
    comment_id: int | None = None


@dataclass
class Relay:
    """One worker deployment over ``backend``, with read-back helpers for assertions."""

    url: str
    backend: Backend
    github: FakeGitHub
    clock: TickingClock
    config: Config
    delivery_numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    # -- sending ---------------------------------------------------------------------------

    def deliver(
        self, event: str, data: dict[str, Any], *, delivery_id: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Project ``data`` as ingress does and POST the envelope to the worker as the queue
        would; return the status and JSON answer."""
        envelope = project_envelope(
            event=event,
            delivery_id=delivery_id or self.new_delivery_id(),
            payload=data,
            max_text_chars=MAX_TEXT_CHARS,
        )
        response = requests.post(
            self.url,
            data=envelope.model_dump_json().encode(),
            headers={"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"},
            timeout=30,
        )
        answer: dict[str, Any] = response.json()
        return response.status_code, answer

    def send(self, event: str, data: dict[str, Any], *, comment_id: int | None = None) -> Sent:
        """Deliver under a fresh delivery id and return what was sent and answered."""
        delivery_id = self.new_delivery_id()
        status, answer = self.deliver(event, data, delivery_id=delivery_id)
        assert status == 200, f"the worker answered {status} {answer}"
        return Sent(delivery_id, status, answer, comment_id)

    def new_delivery_id(self) -> str:
        return f"d-{next(self.delivery_numbers):04d}-72d3162e-cc78-11e3"

    def comment(
        self,
        body: str,
        *,
        author: str | None = "Codertocat",
        number: int = 1,
        on_pull_request: bool = False,
        labels: tuple[str, ...] = (),
    ) -> Sent:
        """Post ``body`` on the fake GitHub as ``author``, then deliver its ``issue_comment``."""
        comment_id = self.github.add_comment(body, number=number, author=author, repository=REPO)
        data = comment_payload(
            body,
            comment_id=comment_id,
            author=author,
            number=number,
            on_pull_request=on_pull_request,
            labels=labels,
        )
        return self.send("issue_comment", data, comment_id=comment_id)

    def review_comment(self, body: str, *, number: int = 2, **pr: Any) -> Sent:
        """Post a review comment on PR ``number`` on the fake, then deliver it."""
        comment_id = self.github.add_comment(body, number=number, kind="review", repository=REPO)
        data = review_comment_payload(body, comment_id=comment_id, number=number, **pr)
        return self.send("pull_request_review_comment", data, comment_id=comment_id)

    def arm(self, number: int = 1) -> Sent:
        """An authorized user adds the auto-execute label to issue ``number``."""
        data = issue_payload("labeled", number=number, labels=(AUTO_LABEL,), label=AUTO_LABEL)
        return self.send("issues", data)

    def given_armed(self, number: int = 1) -> WorkItemRecord:
        """Given issue ``number`` armed earlier (its label added): the work item is written
        straight to the store, which saves a delivery where the label is not the subject."""
        item = WorkItemRecord(
            ref=ref(number), repository=REPO, number=number, control="armed", updated_at=NOW
        )
        assert self.backend.work_items.save_work_item(item, expected_version=0)
        return item

    def start(self, number: int = 1) -> DispatchRecord:
        """Given issue ``number`` armed, an authorized ``the-loop start`` comment starts it;
        return the spawn dispatch of its session."""
        self.given_armed(number)
        sent = self.comment("the-loop start", number=number)
        [spawn] = self.dispatches(number, delivery_id=sent.delivery_id)
        assert spawn.kind == "spawn"
        return spawn

    def link_pull_request(self, pr: int = 2, *, issue: int = 1) -> Sent:
        """PR ``pr`` is opened with ``Closes #issue`` in its body."""
        return self.send("pull_request", pr_payload("opened", number=pr, body=f"Closes #{issue}"))

    def runner_holds(
        self, number: int = 1, *, workspace: bool, labels: dict[str, str] | None = None
    ) -> RunnerRecord:
        """A runner registers (with a workspace root or not), leases the latest spawn of issue
        ``number``'s session and reports it spawned: the session now lives on that runner."""
        runner = RunnerRecord(
            runner_id=f"runner-{number}-{'ws' if workspace else 'plain'}",
            name=f"laptop-{number}",
            labels=labels or {},
            secret_hash="sha256:unused",
            registered_at=self.clock.now(),
        )
        self.backend.runners.add_runner(runner)
        self.backend.runners.record_heartbeat(
            runner.runner_id,
            at=self.clock.now(),
            status=RunnerStatus(repositories=(REPO,), workspace=workspace),
        )
        spawn = [
            d for d in self.dispatches(number) if d.kind == "spawn" and d.endpoint == ref(number)
        ]
        progress = Progress(
            work_items=self.backend.work_items,
            store=self.backend.store,
            github=None,
            clock=self.clock,
        )
        spawned = ResultBody(dispatch_id=spawn[-1].dispatch_id, status="spawned")
        announce = progress.place_session(spawn[-1], runner, spawned, "succeeded")
        progress.record(spawn[-1], runner, spawned, final_status="succeeded", announce=announce)
        stored = self.backend.runners.get_runner(runner.runner_id)
        assert stored is not None
        return stored

    # -- reading back ----------------------------------------------------------------------

    def ledger(self, delivery_id: str) -> DeliveryRecord:
        record = self.backend.store.get_delivery(delivery_id)
        assert record is not None, f"no ledger record for {delivery_id}"
        return record

    def events(
        self, name: str | None = None, *, delivery_id: str | None = None
    ) -> list[EventRecord]:
        return self.backend.store.list_events(name=name, delivery_id=delivery_id)

    def event_names(self, delivery_id: str) -> list[str]:
        return [event.name for event in self.events(delivery_id=delivery_id)]

    def item(self, number: int = 1, repository: str = REPO) -> WorkItemRecord | None:
        return self.backend.work_items.get_work_item(ref(number, repository))

    def must_item(self, number: int = 1, repository: str = REPO) -> WorkItemRecord:
        item = self.item(number, repository)
        assert item is not None, f"no work item {ref(number, repository)}"
        return item

    def dispatches(
        self, number: int | None = None, *, delivery_id: str | None = None
    ) -> list[DispatchRecord]:
        """Dispatches (of issue ``number``'s work item, of one delivery), in ``seq`` order."""
        found = self.backend.work_items.list_dispatches(
            work_item=ref(number) if number is not None else None
        )
        return sorted(
            (d for d in found if delivery_id is None or d.delivery_id == delivery_id),
            key=lambda d: (d.work_item, d.seq),
        )

    def comments(self, number: int = 1) -> list[FakeComment]:
        """Comments on issue ``number`` on the fake GitHub, oldest first."""
        return self.github.on(number, REPO)

    def ours(self, number: int = 1) -> list[FakeComment]:
        """The comments looprelay's own bot posted on ``number``."""
        return [c for c in self.comments(number) if c.author == APP_LOGIN]

    def reactions(self, comment_id: int) -> list[str]:
        return [content for _, content in self.github.comments[comment_id].reactions]


MakeRelay = Callable[..., Relay]


class _Switchboard:
    """One HTTP server for the session; each deployment's worker gets a path of its own.

    Starting and stopping a server per test would add its start-up to every test; the
    requests still travel over real HTTP to the worker (``app.worker_http``).
    """

    def __init__(self) -> None:
        self.base = ""  # set once the server is bound
        self._handlers: dict[str, Callable[[Request], Response]] = {}
        self._paths = itertools.count(1)
        self._lock = threading.Lock()

    def mount(self, handler: Callable[[Request], Response]) -> str:
        """Serve ``handler`` on a new path; return its URL."""
        path = f"/worker/{next(self._paths)}"
        with self._lock:
            self._handlers[path] = handler
        return self.base + path

    def unmount(self, url: str) -> None:
        with self._lock:
            self._handlers.pop(url.removeprefix(self.base), None)

    def __call__(self, request: Request) -> Response:
        with self._lock:
            handler = self._handlers.get(request.path)
        if handler is None:
            return json_response(404, {"error": "no worker mounted here"})
        return handler(request)


@pytest.fixture(scope="session")
def switchboard() -> Iterator[_Switchboard]:
    """The session's loopback HTTP server for worker deployments."""
    board = _Switchboard()
    server = AppServer(prefixes={"/worker/": board}, max_body_bytes=2_000_000)
    board.base = server.url
    server.start()
    yield board
    server.stop()


@pytest.fixture
def relay(
    backend: Backend, fake_github: FakeGitHub, switchboard: _Switchboard, tmp_path: Path
) -> Iterator[MakeRelay]:
    """Build a deployment over ``backend``: ``relay(**routing_overrides)``.

    The routing config starts from ``authorizedUsers: [octocat, codertocat]`` and the fake
    GitHub's token login as ``botLogins``; keyword arguments override ``RoutingConfig`` fields.
    """
    fake_github.repositories |= {REPO, OTHER_REPOSITORY.lower()}
    fake_github.tokens[TOKEN] = APP_LOGIN
    mounted: list[str] = []
    clock = TickingClock()
    delivery_numbers = itertools.count(1)  # shared, so a reconfigured relay never reuses an id

    def _make(**overrides: Any) -> Relay:
        routing = RoutingConfig(
            **({"authorized_users": AUTHORIZED, "bot_logins": [APP_LOGIN]} | overrides)
        )
        store_config = StoreConfig(sqlite=SqliteConfig(path=str(backend.sqlite_path or "")))
        config = Config(routing=routing, store=store_config)
        github = GitHubRest(api_url=fake_github.url, auth=TokenAuth(TOKEN), sleep=lambda _: None)
        router = _router(config, backend, clock, github, tmp_path)
        worker = Worker(
            store=backend.store,
            authenticator=SharedSecretAuthenticator(SECRET),
            clock=clock,
            handler=router,
        )
        url = switchboard.mount(worker_handler(worker))
        mounted.append(url)
        return Relay(url, backend, fake_github, clock, config, delivery_numbers)

    yield _make
    for url in mounted:
        switchboard.unmount(url)


def _router(
    config: Config, backend: Backend, clock: TickingClock, github: GitHubRest, data_dir: Path
) -> Router:
    if backend.name == "sqlite":
        # The production wiring: it opens its own connections to the same database file.
        return build_router(
            config, store=backend.store, clock=clock, data_dir=data_dir, github=github, waker=None
        )
    # build_router opens Firestore from config; the emulator fixtures' stores are used instead.
    return Router(
        store=backend.store,
        work_items=backend.work_items,
        runners=backend.runners,
        github=github,
        policy=routing_policy(config.routing),
        templates=TemplateSource(config.routing),
        clock=clock,
    )
