"""Worker: queue tasks over real HTTP into a real SQLite ledger, handlers scripted per test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests

from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.app.messages import Request
from looprelay.app.worker_http import worker_handler
from looprelay.core.envelope import Envelope
from looprelay.core.model import DeliveryRecord
from looprelay.errors import Transient, Unauthorized
from looprelay.service.worker import Outcome, Worker
from tests.app_server import AppServer

SECRET = "worker-secret-abc"
DELIVERY_ID = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
BODY = Envelope(delivery_id=DELIVERY_ID, event="issue_comment", action="created").model_dump_json()
DISPATCHED = Outcome("dispatched", "spawned github:octo/demo#7")


class FixedClock:
    """The ``Clock`` port, stopped at one moment the test can move."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


Step = Outcome | Exception | Callable[[], Outcome]


class ScriptedHandler:
    """A delivery handler answering from a script; the last step repeats once it runs out."""

    def __init__(self, *steps: Step) -> None:
        self._steps = list(steps)
        self._lock = threading.Lock()
        self.calls: list[tuple[str, int]] = []  # (delivery id, ledger attempts) per call

    def __call__(self, envelope: Envelope, record: DeliveryRecord) -> Outcome:
        with self._lock:
            self.calls.append((envelope.delivery_id, record.attempts))
            step = self._steps.pop(0) if len(self._steps) > 1 else self._steps[0]
        if isinstance(step, Exception):
            raise step
        return step() if callable(step) else step


@dataclass
class Deployment:
    """A worker served on a free loopback port, with its store and clock."""

    url: str
    store: SqliteStore
    clock: FixedClock
    handler: ScriptedHandler

    def post(
        self, body: str | bytes = BODY, *, token: str | None = SECRET, retry_count: int = 0
    ) -> requests.Response:
        headers = {
            "Content-Type": "application/json",
            "X-CloudTasks-TaskRetryCount": str(retry_count),
        }
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = body.encode() if isinstance(body, str) else body
        return requests.post(self.url, data=data, headers=headers, timeout=10)

    def event_names(self) -> list[str]:
        return [event.name for event in self.store.list_events(delivery_id=DELIVERY_ID)]

    def nothing_written(self) -> bool:
        return self.store.list_deliveries() == [] and self.store.list_events() == []


Deploy = Callable[..., Deployment]


@pytest.fixture
def deploy(tmp_path: Path) -> Iterator[Deploy]:
    """Build and serve a worker around a scripted handler; everything stops after the test."""
    started: list[tuple[AppServer, SqliteStore]] = []

    def _deploy(*steps: Step) -> Deployment:
        store = SqliteStore(tmp_path / "store.db")
        clock = FixedClock(NOW)
        handler = ScriptedHandler(*(steps or (DISPATCHED,)))
        worker = Worker(
            store=store,
            authenticator=SharedSecretAuthenticator(SECRET),
            clock=clock,
            handler=handler,
        )
        server = AppServer(exact={"/worker": worker_handler(worker)}, max_body_bytes=1_000_000)
        server.start()
        started.append((server, store))
        host, port = server.address
        return Deployment(f"http://{host}:{port}/worker", store, clock, handler)

    yield _deploy
    for server, store in started:
        server.stop()
        store.close()


class TestFirstDelivery:
    def test_it_is_settled_with_the_handlers_outcome_and_logged_once(self, deploy: Deploy) -> None:
        worker = deploy(DISPATCHED)

        response = worker.post()

        assert response.status_code == 200
        assert response.json() == {"status": "settled", "outcome": "dispatched"}
        record = worker.store.get_delivery(DELIVERY_ID)
        assert record is not None
        assert (record.outcome, record.detail) == ("dispatched", "spawned github:octo/demo#7")
        assert (record.event, record.action, record.attempts) == ("issue_comment", "created", 1)
        assert record.settled_at == NOW
        assert record.envelope == BODY  # kept, so a dead letter can be replayed
        assert worker.event_names() == ["delivery.received", "delivery.settled"]
        assert worker.handler.calls == [(DELIVERY_ID, 1)]

    def test_the_settled_event_says_what_happened(self, deploy: Deploy) -> None:
        worker = deploy(DISPATCHED)
        worker.post(retry_count=0)

        [settled] = worker.store.list_events(name="delivery.settled")
        assert settled.delivery_id == DELIVERY_ID
        assert settled.severity == "INFO"
        assert settled.data["outcome"] == "dispatched"
        assert settled.data["detail"] == "spawned github:octo/demo#7"


