"""Fault: the store failing transiently, at the adapter boundary.

SQLite, in a real ``looprelay up`` (``tests.faults.boot``): every 3rd call of the ledger's and
the work items' adapter methods fails for a while, either inside the connection with
``sqlite3.OperationalError("database is locked")`` (translated by the adapter as the real error
would be) or with ``looprelay.errors.Transient`` from the method, with a little latency on every
call. The worker answers 503, the embedded queue retries, and in the end every delivery settles
once with every effect once. When the queue's own store fails, the webhook answers 503 and
GitHub's redelivery (the test sends again) is accepted once.

Firestore, in-process on the emulator: the Firestore client's reads and commits raise
``ServiceUnavailable``, ``Aborted`` or ``DeadlineExceeded`` every 3rd call for a while, and
one commit in every few lands *and then* reports ``DeadlineExceeded`` (an ambiguous commit,
which a network deadline can produce). The queue is played by re-sending each task until the
worker answers 2xx.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud.firestore_v1.batch import WriteBatch
from google.cloud.firestore_v1.document import DocumentReference

from looprelay.adapters.clock import SystemClock
from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry
from looprelay.adapters.firestore.store import FirestoreStore
from looprelay.adapters.firestore.work_items import FirestoreWorkItemStore
from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator
from looprelay.app.messages import Request
from looprelay.app.worker_http import worker_handler
from looprelay.config.model import RoutingConfig
from looprelay.config.routing import TemplateSource, routing_policy
from looprelay.core.envelope import project_envelope
from looprelay.service.route import Router
from looprelay.service.worker import Worker
from tests.fake_github import FakeGitHub
from tests.faults.deliveries import (
    AUTHORIZED,
    Delivery,
    Outcomes,
    Up,
    assert_exactly_once,
    ref,
    send,
    send_all,
    wait_settled,
    workload,
    write_config,
)

WORKER_SECRET = "store-faults-worker-secret"


def _retried(outcomes: Outcomes) -> int:
    """Tasks the queue had to send more than once (the worker answered 5xx)."""
    return sum(1 for task in outcomes.tasks if task.attempts > 1)


class TestSqliteStoreFailing:
    @pytest.mark.parametrize("kind", ["locked", "transient"])
    def test_the_worker_answers_5xx_and_every_delivery_settles_once(
        self, kind: str, tmp_path: Path, fake_github: FakeGitHub, running: list[Up]
    ) -> None:
        data_dir = tmp_path / "data"
        config = write_config(tmp_path / "looprelay.yaml", fake_github)
        load = workload(fake_github, issues=3, comments_per_issue=8)
        up = Up(data_dir, config, store_fault=f"{kind}:3:45:0.002")
        running.append(up)
        assert send_all(up.webhook_url, up.secret, load.starts) == [202] * len(load.starts)
        wait_settled(data_dir, [d.delivery_id for d in load.starts])
        assert send_all(up.webhook_url, up.secret, load.comments) == [202] * len(load.comments)

        outcomes = wait_settled(data_dir, [d.delivery_id for d in load.all])
        assert_exactly_once(outcomes, load.all, github=fake_github)
        assert _retried(outcomes) > 0, "no store call failed: the fault never fired"
        assert "transient failure, the queue will retry" in up.log()

    def test_the_webhook_answers_503_when_the_queue_fails_and_a_redelivery_is_taken_once(
        self, tmp_path: Path, fake_github: FakeGitHub, running: list[Up]
    ) -> None:
        data_dir = tmp_path / "data"
        config = write_config(tmp_path / "looprelay.yaml", fake_github)
        load = workload(fake_github, issues=2, comments_per_issue=10)
        up = Up(data_dir, config, store_fault="queue:2:24")
        running.append(up)
        refused: Counter[int] = Counter()
        for wave in (load.starts, load.comments):
            pending = list(wave)
            for _ in range(5):  # GitHub's redelivery, asked for by the operator
                statuses = [send(up.webhook_url, up.secret, item) for item in pending]
                refused.update(status for status in statuses if status != 202)
                pending = [i for i, s in zip(pending, statuses, strict=True) if s != 202]
                if not pending:
                    break
            assert pending == []
            wait_settled(data_dir, [d.delivery_id for d in wave])

        assert refused == Counter({503: 12})
        outcomes = wait_settled(data_dir, [d.delivery_id for d in load.all])
        assert_exactly_once(outcomes, load.all, github=fake_github)


# --- Firestore, in-process --------------------------------------------------------------------


class _FlakyFirestore:
    """Makes the Firestore client fail: every ``every``-th read or commit of the first
    ``budget`` raises one of ``errors`` in turn, and every ``ambiguous``-th commit lands before
    raising ``DeadlineExceeded``."""

    ERRORS: tuple[type[gexc.GoogleAPICallError], ...] = (
        gexc.ServiceUnavailable,
        gexc.Aborted,
        gexc.DeadlineExceeded,
    )

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, every: int, budget: int) -> None:
        self._calls = itertools.count(1)
        self._lock = threading.Lock()
        self._every, self._budget = every, budget
        self._errors = itertools.cycle(self.ERRORS)
        self.injected: Counter[str] = Counter()
        get, commit = DocumentReference.get, WriteBatch.commit
        monkeypatch.setattr(DocumentReference, "get", self._failing(get, landed=False))
        monkeypatch.setattr(WriteBatch, "commit", self._failing(commit, landed=True))

    def stop(self) -> None:
        self._budget = 0

    def _failing(self, original: Callable[..., Any], *, landed: bool) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                number = next(self._calls)
                chosen = number <= self._budget and number % self._every == 0
                error = next(self._errors) if chosen else None
            if error is None:
                return original(*args, **kwargs)
            if landed and number % (self._every * 2) == 0:
                original(*args, **kwargs)  # the write lands, the answer is lost
                self.injected["ambiguous commit"] += 1
                raise gexc.DeadlineExceeded("injected: commit landed, answer lost")
            self.injected[error.__name__] += 1
            raise error(f"injected on call {number}")

        return call


@pytest.mark.firestore
class TestFirestoreStoreFailing:
    def test_client_errors_answer_5xx_and_every_delivery_settles_once(
        self,
        monkeypatch: pytest.MonkeyPatch,
        fake_github: FakeGitHub,
        firestore_store: FirestoreStore,
        firestore_work_item_store: FirestoreWorkItemStore,
        firestore_runner_registry: FirestoreRunnerRegistry,
    ) -> None:
        routing = RoutingConfig(
            authorized_users=[AUTHORIZED], control={"require_start_command": False}
        )
        router = Router(
            store=firestore_store,
            work_items=firestore_work_item_store,
            runners=firestore_runner_registry,
            github=None,
            policy=routing_policy(routing),
            templates=TemplateSource(routing),
            clock=SystemClock(),
        )
        worker = Worker(
            store=firestore_store,
            authenticator=SharedSecretAuthenticator(WORKER_SECRET),
            clock=SystemClock(),
            handler=router,
        )
        load = workload(fake_github, issues=2, comments_per_issue=9)
        flaky = _FlakyFirestore(monkeypatch, every=3, budget=90)
        answers: Counter[int] = Counter()
        for wave in (load.starts, load.comments):
            with ThreadPoolExecutor(4) as pool:
                for statuses in pool.map(lambda item: _until_2xx(worker, item), wave):
                    answers.update(statuses)
        flaky.stop()

        assert answers[503] > 0 and set(answers) <= {200, 503}, answers
        assert flaky.injected["ambiguous commit"] > 0, flaky.injected
        ledger = {d.delivery_id: firestore_store.get_delivery(d.delivery_id) for d in load.all}
        assert {key: (r.outcome if r else None) for key, r in ledger.items()} == dict.fromkeys(
            ledger, "dispatched"
        )
        settled = Counter(
            e.delivery_id for e in firestore_store.list_events(name="delivery.settled")
        )
        assert settled == Counter(dict.fromkeys(ledger, 1))
        dispatches = firestore_work_item_store.list_dispatches(limit=10_000)
        assert Counter(d.delivery_id for d in dispatches) == Counter(dict.fromkeys(ledger, 1))
        for number in load.numbers:
            item = firestore_work_item_store.get_work_item(ref(number))
            assert item is not None
            seqs = sorted(d.seq for d in dispatches if d.work_item == item.ref)
            assert seqs == list(range(1, len(seqs) + 1)), f"{item.ref}: {seqs}"
            assert item.next_seq == len(seqs) + 1


def _until_2xx(worker: Worker, item: Delivery, attempts: int = 100) -> list[int]:
    """Play the queue: send the task until the worker answers 2xx; return every status."""
    envelope = project_envelope(
        event=item.event,
        delivery_id=item.delivery_id,
        payload=json.loads(item.body),
        max_text_chars=4_000,
    )
    request = Request(
        method="POST",
        path="/worker",
        headers={"authorization": f"Bearer {WORKER_SECRET}"},
        body=envelope.model_dump_json().encode(),
    )
    statuses = []
    for _ in range(attempts):
        statuses.append(worker_handler(worker)(request).status)
        if 200 <= statuses[-1] < 300:
            return statuses
    raise AssertionError(f"{item.delivery_id} never answered 2xx: {statuses}")
