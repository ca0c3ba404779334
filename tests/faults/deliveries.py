"""What the fault suite sends and how it reads back what happened.

A *workload* is a set of signed deliveries for a few issues of the fixtures' repository: per
issue an authorized ``labeled`` delivery (with ``requireStartCommand`` off, the label starts
the work item: one ``spawn`` dispatch and one checklist comment on GitHub), then authorized
comments, each routed into the live session as one ``deliver`` dispatch with a 👀 reaction.
:class:`Outcomes` reads the data directory of ``looprelay up`` (the SQLite store and the
embedded queue's file) and :func:`assert_exactly_once` states what every fault test demands.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from looprelay.adapters.sqlite.queue import QueuedTask, SqliteQueue
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore
from looprelay.cli.sender import post_delivery
from looprelay.config.model import EmbeddedQueueConfig, RetryConfig
from looprelay.core.model import DeliveryRecord, DispatchRecord
from looprelay.core.signature import sign_body
from looprelay.datadir import QUEUE_FILE, STORE_FILE, WEBHOOK_SECRET_FILE, read_secret
from tests.fake_github import APP_LOGIN, FakeComment, FakeGitHub
from tests.fake_harness import wait_until
from tests.samples import payload
from tests.test_up import UpProcess

REPOSITORY = "Codertocat/Hello-World"
"""The repository as the fixtures spell it."""
REPO = REPOSITORY.lower()
"""The same repository as looprelay keeps it."""
AUTHORIZED = "Codertocat"
AUTO_LABEL = "the-loop: auto-execute"
GITHUB_TOKEN_ENV = "LOOPRELAY_FAULTS_GH_TOKEN"
GITHUB_TOKEN = "ghp_faults_suite"
SETTLE_TIMEOUT = 60.0
BOOT = [sys.executable, "-m", "tests.faults.boot"]
ROOT = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def ref(number: int) -> str:
    """The work-item ref of issue ``number``."""
    return f"github:{REPO}#{number}"


# --- payloads ----------------------------------------------------------------------------------


def labeled_payload(number: int) -> dict[str, Any]:
    """The auto-execute label added to issue ``number`` by the authorized user."""
    data = payload("issues.labeled")
    data["issue"]["number"] = number
    data["label"]["name"] = AUTO_LABEL
    data["issue"]["labels"] = [data["label"]]
    return data


def opened_payload(number: int) -> dict[str, Any]:
    """Issue ``number`` opened by the authorized user, already carrying the label."""
    data = payload("issues.opened")
    data["issue"]["number"] = number
    label = payload("issues.labeled")["label"] | {"name": AUTO_LABEL}
    data["issue"]["labels"] = [label]
    return data


def comment_payload(
    number: int, comment_id: int, body: str, *, action: str = "created"
) -> dict[str, Any]:
    """An authorized comment ``comment_id`` on issue ``number``."""
    data = payload("issue_comment.created")
    data["action"] = action
    data["issue"]["number"] = number
    data["issue"]["labels"] = []
    data["comment"]["id"] = comment_id
    data["comment"]["body"] = body
    if action == "edited":
        data["changes"] = {"body": {"from": "before the edit"}}
    return data


@dataclass(frozen=True)
class Delivery:
    """One signed delivery to send: its id, event and exact body."""

    delivery_id: str
    event: str
    body: bytes
    number: int
    routes: bool = False
    """Whether it must end in exactly one dispatch (and, for a comment, one 👀)."""
    comment_id: int | None = None


def delivery(
    event: str, data: dict[str, Any], *, number: int, routes: bool, prefix: str = "d"
) -> Delivery:
    """Wrap ``data`` as a delivery with a fresh id."""
    comment = data.get("comment")
    return Delivery(
        delivery_id=f"{prefix}-{uuid.uuid4().hex[:12]}",
        event=event,
        body=json.dumps(data).encode(),
        number=number,
        routes=routes,
        comment_id=comment["id"] if event == "issue_comment" and comment else None,
    )


@dataclass(frozen=True)
class Workload:
    """Deliveries to send in two waves: the starts, then the comments routed into sessions."""

    starts: tuple[Delivery, ...]
    comments: tuple[Delivery, ...]

    @property
    def all(self) -> tuple[Delivery, ...]:
        return (*self.starts, *self.comments)

    @property
    def numbers(self) -> list[int]:
        return sorted({d.number for d in self.starts})


def workload(
    github: FakeGitHub, *, issues: int, comments_per_issue: int, first_issue: int = 1
) -> Workload:
    """``issues`` labelled issues and ``comments_per_issue`` comments on each, the comments
    posted on the fake GitHub first (so reactions have something to land on)."""
    github.repositories.add(REPO)
    numbers = range(first_issue, first_issue + issues)
    starts = tuple(
        delivery("issues", labeled_payload(n), number=n, routes=True, prefix="d-start")
        for n in numbers
    )
    comments = []
    for n in numbers:
        for index in range(comments_per_issue):
            body = f"Comment {index} on #{n}: please look at the parser."
            comment_id = github.add_comment(body, number=n, author=AUTHORIZED, repository=REPO)
            comments.append(
                delivery(
                    "issue_comment",
                    comment_payload(n, comment_id, body),
                    number=n,
                    routes=True,
                    prefix="d-comment",
                )
            )
    return Workload(starts, tuple(comments))


def send(url: str, secret: bytes, item: Delivery) -> int:
    """POST one delivery, signed as GitHub does; return the HTTP status."""
    status, _ = post_delivery(
        url=url, event=item.event, body=item.body, secret=secret, delivery_id=item.delivery_id
    )
    return status


def send_all(url: str, secret: bytes, items: Iterable[Delivery], *, threads: int = 8) -> list[int]:
    """POST deliveries from ``threads`` threads at once; return the statuses in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda item: send(url, secret, item), items))