class TestRedelivery:
    @pytest.mark.parametrize("retry_count", [1, 0], ids=["queue-retry", "github-redelivery"])
    def test_a_settled_delivery_is_a_no_op(self, deploy: Deploy, retry_count: int) -> None:
        worker = deploy(DISPATCHED)
        worker.post()
        before = worker.store.get_delivery(DELIVERY_ID)
        worker.clock.at = datetime(2026, 5, 2, tzinfo=UTC)

        response = worker.post(retry_count=retry_count)

        assert response.status_code == 200
        assert response.json() == {"status": "already-settled", "outcome": "dispatched"}
        assert worker.handler.calls == [(DELIVERY_ID, 1)]
        assert worker.store.get_delivery(DELIVERY_ID) == before
        assert worker.event_names() == ["delivery.received", "delivery.settled"]


class TestTransientFailure:
    def test_it_answers_503_and_leaves_the_delivery_open_for_the_retry(
        self, deploy: Deploy
    ) -> None:
        worker = deploy(Transient("GitHub answered 502"), DISPATCHED)

        response = worker.post()

        assert response.status_code == 503
        assert "GitHub" not in response.text  # the queue needs the class, not our internals
        record = worker.store.get_delivery(DELIVERY_ID)
        assert record is not None
        assert (record.outcome, record.settled_at, record.attempts) == ("received", None, 1)
        assert worker.event_names() == ["delivery.received"]

    def test_a_later_retry_that_succeeds_settles_it_and_attempts_count_both(
        self, deploy: Deploy
    ) -> None:
        worker = deploy(Transient("store contention"), DISPATCHED)
        assert worker.post(retry_count=0).status_code == 503

        response = worker.post(retry_count=1)

        assert response.status_code == 200
        assert response.json() == {"status": "settled", "outcome": "dispatched"}
        record = worker.store.get_delivery(DELIVERY_ID)
        assert record is not None
        assert (record.outcome, record.attempts) == ("dispatched", 2)
        assert worker.handler.calls == [(DELIVERY_ID, 1), (DELIVERY_ID, 2)]
        assert worker.event_names() == ["delivery.received", "delivery.settled"]
        [settled] = worker.store.list_events(name="delivery.settled")
        assert (settled.data["attempts"], settled.data["queue_retries"]) == (2, 1)


