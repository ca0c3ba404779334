"""A delivery whose queue task died runs again, from GitHub's "Redeliver" or `deliveries
replay`, even while Cloud Tasks still reserves the dead task's name (about an hour); a true
duplicate is still settled once, by the worker's ledger.

The webhook queues through the real ``CloudTasksQueue`` into the recorder, which reserves names
like the service; the worker settles into a real SQLite ledger.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from secrets import token_hex

import pytest

from looprelay.adapters.gcp.cloud_tasks import CloudTasksQueue
from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.app.adapters import open_queue, open_store
from looprelay.app.ingress_http import webhook_handler
from looprelay.app.messages import Request
from looprelay.app.worker_http import worker_handler
from looprelay.config.model import Config, QueueConfig, WebhookConfig
from looprelay.core.signature import sign_body
from looprelay.core.tasknames import task_name_prefix
from looprelay.datadir import STORE_FILE
from looprelay.errors import ConfigError, Transient
from looprelay.ports import Task
from looprelay.service.ingress import Ingress
from looprelay.service.replay import replay_delivery
from looprelay.service.worker import Outcome, Worker
from tests.cloudtasks_recorder import CloudTasksRecorder, recorder_config
from tests.samples import payload_bytes

SECRET = b"webhook-secret"
WORKER_TOKEN = "worker-token-abc"
DELIVERY = "5f0c6a52-36a4-4d55-9a83-2d9f0b5a4e11"
COMMENT = payload_bytes("issue_comment.created")


class Clock:
    def now(self) -> datetime:
        return datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Handler:
    """Counts its runs; raises ``Transient`` while ``failing`` (the queue then retries), and
    a bug while ``broken`` (the worker settles the delivery ``failed``)."""

    def __init__(self) -> None:
        self.runs = 0
        self.failing = False
        self.broken = False

    def __call__(self, envelope: object, record: object) -> Outcome:
        self.runs += 1
        if self.failing:
            raise Transient("GitHub is down")
        if self.broken:
            raise RuntimeError("a bug")
        return Outcome("dispatched", "spawned")


class Rig:
    """GitHub's side (post a delivery), the queue's (run or end a task), the ledger."""

    def __init__(self, recorder: CloudTasksRecorder, data_dir: Path) -> None:
        self.recorder = recorder
        self.queue = CloudTasksQueue.from_config(recorder_config(recorder))
        self.ingress = Ingress(secrets=[SECRET], queue=self.queue, config=WebhookConfig())
        self.store = SqliteStore(data_dir / STORE_FILE)
        self.handler = Handler()
        self.worker = Worker(
            store=self.store,
            authenticator=SharedSecretAuthenticator(WORKER_TOKEN),
            clock=Clock(),
            handler=self.handler,
        )

    def github_delivers(self) -> dict[str, str]:
        """POST the delivery as GitHub does (a redelivery is the very same request)."""
        headers = {
            "content-type": "application/json",
            "x-github-event": "issue_comment",
            "x-github-delivery": DELIVERY,
            "x-hub-signature-256": sign_body(COMMENT, SECRET),
        }
        response = webhook_handler(self.ingress)(Request("POST", "/webhook", headers, COMMENT))
        assert response.status == 202
        return dict(json.loads(response.body))

    def queue_runs(self, name: str) -> tuple[int, dict[str, str]]:
        """The queue dispatches task ``name`` to the worker; returns the worker's answer."""
        body = self.recorder.held()[name]
        headers = {"authorization": f"Bearer {WORKER_TOKEN}"}
        response = worker_handler(self.worker)(Request("POST", "/worker", headers, body))
        return response.status, dict(json.loads(response.body))

    def tasks(self) -> list[str]:
        return sorted(self.recorder.held())


@pytest.fixture
def rig(cloudtasks_recorder: CloudTasksRecorder, tmp_path: Path) -> Iterator[Rig]:
    built = Rig(cloudtasks_recorder, tmp_path)
    yield built
    built.store.close()