def burst(
    url: str, secret: bytes, items: Sequence[Delivery], *, connections: int = 4
) -> tuple[list[int], float]:
    """POST ``items`` as fast as ``connections`` keep-alive connections go (as ``wrk`` does),
    each taking every ``connections``-th item; return the statuses in order and the acks a
    second the burst reached (for the report, never asserted)."""
    import http.client
    import time
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlsplit

    split = urlsplit(url)
    statuses = [0] * len(items)

    def one_connection(first: int) -> None:
        connection = http.client.HTTPConnection(split.hostname, split.port, timeout=30)
        try:
            for index in range(first, len(items), connections):
                item = items[index]
                connection.request(
                    "POST",
                    split.path,
                    body=item.body,
                    headers={
                        "Content-Type": "application/json",
                        "X-GitHub-Event": item.event,
                        "X-GitHub-Delivery": item.delivery_id,
                        "X-Hub-Signature-256": sign_body(item.body, secret),
                    },
                )
                response = connection.getresponse()
                response.read()
                statuses[index] = response.status
        finally:
            connection.close()

    started = time.monotonic()
    with ThreadPoolExecutor(connections) as pool:
        list(pool.map(one_connection, range(connections)))
    return statuses, len(items) / (time.monotonic() - started)


# --- config and processes ------------------------------------------------------------------