class TestPermanentFailure:
    def test_any_other_error_is_settled_failed_with_the_exception_named(
        self, deploy: Deploy
    ) -> None:
        worker = deploy(KeyError("installation"))

        response = worker.post()

        # 200: the queue must stop retrying something that will fail the same way again.
        assert response.status_code == 200
        assert response.json() == {"status": "settled", "outcome": "failed"}
        record = worker.store.get_delivery(DELIVERY_ID)
        assert record is not None
        assert (record.outcome, record.detail) == ("failed", "KeyError: 'installation'")
        assert [r.delivery_id for r in worker.store.list_deliveries(outcome="failed")] == [
            DELIVERY_ID
        ]
        [settled] = worker.store.list_events(name="delivery.settled")
        assert settled.severity == "ERROR"

    @pytest.mark.parametrize("outcome", ["received", "exploded", "refused:"])
    def test_an_outcome_the_ledger_does_not_know_is_a_dead_letter_not_a_500(
        self, deploy: Deploy, outcome: str
    ) -> None:
        worker = deploy(Outcome(outcome))

        response = worker.post()

        assert response.json() == {"status": "settled", "outcome": "failed"}
        record = worker.store.get_delivery(DELIVERY_ID)
        assert record is not None and "unknown outcome" in record.detail

    def test_a_dead_letter_is_not_retried_by_a_redelivery(self, deploy: Deploy) -> None:
        worker = deploy(RuntimeError("template missing"), DISPATCHED)
        worker.post()

        response = worker.post(retry_count=1)

        assert response.json() == {"status": "already-settled", "outcome": "failed"}
        assert len(worker.handler.calls) == 1

    def test_a_reopened_dead_letter_is_settled_by_the_next_task(self, deploy: Deploy) -> None:
        worker = deploy(RuntimeError("template missing"), DISPATCHED)
        worker.post()
        record = worker.store.get_delivery(DELIVERY_ID)
        assert record is not None
        replayed_at = datetime(2026, 5, 1, 13, 0, tzinfo=UTC)

        # What `looprelay replay` does: reopen the ledger record, queue its envelope again.
        assert worker.store.reopen_delivery(DELIVERY_ID) is True
        worker.clock.at = replayed_at
        response = worker.post(record.envelope)

        assert response.json() == {"status": "settled", "outcome": "dispatched"}
        settled = worker.store.get_delivery(DELIVERY_ID)
        assert settled is not None
        assert (settled.outcome, settled.detail) == ("dispatched", "spawned github:octo/demo#7")
        assert settled.settled_at == replayed_at
        assert len(worker.handler.calls) == 2
        names = worker.event_names()
        assert names == ["delivery.received", "delivery.settled", "delivery.settled"]


class TestRefusedRequests:
    @pytest.mark.parametrize(
        "token",
        [None, "wrong-secret", SECRET.upper(), SECRET[:-1], SECRET + "x", ""],
        ids=["missing", "wrong", "wrong-case", "prefix", "longer", "empty"],
    )
    def test_a_request_without_the_queues_bearer_is_401_and_writes_nothing(
        self, deploy: Deploy, token: str | None
    ) -> None:
        worker = deploy()

        response = worker.post(token=token)

        assert response.status_code == 401
        assert SECRET not in response.text
        assert worker.nothing_written()
        assert worker.handler.calls == []

    def test_another_auth_scheme_is_401(self, deploy: Deploy) -> None:
        worker = deploy()
        response = requests.post(
            worker.url, data=BODY, headers={"Authorization": f"Basic {SECRET}"}, timeout=10
        )
        assert response.status_code == 401
        assert worker.nothing_written()

    @pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
    def test_a_method_other_than_post_is_405(self, deploy: Deploy, method: str) -> None:
        worker = deploy()
        response = requests.request(
            method, worker.url, headers={"Authorization": f"Bearer {SECRET}"}, timeout=10
        )
        assert response.status_code == 405
        assert worker.nothing_written()

    @pytest.mark.parametrize(
        "body",
        [
            b"",
            b"not json",
            b"[]",
            b'{"event": "issues"}',
            b'{"delivery_id": "d-1", "event": "issues", "smuggled": true}',
            b'{"delivery_id": 7, "event": "issues"}',
            b"\xff\xfe{}",
        ],
        ids=["empty", "not-json", "array", "no-id", "unknown-field", "id-not-text", "not-utf8"],
    )
    def test_a_body_that_is_not_an_envelope_is_400_and_writes_nothing(
        self, deploy: Deploy, body: bytes
    ) -> None:
        worker = deploy()

        response = worker.post(body)

        assert response.status_code == 400
        assert response.json() == {"error": "task body is not a delivery envelope"}
        assert worker.nothing_written()
        assert worker.handler.calls == []