class TestFromGitHub:
    def test_a_delivery_whose_task_died_runs_again_while_its_name_is_reserved(
        self, rig: Rig
    ) -> None:
        rig.handler.failing = True
        assert rig.github_delivers()["status"] == "queued"
        [first] = rig.tasks()
        assert rig.queue_runs(first)[0] == 503  # the worker began it, then GitHub failed
        rig.recorder.end(first)  # the queue's retries ran out: the task died
        assert rig.queue.enqueue(Task(name=first, body=b"{}")) is False  # name still reserved
        rig.handler.failing = False

        answer = rig.github_delivers()  # the operator clicks "Redeliver"

        assert answer == {"status": "queued", "delivery": DELIVERY}
        [again] = rig.tasks()
        assert again != first and again.startswith(task_name_prefix(DELIVERY))
        assert rig.queue_runs(again) == (200, {"status": "settled", "outcome": "dispatched"})
        record = rig.store.get_delivery(DELIVERY)
        assert record is not None and (record.outcome, record.attempts) == ("dispatched", 2)

    def test_a_true_duplicate_is_queued_but_settled_once_by_the_ledger(self, rig: Rig) -> None:
        rig.github_delivers()
        rig.github_delivers()
        first, second = rig.tasks()

        assert rig.queue_runs(first) == (200, {"status": "settled", "outcome": "dispatched"})
        assert rig.queue_runs(second) == (
            200,
            {"status": "already-settled", "outcome": "dispatched"},
        )
        assert rig.handler.runs == 1
        assert [e.name for e in rig.store.list_events(delivery_id=DELIVERY)] == [
            "delivery.received",
            "delivery.settled",
        ]


class TestReplay:
    @pytest.fixture
    def config(self, cloudtasks_recorder: CloudTasksRecorder) -> Config:
        queue = QueueConfig(backend="cloudtasks", cloudtasks=recorder_config(cloudtasks_recorder))
        return Config(queue=queue)

    def test_a_stuck_delivery_replays_under_a_name_of_its_own(
        self, rig: Rig, config: Config, tmp_path: Path
    ) -> None:
        """GitHub shows it delivered (202), so neither GitHub nor the sweeper retries it."""
        rig.handler.failing = True
        rig.github_delivers()
        [first] = rig.tasks()
        rig.queue_runs(first)
        rig.recorder.end(first)
        rig.handler.failing = False

        _replay(config, tmp_path)

        [again] = rig.tasks()
        assert again != first and again.startswith(task_name_prefix(DELIVERY) + "replay-")
        assert rig.queue_runs(again) == (200, {"status": "settled", "outcome": "dispatched"})

    def test_a_dead_letter_is_reopened_and_replayed(
        self, rig: Rig, config: Config, tmp_path: Path
    ) -> None:
        rig.handler.broken = True
        rig.github_delivers()
        [first] = rig.tasks()
        assert rig.queue_runs(first) == (200, {"status": "settled", "outcome": "failed"})
        rig.recorder.end(first)
        rig.handler.broken = False

        _replay(config, tmp_path)

        [again] = rig.tasks()
        assert rig.queue_runs(again) == (200, {"status": "settled", "outcome": "dispatched"})

    def test_a_settled_delivery_is_refused_and_nothing_queued(
        self, rig: Rig, config: Config, tmp_path: Path
    ) -> None:
        rig.github_delivers()
        [first] = rig.tasks()
        rig.queue_runs(first)
        rig.recorder.end(first)

        with pytest.raises(ConfigError, match="is dispatched; only failed ones and ones still"):
            _replay(config, tmp_path)
        assert rig.tasks() == []


def _replay(config: Config, data_dir: Path) -> None:
    """``looprelay deliveries replay DELIVERY``, as the CLI wires it."""
    replay_delivery(
        open_store(config, data_dir=data_dir),
        open_queue(config, data_dir=data_dir),
        delivery_id=DELIVERY,
        attempt=token_hex(8),
    )


class TestTheRecorder:
    def test_an_ended_tasks_name_is_free_again_after_the_reservation(
        self, cloudtasks_recorder: CloudTasksRecorder
    ) -> None:
        now = [0.0]
        cloudtasks_recorder.clock = lambda: now[0]
        queue = CloudTasksQueue.from_config(recorder_config(cloudtasks_recorder))
        assert queue.enqueue(Task(name="gh-1", body=b"{}")) is True
        cloudtasks_recorder.end("gh-1")
        now[0] = 3599.0
        assert queue.enqueue(Task(name="gh-1", body=b"{}")) is False
        now[0] = 3600.0
        assert queue.enqueue(Task(name="gh-1", body=b"{}")) is True
