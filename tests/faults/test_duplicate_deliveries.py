"""Fault: the same delivery id arriving 5 times, at once and spread over minutes and days.

Each copy is queued under a task name of its own (a resend may follow a task that died with its
name still reserved: ``core.tasknames``), so deduplicating is the worker's delivery ledger's
job: one copy runs, the others are no-ops (``already-settled``).

Concurrently: a real ``looprelay up``, 5 threads posting each delivery at the same moment; one
dispatch.

Spread over time: ``Ingress``, the ``SqliteQueue`` (its clock injected and moved by the
test), the ``Worker`` and the real ``Router`` on SQLite, in-process over loopback HTTP: inside
and after the queue's dedup window (``queue.embedded.dedupWindowSeconds``), one dispatch and
one 👀.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from looprelay.adapters.clock import SystemClock
from looprelay.adapters.github.auth import TokenAuth
from looprelay.adapters.github.rest import GitHubRest
from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator
from looprelay.adapters.sqlite.queue import SqliteQueue
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.app.ingress_http import webhook_handler
from looprelay.app.services import build_router
from looprelay.app.worker_http import worker_handler
from looprelay.cli.sender import post_delivery
from looprelay.config.model import Config, EmbeddedQueueConfig, RetryConfig, RoutingConfig
from looprelay.service.ingress import Ingress
from looprelay.service.worker import Worker
from tests.app_server import AppServer
from tests.fake_github import APP_LOGIN, FakeGitHub
from tests.fake_harness import wait_until
from tests.faults.deliveries import (
    AUTHORIZED,
    GITHUB_TOKEN,
    Delivery,
    Outcomes,
    Up,
    assert_exactly_once,
    send_all,
    wait_settled,
    workload,
    write_config,
)

COPIES = 5
WEBHOOK_SECRET = b"duplicates-webhook-secret"
WORKER_SECRET = "duplicates-worker-secret"
HOUR = 3600.0


def _post_copies(url: str, secret: bytes, item: Delivery) -> list[str]:
    """POST ``item`` ``COPIES`` times from as many threads released at once; return what the
    webhook said of each (``queued`` or ``duplicate``)."""
    barrier = threading.Barrier(COPIES)

    def one(_: int) -> str:
        barrier.wait()
        status, text = post_delivery(
            url=url, event=item.event, body=item.body, secret=secret, delivery_id=item.delivery_id
        )
        assert status == 202, text
        return "queued" if '"queued"' in text else "duplicate"

    with ThreadPoolExecutor(COPIES) as pool:
        return list(pool.map(one, range(COPIES)))


class TestConcurrentCopies:
    def test_five_copies_at_once_are_queued_and_dispatched_once(
        self, tmp_path: Path, fake_github: FakeGitHub, running: list[Up]
    ) -> None:
        data_dir = tmp_path / "data"
        config = write_config(tmp_path / "looprelay.yaml", fake_github)
        load = workload(fake_github, issues=2, comments_per_issue=5)
        up = Up(data_dir, config)
        running.append(up)
        assert send_all(up.webhook_url, up.secret, load.starts) == [202, 202]
        wait_settled(data_dir, [d.delivery_id for d in load.starts])

        said = {
            d.delivery_id: Counter(_post_copies(up.webhook_url, up.secret, d)) for d in load.all
        }

        expected = Counter({"queued": COPIES})
        comments = {d.delivery_id for d in load.comments}
        assert {k: v for k, v in said.items() if k in comments} == dict.fromkeys(comments, expected)
        outcomes = wait_settled(data_dir, [d.delivery_id for d in load.all])
        assert_exactly_once(outcomes, load.all, github=fake_github)


class _Time:
    """The queue's clock (seconds since the epoch), moved by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class TestCopiesSpreadOverTime:
    @pytest.fixture
    def stack(self, tmp_path: Path, fake_github: FakeGitHub) -> Iterator[tuple[str, _Time, Path]]:
        """Webhook and worker on one loopback server; the queue's clock is the test's."""
        fake_github.tokens[GITHUB_TOKEN] = APP_LOGIN
        routing = RoutingConfig(
            authorized_users=[AUTHORIZED],
            bot_logins=[APP_LOGIN],
            control={"require_start_command": False},
        )
        config = Config(routing=routing)
        store = SqliteStore(tmp_path / "looprelay.db")
        github = GitHubRest(api_url=fake_github.url, auth=TokenAuth(GITHUB_TOKEN))
        router = build_router(
            config, store=store, clock=SystemClock(), data_dir=tmp_path, github=github, waker=None
        )
        worker = Worker(
            store=store,
            authenticator=SharedSecretAuthenticator(WORKER_SECRET),
            clock=SystemClock(),
            handler=router,
        )
        clock = _Time()
        queue = SqliteQueue(
            tmp_path / "queue.db",
            retry=RetryConfig(min_backoff_seconds=0.05),
            settings=EmbeddedQueueConfig(concurrency=2),
            now=clock,
        )
        ingress = Ingress(secrets=[WEBHOOK_SECRET], queue=queue, config=config.webhook)
        server = AppServer(
            exact={"/webhook": webhook_handler(ingress), "/worker": worker_handler(worker)},
            max_body_bytes=1_000_000,
        )
        server.start()
        host, port = server.address
        queue.start(worker_url=f"http://{host}:{port}/worker", auth_token=WORKER_SECRET)
        yield f"http://{host}:{port}/webhook", clock, tmp_path
        server.stop()
        queue.close()
        store.close()

    def test_inside_the_window_and_after_it_the_ledger_keeps_one(
        self, stack: tuple[str, _Time, Path], fake_github: FakeGitHub
    ) -> None:
        url, clock, data_dir = stack
        load = workload(fake_github, issues=2, comments_per_issue=4)
        assert send_all(url, WEBHOOK_SECRET, load.starts) == [202, 202]
        _wait_done(data_dir, load.starts, clock)
        # (seconds after the first send, what the webhook says): 2 inside the hour, 2 after it.
        schedule = [(0.0, "queued"), (60.0, "queued"), (1_800.0, "queued")]
        schedule += [(HOUR + 60.0, "queued"), (3 * 24 * HOUR, "queued")]
        said: list[list[str]] = []
        start = clock.now
        for offset, _ in schedule:
            clock.advance(start + offset - clock.now)
            said.append([_said(url, item) for item in load.comments])
            _wait_done(data_dir, load.comments, clock)

        assert said == [[expected] * len(load.comments) for _, expected in schedule]
        outcomes = Outcomes.read(data_dir, fake_github)
        assert_exactly_once(outcomes, load.all, github=fake_github)


def _said(url: str, item: Delivery) -> str:
    status, text = post_delivery(
        url=url,
        event=item.event,
        body=item.body,
        secret=WEBHOOK_SECRET,
        delivery_id=item.delivery_id,
    )
    assert status == 202, text
    return "queued" if '"queued"' in text else "duplicate"


def _wait_done(data_dir: Path, items: tuple[Delivery, ...], clock: _Time) -> None:
    """Wait until the queue finished every task and the ledger settled every delivery. The
    queue's clock moves on to each retry it waits for (an attempt that found its issue's
    inbox held is retried after the inbox's lease), as time would."""

    def done() -> bool:
        outcomes = Outcomes.read(data_dir)
        busy = [t for t in outcomes.tasks if t.state != "done"]
        later = [t.eta for t in busy if t.state == "pending" and t.eta > clock.now]
        if later:
            clock.advance(min(later) - clock.now)
        return not busy and {d.delivery_id for d in items} <= outcomes.settled_ids()

    wait_until(done, seconds=30, what="the queue to drain")
