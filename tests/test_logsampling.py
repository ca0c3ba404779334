"""Rejection warnings are sampled (issue 13): unauthenticated noise cannot fill a disk with log
lines, while a lone mistake is still logged in full. Time comes from a fake clock."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from looprelay.adapters.sqlite.queue import SqliteQueue
from looprelay.app.ingress_http import webhook_handler
from looprelay.app.messages import Request
from looprelay.config.model import EmbeddedQueueConfig, RetryConfig, WebhookConfig
from looprelay.logsampling import LogSampler, Sample
from looprelay.service.ingress import Ingress

SECRET = b"a-webhook-secret-of-32-bytes-ok!"
LIMIT = 3
WINDOW = 60.0


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TestLogSampler:
    def test_the_first_lines_of_a_window_are_logged_and_the_rest_counted(self) -> None:
        clock = FakeClock()
        sampler = LogSampler(limit=LIMIT, window=WINDOW, monotonic=clock)

        first = [sampler.admit(401) for _ in range(10)]
        clock.now += WINDOW - 0.001
        still_first = sampler.admit(401)
        clock.now += 0.001
        next_window = sampler.admit(401)

        assert first == [Sample(True)] * LIMIT + [Sample(False)] * (10 - LIMIT)
        assert still_first == Sample(False)
        assert next_window == Sample(True, left_out=10 - LIMIT + 1)
        assert sampler.admit(401) == Sample(True)

    def test_each_key_has_its_own_budget(self) -> None:
        sampler = LogSampler(limit=1, window=WINDOW, monotonic=FakeClock())
        assert [sampler.admit(key) for key in (401, 401, 413, 400)] == [
            Sample(True),
            Sample(False),
            Sample(True),
            Sample(True),
        ]

    def test_a_quiet_window_reports_nothing_left_out(self) -> None:
        clock = FakeClock()
        sampler = LogSampler(limit=LIMIT, window=WINDOW, monotonic=clock)
        sampler.admit(401)
        clock.now += 10 * WINDOW
        assert sampler.admit(401) == Sample(True, left_out=0)

    @pytest.mark.parametrize(("limit", "window"), [(0, WINDOW), (1, 0.0), (1, -1.0)])
    def test_a_sampler_that_would_log_nothing_is_refused(self, limit: int, window: float) -> None:
        with pytest.raises(ValueError, match="limit >= 1 and window > 0"):
            LogSampler(limit=limit, window=window)


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[SqliteQueue]:
    """A real queue; refused deliveries never reach it."""
    opened = SqliteQueue(tmp_path / "queue.db", retry=RetryConfig(), settings=EmbeddedQueueConfig())
    yield opened
    opened.close()


def _unsigned(delivery: str) -> Request:
    body = b'{"action": "created"}'
    headers = {
        "content-type": "application/json",
        "x-github-event": "issue_comment",
        "x-github-delivery": delivery,
        "x-hub-signature-256": "sha256=" + "0" * 64,
        "content-length": str(len(body)),
    }
    return Request(method="POST", path="/webhook", headers=headers, body=body)


def _signed_but_not_json(delivery: str) -> Request:
    body = b"not json"
    digest = hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    headers = {
        "content-type": "application/json",
        "x-github-event": "issue_comment",
        "x-github-delivery": delivery,
        "x-hub-signature-256": f"sha256={digest}",
        "content-length": str(len(body)),
    }
    return Request(method="POST", path="/webhook", headers=headers, body=body)


class TestWebhookRejections:
    def test_a_flood_of_forged_deliveries_logs_a_sample_and_then_how_many_were_left_out(
        self, queue: SqliteQueue, caplog: pytest.LogCaptureFixture
    ) -> None:
        clock = FakeClock()
        ingress = Ingress(
            secrets=[SECRET],
            queue=queue,
            config=WebhookConfig(),
            rejections=LogSampler(limit=LIMIT, window=WINDOW, monotonic=clock),
        )

        with caplog.at_level(logging.WARNING, logger="looprelay.service.ingress"):
            statuses = {
                webhook_handler(ingress)(_unsigned(f"forged-{n}")).status for n in range(500)
            }
            flood = [r.getMessage() for r in caplog.records]
            caplog.clear()
            clock.now += WINDOW
            webhook_handler(ingress)(_unsigned("forged-after"))
            after = [r.getMessage() for r in caplog.records]

        assert statuses == {401}  # every request still gets its answer
        assert len(flood) == LIMIT
        assert all(line.startswith("webhook rejected: signature") for line in flood)
        assert after[0] == (
            f"{500 - LIMIT} more webhook rejections of kind bad-signature were not logged "
            f"(at most {LIMIT} every 60 s are)"
        )
        assert after[1].startswith("webhook rejected: signature")
        assert queue.list_tasks() == []

    def test_a_flood_of_one_kind_does_not_hide_another_kind(
        self, queue: SqliteQueue, caplog: pytest.LogCaptureFixture
    ) -> None:
        ingress = Ingress(
            secrets=[SECRET],
            queue=queue,
            config=WebhookConfig(),
            rejections=LogSampler(limit=LIMIT, window=WINDOW, monotonic=FakeClock()),
        )
        with caplog.at_level(logging.WARNING, logger="looprelay.service.ingress"):
            for n in range(50):
                webhook_handler(ingress)(_unsigned(f"forged-{n}"))
            response = webhook_handler(ingress)(_signed_but_not_json("broken-1"))

        assert response.status == 400
        assert caplog.records[-1].getMessage() == "webhook rejected: body is not valid JSON"

    def test_by_default_at_most_ten_a_minute_are_logged(
        self, queue: SqliteQueue, caplog: pytest.LogCaptureFixture
    ) -> None:
        ingress = Ingress(secrets=[SECRET], queue=queue, config=WebhookConfig())
        with caplog.at_level(logging.WARNING, logger="looprelay.service.ingress"):
            for n in range(100):
                webhook_handler(ingress)(_unsigned(f"forged-{n}"))
        assert len(caplog.records) == 10
