"""CloudTasksQueue: CreateTask over REST against a loopback recorder, with Google's own
google-cloud-tasks client as the oracle for what that request must look like."""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tasks_v2
from google.protobuf import duration_pb2

from looprelay.adapters.gcp.cloud_tasks import ATTEMPT_TIMEOUT_SECONDS, CloudTasksQueue
from looprelay.errors import ConfigError, Permanent, Transient
from looprelay.ports import MAX_TASK_BODY_BYTES, MAX_TASK_BYTES, Task
from tests.cloudtasks_recorder import (
    QUEUE_PATH,
    SERVICE_ACCOUNT,
    WORKER_URL,
    CloudTasksQueueHarness,
    CloudTasksRecorder,
    RecordedRequest,
    recorder_config,
)

BODY = b'{"job_id": "j1"}'
SHORT_WINDOW = 0.3  # seconds of retries, so failing cases stay fast


def _queue(recorder: CloudTasksRecorder, *, endpoint: str | None = None) -> CloudTasksQueue:
    config = recorder_config(recorder, api_endpoint=endpoint or recorder.url)
    return CloudTasksQueue.from_config(config, retry_window_seconds=SHORT_WINDOW)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class TestRequestShape:
    def test_the_task_is_created_with_the_documented_rest_request(
        self, cloudtasks_queue_harness: CloudTasksQueueHarness
    ) -> None:
        assert cloudtasks_queue_harness.queue.enqueue(Task(name="gh-abc123", body=BODY)) is True

        [request] = cloudtasks_queue_harness.recorder.requests
        assert (request.method, request.path) == ("POST", f"/v2/{QUEUE_PATH}/tasks")
        assert parse_qs(request.query) == {"$alt": ["json;enum-encoding=int"]}
        assert request.headers["x-goog-request-params"] == f"parent={QUEUE_PATH}"
        assert "Authorization" not in request.headers
        assert request.body == {
            "task": {
                "name": f"{QUEUE_PATH}/tasks/gh-abc123",
                "httpRequest": {
                    "url": WORKER_URL,
                    "httpMethod": 1,  # POST, as enum-encoding=int asks
                    "headers": {"Content-Type": "application/json"},
                    "body": base64.b64encode(BODY).decode(),
                    "oidcToken": {"serviceAccountEmail": SERVICE_ACCOUNT, "audience": WORKER_URL},
                },
                "dispatchDeadline": "60s",
            }
        }

    def test_the_dispatch_deadline_comes_from_the_config(
        self, cloudtasks_recorder: CloudTasksRecorder
    ) -> None:
        config = recorder_config(cloudtasks_recorder, dispatch_deadline_seconds=600)
        CloudTasksQueue.from_config(config).enqueue(Task(name="gh-1", body=BODY))
        assert cloudtasks_recorder.tasks[f"{QUEUE_PATH}/tasks/gh-1"]["dispatchDeadline"] == "600s"

    def test_an_explicit_audience_replaces_the_worker_url_in_the_token(
        self, cloudtasks_recorder: CloudTasksRecorder
    ) -> None:
        queue = _queue_with(cloudtasks_recorder, audience="https://worker.example.test")
        queue.enqueue(Task(name="gh-1", body=BODY))
        [task] = cloudtasks_recorder.tasks.values()
        assert task["httpRequest"]["url"] == WORKER_URL
        assert task["httpRequest"]["oidcToken"]["audience"] == "https://worker.example.test"


def _queue_with(
    recorder: CloudTasksRecorder, *, audience: str | None = None, deadline: int = 60
) -> CloudTasksQueue:
    return CloudTasksQueue(
        project="demo-lab",
        location="us-central1",
        queue="work",
        worker_url=WORKER_URL,
        service_account_email=SERVICE_ACCOUNT,
        audience=audience,
        dispatch_deadline_seconds=deadline,
        api_endpoint=recorder.url,
    )


def _create_with_googles_client(
    recorder: CloudTasksRecorder, task: Task, *, audience: str, deadline: int
) -> None:
    """The same task through google-cloud-tasks' own client, REST transport."""
    client = tasks_v2.CloudTasksClient(
        transport="rest",
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        client_options=ClientOptions(api_endpoint=recorder.url),
    )
    http_request = tasks_v2.HttpRequest(
        url=WORKER_URL,
        http_method=tasks_v2.HttpMethod.POST,
        headers={"Content-Type": "application/json"},
        body=task.body,
        oidc_token=tasks_v2.OidcToken(service_account_email=SERVICE_ACCOUNT, audience=audience),
    )
    client.create_task(
        parent=QUEUE_PATH,
        task=tasks_v2.Task(
            name=f"{QUEUE_PATH}/tasks/{task.name}",
            http_request=http_request,
            dispatch_deadline=duration_pb2.Duration(seconds=deadline),
        ),
    )