def write_config(path: Path, github: FakeGitHub, **queue: Any) -> Path:
    """A config routing the authorized user's events, GitHub pointed at the fake (the token's
    login is looprelay's own bot), and ``queue`` merged into ``queue.embedded``-level keys."""
    github.tokens[GITHUB_TOKEN] = APP_LOGIN
    config: dict[str, Any] = {
        "github": {"apiUrl": github.url, "tokenEnv": GITHUB_TOKEN_ENV},
        "routing": {
            "authorizedUsers": [AUTHORIZED],
            "botLogins": [APP_LOGIN],
            "control": {"requireStartCommand": False},
        },
        "queue": {"retry": {"minBackoffSeconds": 0.05, "maxBackoffSeconds": 0.5}} | queue,
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


class Up(UpProcess):
    """``looprelay up`` started through the fault boot wrapper, on a free port."""

    def __init__(
        self,
        data_dir: Path,
        config: Path,
        *,
        fault: str = "",
        store_fault: str = "",
        queue_fault: str = "",
    ) -> None:
        env = os.environ | {
            GITHUB_TOKEN_ENV: GITHUB_TOKEN,
            "LOOPRELAY_FAULT": fault,
            "LOOPRELAY_STORE_FAULT": store_fault,
            "LOOPRELAY_QUEUE_FAULT": queue_fault,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        super().__init__(data_dir, "--config", str(config), command=BOOT, env=env)
        self.secret = read_secret(data_dir / WEBHOOK_SECRET_FILE).encode()

    def wait_exit(self, timeout: float = SETTLE_TIMEOUT) -> int:
        """Wait for the process to end on its own (a fault killed it)."""
        code = self.proc.wait(timeout)
        self._stderr.close()
        return code

    def stop(self, sig: int = signal.SIGKILL, timeout: float = 15.0) -> int:
        """Stop it with ``sig`` (SIGKILL by default: nothing finishes) and wait."""
        return super().stop(sig, timeout)

    def log(self) -> str:
        return self.stderr_path.read_text()


# --- reading back ----------------------------------------------------------------------------


@dataclass
class Outcomes:
    """Everything the data directory says happened, read in one go."""

    ledger: list[DeliveryRecord]
    settled_events: Counter[str]
    dispatches: list[DispatchRecord]
    tasks: list[QueuedTask]
    comments: list[FakeComment] = field(default_factory=list)

    @classmethod
    def read(cls, data_dir: Path, github: FakeGitHub | None = None) -> Outcomes:
        store = SqliteStore(data_dir / STORE_FILE)
        items = SqliteWorkItemStore(data_dir / STORE_FILE)
        queue = SqliteQueue(
            data_dir / QUEUE_FILE, retry=RetryConfig(), settings=EmbeddedQueueConfig()
        )
        try:
            # The ledger first: a settle writes its event in the same commit, so every delivery
            # read as settled here has its event in the reads below (read the other way round,
            # a settle landing between the two reads looked like a lost event).
            ledger = store.list_deliveries(limit=100_000)
            settled = Counter(
                e.delivery_id or ""
                for e in store.list_events(name="delivery.settled", limit=100_000)
            )
            return cls(
                ledger=ledger,
                settled_events=settled,
                dispatches=items.list_dispatches(limit=100_000),
                tasks=queue.list_tasks(limit=100_000),
                comments=list(github.comments.values()) if github else [],
            )
        finally:
            store.close()
            items.close()
            queue.close()

    def settled_ids(self) -> set[str]:
        return {row.delivery_id for row in self.ledger if row.settled}

    def outcome(self, delivery_id: str) -> str | None:
        return next((r.outcome for r in self.ledger if r.delivery_id == delivery_id), None)


def wait_settled(
    data_dir: Path, ids: Iterable[str], *, timeout: float = SETTLE_TIMEOUT
) -> Outcomes:
    """Wait until every delivery of ``ids`` is settled and the queue holds nothing unfinished."""
    wanted = set(ids)

    def ready() -> Outcomes | None:
        outcomes = Outcomes.read(data_dir)
        unfinished = [t for t in outcomes.tasks if t.state in ("pending", "leased")]
        return outcomes if wanted <= outcomes.settled_ids() and not unfinished else None

    return wait_until(ready, seconds=timeout, what=f"{len(wanted)} deliveries to settle")


def assert_exactly_once(
    outcomes: Outcomes, sent: Sequence[Delivery], *, github: FakeGitHub | None = None
) -> None:
    """What every fault must leave behind (SPEC §5, "nothing is lost"):

    - one ledger row per delivery, settled, and one ``delivery.settled`` event each;
    - every queue task done (none leased, pending or dead);
    - one dispatch per routed delivery and none for the others; per work item one ``spawn``,
      and ``seq`` values that are unique;
    - a routed delivery settled ``dispatched``;
    - on GitHub, at most one checklist comment per started work item and a 👀 on every routed
      comment.
    """
    ids = [d.delivery_id for d in sent]
    rows = Counter(row.delivery_id for row in outcomes.ledger)
    assert {i: rows[i] for i in ids} == dict.fromkeys(ids, 1), "one ledger row per delivery"
    unsettled = [r.delivery_id for r in outcomes.ledger if not r.settled]
    assert unsettled == [], f"deliveries left unsettled: {unsettled}"
    off = {i: outcomes.settled_events[i] for i in ids if outcomes.settled_events[i] != 1}
    assert off == {}, f"one delivery.settled event per delivery; these had other counts: {off}"
    states = Counter(task.state for task in outcomes.tasks)
    assert set(states) <= {"done"}, f"queue tasks not done: {states}"
    per_delivery = Counter(d.delivery_id for d in outcomes.dispatches)
    expected = {d.delivery_id: 1 if d.routes else 0 for d in sent}
    assert {i: per_delivery[i] for i in ids} == expected, "one dispatch per routed delivery"
    wrong = {
        d.delivery_id: outcomes.outcome(d.delivery_id)
        for d in sent
        if d.routes and outcomes.outcome(d.delivery_id) != "dispatched"
    }
    assert wrong == {}, "a delivery that made a dispatch is settled as dispatched"
    by_item: dict[str, list[DispatchRecord]] = {}
    for dispatch in outcomes.dispatches:
        by_item.setdefault(dispatch.work_item, []).append(dispatch)
    for work_item, dispatches in by_item.items():
        kinds = Counter(d.kind for d in dispatches)
        assert kinds["spawn"] == 1, f"{work_item}: {kinds}"
        seqs = [d.seq for d in dispatches]
        assert len(set(seqs)) == len(seqs), f"{work_item}: seq reused {sorted(seqs)}"
    if github is not None:
        _assert_github_effects(github, sent, started=sorted(by_item))


def _assert_github_effects(
    github: FakeGitHub, sent: Sequence[Delivery], started: list[str]
) -> None:
    numbers = sorted({int(item.rpartition("#")[2]) for item in started})
    checklists = Counter(
        c.number for c in github.comments.values() if c.author == APP_LOGIN and "- [" in c.body
    )
    # At most one: a worker killed between the save and GitHub leaves a started item without
    # its checklist (the retry must not post it, the first attempt might still be posting).
    assert set(checklists) <= set(numbers), "checklists only on started items"
    assert max(checklists.values(), default=1) == 1, f"one checklist per item: {checklists}"
    reacted = {
        d.delivery_id: [content for _, content in github.comments[d.comment_id].reactions]
        for d in sent
        if d.comment_id is not None and d.routes
    }
    assert reacted == {key: ["eyes"] for key in reacted}, "one 👀 on every routed comment"


def seeded_random(name: str) -> random.Random:
    """A ``random.Random`` for the test ``name``, printing its seed so a run can be repeated.

    ``LOOPRELAY_FAULT_SEED`` unset: a seed fixed per test (CI sees the same draw every run);
    a number: that seed; ``random``: a fresh draw each run, for exploring locally.
    """
    chosen = os.environ.get("LOOPRELAY_FAULT_SEED", "")
    if chosen == "random":
        seed = random.SystemRandom().randrange(2**32)
    else:
        seed = int(chosen) if chosen else zlib.crc32(name.encode())
    print(f"{name}: LOOPRELAY_FAULT_SEED={seed}")
    return random.Random(seed)
