"""GitHub calls made while handling a delivery fit inside the queue's dispatch deadline.

Past the deadline the queue counts the attempt failed and sends another while the first may
still run. So the worker gives its handler a time budget under the deadline: a stalled or
rate-limited GitHub call is cut to the budget, and the attempt answers in time. The router's
GitHub effects are decoration (a failed one is recorded as ``github.failed``), so the delivery
still settles once. The real router and worker on SQLite, the loopback fake GitHub stalling.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from looprelay.adapters.clock import SystemClock
from looprelay.adapters.github.auth import TokenAuth
from looprelay.adapters.github.rest import GitHubRest
from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.app.messages import Request
from looprelay.app.services import build_router
from looprelay.app.worker_http import worker_handler
from looprelay.config.model import Config, RoutingConfig
from looprelay.core.envelope import project_envelope
from looprelay.service.worker import Worker, handler_budget
from tests.fake_github import APP_LOGIN, FakeGitHub
from tests.faults.deliveries import AUTHORIZED, GITHUB_TOKEN, Delivery, workload

BUDGET = 1.5
STALL = 4.0
TOKEN = "worker-token"
REACTIONS = r"POST /repos/[^/]+/[^/]+/issues/comments/\d+/reactions$"


@dataclass
class Rig:
    worker: Worker
    store: SqliteStore
    waits: list[float]

    def run(self, item: Delivery) -> tuple[int, float]:
        """The queue dispatches ``item``'s task; returns the status and the seconds it took."""
        envelope = project_envelope(
            event=item.event,
            delivery_id=item.delivery_id,
            payload=json.loads(item.body),
            max_text_chars=65_536,
        )
        started = time.monotonic()
        answer = worker_handler(self.worker)(
            Request(
                "POST",
                "/worker",
                {"authorization": f"Bearer {TOKEN}"},
                envelope.model_dump_json().encode(),
            )
        )
        return answer.status, time.monotonic() - started


@pytest.fixture
def rig(tmp_path: Path, fake_github: FakeGitHub) -> Iterator[Rig]:
    fake_github.tokens[GITHUB_TOKEN] = APP_LOGIN
    routing = RoutingConfig(
        authorized_users=[AUTHORIZED],
        bot_logins=[APP_LOGIN],
        control={"require_start_command": False},
    )
    store = SqliteStore(tmp_path / "looprelay.db")
    waits: list[float] = []
    github = GitHubRest(api_url=fake_github.url, auth=TokenAuth(GITHUB_TOKEN), sleep=waits.append)
    router = build_router(
        Config(routing=routing),
        store=store,
        clock=SystemClock(),
        data_dir=tmp_path,
        github=github,
        waker=None,
    )
    worker = Worker(
        store=store,
        authenticator=SharedSecretAuthenticator(TOKEN),
        clock=SystemClock(),
        handler=router,
        handler_budget_seconds=BUDGET,
    )
    yield Rig(worker, store, waits)
    store.close()


def _started(rig: Rig, fake_github: FakeGitHub) -> Delivery:
    """A work item started (its checklist posted); return a comment routed into it."""
    load = workload(fake_github, issues=1, comments_per_issue=1)
    [start], [comment] = load.starts, load.comments
    assert rig.run(start)[0] == 200
    return comment


class TestGitHubInsideTheDeadline:
    def test_a_stalled_github_call_is_cut_to_the_budget_and_the_attempt_answers_in_time(
        self, rig: Rig, fake_github: FakeGitHub
    ) -> None:
        comment = _started(rig, fake_github)
        fake_github.script(1, match=REACTIONS, delay=STALL)  # 👀 hangs

        status, took = rig.run(comment)

        assert status == 200
        assert took < BUDGET + 1.0 < STALL
        record = rig.store.get_delivery(comment.delivery_id)
        assert record is not None and record.outcome == "dispatched"
        [failed] = rig.store.list_events(delivery_id=comment.delivery_id, name="github.failed")
        assert "time budget" in str(failed.data["error"])

    def test_a_rate_limit_wait_the_budget_cannot_hold_is_not_waited(
        self, rig: Rig, fake_github: FakeGitHub
    ) -> None:
        comment = _started(rig, fake_github)
        fake_github.script(
            1, match=REACTIONS, status=403, headers={"Retry-After": "30"}, body={"message": "x"}
        )

        status, took = rig.run(comment)

        assert (status, rig.waits) == (200, [])
        assert took < BUDGET
        assert rig.store.list_events(delivery_id=comment.delivery_id, name="github.failed")

    def test_without_trouble_the_budget_changes_nothing(
        self, rig: Rig, fake_github: FakeGitHub
    ) -> None:
        comment = _started(rig, fake_github)

        assert rig.run(comment)[0] == 200
        [reacted] = fake_github.comments[comment.comment_id or 0].reactions
        assert reacted == (APP_LOGIN, "eyes")
        assert rig.store.list_events(name="github.failed") == []


class TestTheBudget:
    @pytest.mark.parametrize(("deadline", "budget"), [(60, 45.0), (15, 11.25), (1800, 1785.0)])
    def test_it_leaves_the_settle_a_reserve_of_the_deadline(
        self, deadline: int, budget: float
    ) -> None:
        assert handler_budget(deadline) == budget