def _as_sent(request: RecordedRequest) -> tuple[object, ...]:
    """What Cloud Tasks acts on: method, path, query, routing header and JSON body."""
    routing = request.headers.get("x-goog-request-params")
    return (request.method, request.path, parse_qs(request.query), routing, request.body)


@pytest.fixture
def second_recorder() -> Iterator[CloudTasksRecorder]:
    """Another recorder, so both clients can create a task of the same name."""
    recorder = CloudTasksRecorder()
    recorder.start()
    yield recorder
    recorder.stop()


class TestTheSameRequestAsGooglesClient:
    """The request is built by hand to keep google-cloud-tasks (gRPC, protobuf) off the
    webhook's cold start; Google's client is the oracle, so the two can never drift apart."""

    @pytest.mark.parametrize(
        ("task", "audience", "deadline"),
        [
            (Task(name="gh-abc123", body=BODY), None, 60),
            (Task(name="x" * 500, body='{"t": "\u00e9\u2603"}'.encode()), None, 1800),
            (Task(name="gh-bin_1", body=bytes(range(256))), "https://aud.example.test", 15),
        ],
        ids=["delivery", "longest-name-unicode-body", "binary-body-explicit-audience"],
    )
    def test_method_path_query_routing_header_and_body_are_equal(
        self,
        cloudtasks_recorder: CloudTasksRecorder,
        second_recorder: CloudTasksRecorder,
        task: Task,
        audience: str | None,
        deadline: int,
    ) -> None:
        ours = _queue_with(cloudtasks_recorder, audience=audience, deadline=deadline)

        assert ours.enqueue(task) is True
        _create_with_googles_client(
            second_recorder, task, audience=audience or WORKER_URL, deadline=deadline
        )

        [sent_by_us] = cloudtasks_recorder.requests
        [sent_by_google] = second_recorder.requests
        assert _as_sent(sent_by_us) == _as_sent(sent_by_google)
        assert cloudtasks_recorder.held() == second_recorder.held() == {task.name: task.body}


class TestDuplicates:
    def test_a_name_the_service_already_holds_is_reported_as_a_duplicate(
        self, cloudtasks_queue_harness: CloudTasksQueueHarness
    ) -> None:
        queue = cloudtasks_queue_harness.queue
        assert queue.enqueue(Task(name="gh-dup", body=b"first")) is True
        assert queue.enqueue(Task(name="gh-dup", body=b"second")) is False
        assert len(cloudtasks_queue_harness.recorder.requests) == 2
        assert cloudtasks_queue_harness.held() == {"gh-dup": b"first"}

    def test_a_conflict_that_aborted_is_transient_not_a_duplicate(
        self, cloudtasks_recorder: CloudTasksRecorder
    ) -> None:
        cloudtasks_recorder.fail_next(1, status=409, code="ABORTED")
        queue = _queue(cloudtasks_recorder)
        with pytest.raises(Transient, match="ABORTED"):
            queue.enqueue(Task(name="gh-1", body=BODY))
        assert queue.enqueue(Task(name="gh-1", body=BODY)) is True