class TestConcurrentDuplicates:
    def test_identical_tasks_at_once_settle_once_with_one_winner(self, deploy: Deploy) -> None:
        parties = 8
        barrier = threading.Barrier(parties)

        def slow_dispatch() -> Outcome:
            threading.Event().wait(0.05)  # keep handlers overlapping
            return DISPATCHED

        worker = deploy(slow_dispatch)
        responses: list[requests.Response] = []
        lock = threading.Lock()

        def post() -> None:
            barrier.wait()
            response = worker.post()
            with lock:
                responses.append(response)

        threads = [threading.Thread(target=post) for _ in range(parties)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

        # Every racer may run the handler (it must be idempotent, see service/worker.py); the
        # ledger's compare-and-set lets exactly one of them record the outcome.
        assert [r.status_code for r in responses] == [200] * parties
        statuses = sorted(r.json()["status"] for r in responses)
        assert statuses == ["already-settled"] * (parties - 1) + ["settled"]
        assert worker.event_names().count("delivery.received") == 1
        assert worker.event_names().count("delivery.settled") == 1
        record = worker.store.get_delivery(DELIVERY_ID)
        assert record is not None
        assert record.outcome == "dispatched"
        assert len(worker.store.list_deliveries()) == 1


class TestSharedSecretAuthenticator:
    def test_an_empty_secret_is_refused_at_construction(self) -> None:
        with pytest.raises(ValueError, match="must not be empty"):
            SharedSecretAuthenticator("")

    @pytest.mark.parametrize(
        "header",
        [f"Bearer {SECRET}", f"bearer {SECRET}", f"BEARER {SECRET}", f"Bearer {SECRET}  "],
    )
    def test_the_secret_is_accepted_whatever_the_case_of_bearer(self, header: str) -> None:
        SharedSecretAuthenticator(SECRET).authenticate({"authorization": header})

    @pytest.mark.parametrize(
        "headers",
        [
            {},
            {"authorization": ""},
            {"authorization": "Bearer"},
            {"authorization": f"Bearer{SECRET}"},
            {"authorization": f"Basic {SECRET}"},
            {"authorization": "Bearer wrong-secret"},
            {"authorization": f"Bearer {SECRET.upper()}"},
            {"authorization": f"Bearer {SECRET}extra"},
            {"authorization": f"Bearer {SECRET[:4]}"},
            {"authorization": "Bearer sécret-ünïcode"},
        ],
        ids=[
            "no-header",
            "empty",
            "no-secret",
            "no-space",
            "basic",
            "wrong",
            "wrong-case",
            "longer",
            "prefix",
            "non-ascii",
        ],
    )
    def test_anything_else_is_unauthorized_401(self, headers: dict[str, str]) -> None:
        with pytest.raises(Unauthorized) as refused:
            SharedSecretAuthenticator(SECRET).authenticate(headers)
        assert refused.value.status == 401
        assert SECRET not in str(refused.value)


class TestDeliveriesNotRouted:
    """A ping and an event off ``webhook.events`` are in the ledger, never routed."""

    @pytest.mark.parametrize(
        ("event", "outcome"),
        [("ping", "pong"), ("push", "ignored:event"), ("projects_v2_item", "ignored:event")],
    )
    def test_it_is_settled_without_the_handler(
        self, tmp_path: Path, event: str, outcome: str
    ) -> None:
        store = SqliteStore(tmp_path / "store.db")
        handler = ScriptedHandler(DISPATCHED)
        worker = Worker(
            store=store,
            authenticator=SharedSecretAuthenticator(SECRET),
            clock=FixedClock(NOW),
            handler=handler,
            allowed_events={"issue_comment"},
        )
        body = Envelope(delivery_id=DELIVERY_ID, event=event).model_dump_json().encode()
        request = Request(
            method="POST",
            path="/worker",
            headers={"authorization": f"Bearer {SECRET}"},
            body=body,
        )

        assert worker_handler(worker)(request).status == 200

        record = store.get_delivery(DELIVERY_ID)
        assert record is not None and (record.event, record.outcome) == (event, outcome)
        assert handler.calls == []
        store.close()