class TestFailures:
    @pytest.mark.parametrize("status", [429, 500, 503, 504])
    def test_a_busy_or_failing_service_is_transient_once_the_retries_run_out(
        self, cloudtasks_recorder: CloudTasksRecorder, status: int
    ) -> None:
        cloudtasks_recorder.fail_next(1000, status=status)
        started = time.monotonic()
        with pytest.raises(Transient, match=QUEUE_PATH):
            _queue(cloudtasks_recorder).enqueue(Task(name="gh-1", body=BODY))
        assert time.monotonic() - started < SHORT_WINDOW + 1
        assert len(cloudtasks_recorder.requests) >= 2
        assert cloudtasks_recorder.tasks == {}

    def test_a_brief_outage_is_absorbed_by_a_retry(
        self, cloudtasks_queue_harness: CloudTasksQueueHarness
    ) -> None:
        cloudtasks_queue_harness.recorder.fail_next(1, status=503)
        assert cloudtasks_queue_harness.queue.enqueue(Task(name="gh-1", body=BODY)) is True
        assert len(cloudtasks_queue_harness.recorder.requests) == 2
        assert cloudtasks_queue_harness.held() == {"gh-1": BODY}

    @pytest.mark.parametrize(
        ("status", "fix"),
        [
            (400, "queue.cloudtasks.workerUrl"),
            (401, "identity"),
            (403, "roles/cloudtasks.enqueuer"),
            (404, "gcloud tasks queues create"),
            (412, "see the error"),
        ],
    )
    def test_a_refusal_is_permanent_names_the_queue_and_the_fix_and_is_not_retried(
        self, cloudtasks_recorder: CloudTasksRecorder, status: int, fix: str
    ) -> None:
        cloudtasks_recorder.fail_next(1, status=status)
        with pytest.raises(Permanent) as caught:
            _queue(cloudtasks_recorder).enqueue(Task(name="gh-1", body=BODY))
        assert QUEUE_PATH in str(caught.value)
        assert fix in str(caught.value)
        assert len(cloudtasks_recorder.requests) == 1

    @pytest.mark.parametrize(("status", "error"), [(502, Transient), (403, Permanent)])
    def test_a_plain_text_error_from_a_proxy_is_classified_by_status(
        self, cloudtasks_recorder: CloudTasksRecorder, status: int, error: type[Exception]
    ) -> None:
        cloudtasks_recorder.fail_next(1000, status=status, text="<html>Bad Gateway</html>")
        with pytest.raises(error, match="Bad Gateway"):
            _queue(cloudtasks_recorder).enqueue(Task(name="gh-1", body=BODY))

    def test_an_unreachable_endpoint_is_transient(
        self, cloudtasks_recorder: CloudTasksRecorder
    ) -> None:
        queue = _queue(cloudtasks_recorder, endpoint=f"http://127.0.0.1:{_closed_port()}")
        started = time.monotonic()
        with pytest.raises(Transient, match=QUEUE_PATH):
            queue.enqueue(Task(name="gh-1", body=BODY))
        assert time.monotonic() - started < SHORT_WINDOW + 1

    def test_a_hanging_service_is_given_up_on_after_the_attempt_timeout(
        self, cloudtasks_recorder: CloudTasksRecorder
    ) -> None:
        cloudtasks_recorder.stall_next(1, seconds=ATTEMPT_TIMEOUT_SECONDS + 0.5)
        queue = _queue(cloudtasks_recorder)
        started = time.monotonic()
        with pytest.raises(Transient, match=QUEUE_PATH):
            queue.enqueue(Task(name="gh-1", body=BODY))
        assert time.monotonic() - started < ATTEMPT_TIMEOUT_SECONDS + 0.5
        # The service still creates it; a read timeout is not retried, and a later enqueue
        # finds the duplicate.
        deadline = time.monotonic() + 5
        while not cloudtasks_recorder.tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(cloudtasks_recorder.requests) == 1
        assert queue.enqueue(Task(name="gh-1", body=BODY)) is False


class TestRefusedBeforeSending:
    def test_a_task_over_one_megabyte_is_permanent_and_nothing_is_sent(
        self, cloudtasks_queue_harness: CloudTasksQueueHarness
    ) -> None:
        with pytest.raises(Permanent, match="1000000"):
            cloudtasks_queue_harness.queue.enqueue(
                Task(name="gh-big", body=b"x" * (MAX_TASK_BYTES + 1))
            )
        assert cloudtasks_queue_harness.recorder.requests == []

    def test_the_largest_body_ingress_makes_is_sent(
        self, cloudtasks_queue_harness: CloudTasksQueueHarness
    ) -> None:
        body = b"x" * MAX_TASK_BODY_BYTES
        assert cloudtasks_queue_harness.queue.enqueue(Task(name="gh-max", body=body)) is True
        assert cloudtasks_queue_harness.held() == {"gh-max": body}

    def test_a_body_under_one_megabyte_that_does_not_fit_with_the_rest_is_refused(
        self, cloudtasks_queue_harness: CloudTasksQueueHarness
    ) -> None:
        """Cloud Tasks counts the name, URL and headers too."""
        with pytest.raises(Permanent, match="with its name, URL and headers"):
            cloudtasks_queue_harness.queue.enqueue(
                Task(name="gh-big", body=b"x" * (MAX_TASK_BYTES - 100))
            )
        assert cloudtasks_queue_harness.recorder.requests == []

    @pytest.mark.parametrize("name", ["", "a/b", "x" * 501, "gh.1"])
    def test_an_invalid_task_name_is_permanent_and_nothing_is_sent(
        self, cloudtasks_queue_harness: CloudTasksQueueHarness, name: str
    ) -> None:
        with pytest.raises(Permanent, match="task name"):
            cloudtasks_queue_harness.queue.enqueue(Task(name=name, body=BODY))
        assert cloudtasks_queue_harness.recorder.requests == []


class TestCredentials:
    def test_without_an_endpoint_or_default_credentials_the_queue_refuses_to_build(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        # google.auth reads this variable first; a missing file fails at once, offline.
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
        with pytest.raises(ConfigError, match="Cloud Tasks needs Google credentials"):
            CloudTasksQueue(
                project="demo-lab",
                location="us-central1",
                queue="work",
                worker_url=WORKER_URL,
                service_account_email=SERVICE_ACCOUNT,
            )
