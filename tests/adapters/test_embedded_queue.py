"""SqliteQueue: a real SQLite file, dispatching over real HTTP to a loopback recording worker.

The recording worker plays the worker function: it keeps every request it gets (arrival time,
headers, body) and answers from a script per task name, 200 once the script runs out.
"""

from __future__ import annotations

import itertools
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from looprelay.adapters.sqlite.queue import QueuedTask, SqliteQueue
from looprelay.adapters.sqlite.queue_sql import LEASE_MARGIN_SECONDS
from looprelay.config.model import EmbeddedQueueConfig, RetryConfig
from looprelay.errors import Permanent, Transient
from looprelay.ports import MAX_TASK_BYTES, Task
from tests.loopback import LoopbackServer

TOKEN = "queue-to-worker-secret"
QUEUE_NAME = "relay-test"
BODY = '{"delivery_id": "d-1", "text": "naïve ✓"}'.encode()
FAST_RETRY = RetryConfig(min_backoff_seconds=0.05, max_backoff_seconds=0.2, max_attempts=3)
SETTINGS = EmbeddedQueueConfig(concurrency=2, dispatch_deadline_seconds=5)
QUIET_SECONDS = 0.3  # longer than any backoff here: long enough to see a wrong resend
WAIT_SECONDS = 10.0


@dataclass(frozen=True)
class Answer:
    """What the recording worker answers one request; ``hang`` never answers until stopped."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"{}"
    hang: bool = False


@dataclass(frozen=True)
class Received:
    """One request as it arrived; header names lower case, ``status`` None while unanswered."""

    at: float
    headers: dict[str, str]
    body: bytes
    status: int | None

    @property
    def retry_count(self) -> int:
        return int(self.headers["x-cloudtasks-taskretrycount"])

    @property
    def execution_count(self) -> int:
        return int(self.headers["x-cloudtasks-taskexecutioncount"])

    @property
    def eta(self) -> float:
        return float(self.headers["x-cloudtasks-tasketa"])


class RecordingWorker:
    """A loopback worker that records each request and answers a per-task-name script."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._scripts: dict[str, list[Answer]] = {}
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._loopback = LoopbackServer(_handler_for(self), poll_interval=0.05)

    @property
    def url(self) -> str:
        return f"{self._loopback.url}/worker"

    def script(self, name: str, *answers: int | Answer) -> None:
        """Answer the next requests for task ``name`` in this order (a bare int is a status)."""
        with self._lock:
            self._scripts.setdefault(name, []).extend(
                Answer(status=a) if isinstance(a, int) else a for a in answers
            )

    def take(self, headers: dict[str, str], body: bytes) -> Answer:
        """Record one request and decide its answer."""
        name = headers.get("x-cloudtasks-taskname", "")
        with self._lock:
            script = self._scripts.get(name, [])
            answer = script.pop(0) if script else Answer()
            status = None if answer.hang else answer.status
            self.received.append(Received(time.monotonic(), headers, body, status))
        return answer

    def requests_for(self, name: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.headers["x-cloudtasks-taskname"] == name]

    def wait_for(self, name: str, count: int) -> list[Received]:
        """Wait until ``count`` requests for ``name`` arrived; return them."""
        _wait_until(lambda: len(self.requests_for(name)) >= count, f"{count} requests for {name}")
        return self.requests_for(name)

    def hold(self) -> None:
        """Block a hanging request until :meth:`release`."""
        self._released.wait()

    def release(self) -> None:
        """Let every hanging request go (closed without an answer)."""
        self._released.set()

    def start(self) -> None:
        self._loopback.start()

    def stop(self) -> None:
        self.release()
        self._loopback.stop()


def _handler_for(worker: RecordingWorker) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {name.lower(): value for name, value in self.headers.items()}
            answer = worker.take(headers, body)
            if answer.hang:
                worker.hold()
                self.close_connection = True
                return
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: ``received`` is the log."""

    return _Handler


class FakeTime:
    """A wall clock for the queue's ``now=`` that moves only when the test says so."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def _wait_until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_SECONDS}s waiting for {what}")
        time.sleep(0.01)


def _task(queue: SqliteQueue, name: str) -> QueuedTask:
    [task] = [t for t in queue.list_tasks() if t.name == name]
    return task


def _wait_for_state(queue: SqliteQueue, name: str, state: str) -> QueuedTask:
    _wait_until(lambda: _task(queue, name).state == state, f"{name} to be {state}")
    return _task(queue, name)


def _gaps(received: list[Received]) -> list[float]:
    return [later.at - earlier.at for earlier, later in itertools.pairwise(received)]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def worker() -> Iterator[RecordingWorker]:
    recording = RecordingWorker()
    recording.start()
    yield recording
    recording.stop()


QueueFactory = Callable[..., SqliteQueue]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "queue.db"


@pytest.fixture
def open_queue(db_path: Path, worker: RecordingWorker) -> Iterator[QueueFactory]:
    """Open (not start) queues on one file; all are closed before the worker stops."""
    opened: list[SqliteQueue] = []

    def _open(
        *,
        retry: RetryConfig = FAST_RETRY,
        settings: EmbeddedQueueConfig = SETTINGS,
        now: Callable[[], float] = time.time,
    ) -> SqliteQueue:
        queue = SqliteQueue(db_path, retry=retry, settings=settings, queue_name=QUEUE_NAME, now=now)
        opened.append(queue)
        return queue

    yield _open
    worker.release()  # a dispatcher blocked on a hanging request must not hold up close()
    for queue in opened:
        queue.close()


@pytest.fixture
def running(open_queue: QueueFactory, worker: RecordingWorker) -> SqliteQueue:
    """A queue with the default test settings, dispatching to the recording worker."""
    queue = open_queue()
    queue.start(worker_url=worker.url, auth_token=TOKEN)
    return queue


class TestDelivery:
    def test_a_queued_task_is_posted_with_its_body_unchanged_and_the_cloud_tasks_headers(
        self, running: SqliteQueue, worker: RecordingWorker
    ) -> None:
        enqueued_at = time.time()
        assert running.enqueue(Task(name="gh-abc123", body=BODY)) is True

        [request] = worker.wait_for("gh-abc123", 1)
        assert request.body == BODY
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        assert request.headers["content-type"] == "application/json"
        assert request.headers["x-cloudtasks-queuename"] == QUEUE_NAME
        assert request.headers["x-cloudtasks-taskname"] == "gh-abc123"
        assert (request.retry_count, request.execution_count) == (0, 0)
        # Seconds since the epoch, as Cloud Tasks sends it: the time the task was due.
        assert request.eta == pytest.approx(enqueued_at, abs=2.0)

    @pytest.mark.parametrize("status", [200, 202, 204])
    def test_a_2xx_answer_finishes_the_task_and_it_is_not_sent_again(
        self, running: SqliteQueue, worker: RecordingWorker, status: int
    ) -> None:
        worker.script("gh-ok", Answer(status=status, body=b""))
        running.enqueue(Task(name="gh-ok", body=BODY))

        task = _wait_for_state(running, "gh-ok", "done")
        assert (task.last_status, task.attempts) == (status, 1)
        # Within the dedup window the name is still taken, so a redelivery is not sent either.
        assert running.enqueue(Task(name="gh-ok", body=BODY)) is False
        time.sleep(QUIET_SECONDS)
        assert len(worker.requests_for("gh-ok")) == 1

    def test_every_queued_task_is_delivered_once(
        self, running: SqliteQueue, worker: RecordingWorker
    ) -> None:
        names = [f"gh-{index}" for index in range(10)]
        for name in names:
            running.enqueue(Task(name=name, body=name.encode()))

        for name in names:
            _wait_for_state(running, name, "done")
        time.sleep(QUIET_SECONDS)
        for name in names:
            [request] = worker.requests_for(name)
            assert request.body == name.encode()


class TestEnqueueSoon:
    def test_the_future_says_true_once_the_task_is_on_disk_and_false_for_its_name_again(
        self, open_queue: QueueFactory, db_path: Path
    ) -> None:
        queue = open_queue()

        assert queue.enqueue_soon(Task(name="gh-soon", body=BODY)).result(WAIT_SECONDS) is True
        with sqlite3.connect(db_path) as db:
            assert db.execute("SELECT name, state FROM tasks").fetchall() == [
                ("gh-soon", "pending")
            ]
        again = queue.enqueue_soon(Task(name="gh-soon", body=b"other"))
        assert again.result(WAIT_SECONDS) is False
        assert [t.body for t in queue.list_tasks()] == [BODY]

    @pytest.mark.parametrize(
        "task",
        [
            Task(name="gh bad/name", body=BODY),
            Task(name="", body=BODY),
            Task(name="gh-too-big", body=b"x" * (MAX_TASK_BYTES + 1)),
        ],
        ids=["bad-name", "empty-name", "body-too-big"],
    )
    def test_a_task_that_can_never_be_queued_fails_its_future_as_permanent_at_once(
        self, open_queue: QueueFactory, task: Task
    ) -> None:
        queue = open_queue()

        future = queue.enqueue_soon(task)

        assert isinstance(future.exception(0), Permanent)
        with pytest.raises(Permanent):
            queue.enqueue(task)
        assert queue.list_tasks() == []

    def test_a_task_enqueued_after_close_fails_as_transient(self, open_queue: QueueFactory) -> None:
        queue = open_queue()
        queue.close()

        assert isinstance(
            queue.enqueue_soon(Task(name="gh-late", body=BODY)).exception(1), Transient
        )

    def test_a_started_queue_wakes_for_the_task_and_delivers_it(
        self, open_queue: QueueFactory, worker: RecordingWorker
    ) -> None:
        queue = open_queue()
        queue.start(worker_url=worker.url, auth_token=TOKEN)
        time.sleep(0.2)  # every dispatcher looked, found nothing and sleeps for up to 1 s
        enqueued = time.monotonic()

        assert queue.enqueue_soon(Task(name="gh-soon", body=BODY)).result(WAIT_SECONDS) is True

        [request] = worker.wait_for("gh-soon", 1)
        assert request.body == BODY
        # Woken by the arrival, not by the end of the idle sleep 0.8 s away.
        assert request.at - enqueued < 0.5
        _wait_for_state(queue, "gh-soon", "done")


class TestRetries:
    def test_retry_count_rises_each_attempt_and_execution_count_skips_5xx_answers(
        self, running: SqliteQueue, worker: RecordingWorker
    ) -> None:
        worker.script("gh-flaky", 500, 429, 200)
        running.enqueue(Task(name="gh-flaky", body=BODY))

        received = worker.wait_for("gh-flaky", 3)
        assert [r.retry_count for r in received] == [0, 1, 2]
        # Cloud Tasks counts an execution only for an answer that is not 5xx: the 429 counts.
        assert [r.execution_count for r in received] == [0, 0, 1]
        assert [r.body for r in received] == [BODY] * 3
        etas = [r.eta for r in received]
        assert etas[1] - etas[0] >= 0.05 * 0.99
        assert etas[2] - etas[1] >= 0.1 * 0.99
        task = _wait_for_state(running, "gh-flaky", "done")
        assert (task.attempts, task.last_status) == (3, 200)

    def test_waits_between_attempts_double_then_stop_at_the_maximum(
        self, open_queue: QueueFactory, worker: RecordingWorker
    ) -> None:
        retry = RetryConfig(min_backoff_seconds=0.05, max_backoff_seconds=0.2, max_attempts=5)
        queue = open_queue(retry=retry)
        queue.start(worker_url=worker.url, auth_token=TOKEN)
        worker.script("gh-slow", 500, 500, 500, 500, 200)
        queue.enqueue(Task(name="gh-slow", body=BODY))

        gaps = _gaps(worker.wait_for("gh-slow", 5))
        # Never sooner than the backoff (0.05, 0.1, 0.2, then capped at 0.2); the upper bound is
        # generous so a busy machine does not fail it.
        for gap, backoff in zip(gaps, [0.05, 0.1, 0.2, 0.2], strict=True):
            assert backoff * 0.9 <= gap < backoff + 1.0
        _wait_for_state(queue, "gh-slow", "done")

    def test_retry_after_from_the_worker_is_honoured_over_a_shorter_backoff(
        self, running: SqliteQueue, worker: RecordingWorker
    ) -> None:
        worker.script("gh-busy", Answer(status=503, headers={"Retry-After": "1"}), 200)
        running.enqueue(Task(name="gh-busy", body=BODY))

        [gap] = _gaps(worker.wait_for("gh-busy", 2))
        assert 0.95 <= gap < 2.5
        _wait_for_state(running, "gh-busy", "done")

    def test_an_unreachable_worker_counts_as_a_failed_attempt(
        self, open_queue: QueueFactory
    ) -> None:
        queue = open_queue()
        queue.start(worker_url=f"http://127.0.0.1:{_closed_port()}/worker", auth_token=TOKEN)
        queue.enqueue(Task(name="gh-nobody", body=BODY))

        task = _wait_for_state(queue, "gh-nobody", "dead")
        assert task.attempts == FAST_RETRY.max_attempts
        assert task.last_status is None
        assert "Connection refused" in (task.last_error or "")


class TestDeadLetters:
    def test_after_the_last_attempt_the_task_is_dead_with_its_last_status_and_error(
        self, running: SqliteQueue, worker: RecordingWorker
    ) -> None:
        worker.script(
            "gh-doomed",
            Answer(status=500, body=b"first"),
            Answer(status=502, body=b"second"),
            Answer(status=503, body=b"store unavailable"),
        )
        running.enqueue(Task(name="gh-doomed", body=BODY))

        task = _wait_for_state(running, "gh-doomed", "dead")
        assert (task.attempts, task.last_status, task.last_error) == (3, 503, "store unavailable")
        assert [t.name for t in running.list_tasks("dead")] == ["gh-doomed"]
        time.sleep(QUIET_SECONDS)
        assert len(worker.requests_for("gh-doomed")) == 3
        # A dead name stays taken: a duplicate does not revive it, only retry_dead does.
        assert running.enqueue(Task(name="gh-doomed", body=BODY)) is False

    def test_retry_dead_gives_a_dead_task_a_fresh_set_of_attempts(
        self, running: SqliteQueue, worker: RecordingWorker
    ) -> None:
        worker.script("gh-revived", 500, 500, 500, 500, 200)
        running.enqueue(Task(name="gh-revived", body=BODY))
        _wait_for_state(running, "gh-revived", "dead")

        assert running.retry_dead("gh-revived") is True

        task = _wait_for_state(running, "gh-revived", "done")
        received = worker.requests_for("gh-revived")
        assert [r.retry_count for r in received] == [0, 1, 2, 0, 1]
        assert (task.attempts, task.last_status) == (2, 200)
        assert running.retry_dead("gh-revived") is False  # done, not dead
        assert running.retry_dead("gh-unknown") is False


# Runs the queue in another process so it can be killed -9 with a task leased: a real crash.
_CRASHING_DISPATCHER = """
import sys, time
from looprelay.adapters.sqlite.queue import SqliteQueue
from looprelay.config.model import EmbeddedQueueConfig, RetryConfig
queue = SqliteQueue(sys.argv[1], retry=RetryConfig(),
                      settings=EmbeddedQueueConfig(concurrency=1, dispatch_deadline_seconds=600))
queue.start(worker_url=sys.argv[2], auth_token="t")
time.sleep(600)
"""


class TestRestart:
    def test_queued_tasks_and_one_leased_by_a_killed_process_are_each_delivered_once(
        self, open_queue: QueueFactory, worker: RecordingWorker, db_path: Path
    ) -> None:
        worker.script("gh-in-flight", Answer(hang=True))
        before = open_queue()
        before.enqueue(Task(name="gh-in-flight", body=b"in flight"))
        before.close()
        crashed = subprocess.Popen(
            [sys.executable, "-c", _CRASHING_DISPATCHER, str(db_path), worker.url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            _wait_until(
                lambda: worker.requests_for("gh-in-flight") or crashed.poll() is not None,
                "the other process to send its task",
            )
            assert crashed.poll() is None, crashed.communicate()[1].decode()
        finally:
            crashed.kill()
            crashed.communicate()
        with sqlite3.connect(db_path) as db:
            assert db.execute("SELECT state FROM tasks").fetchall() == [("leased",)]

        after = open_queue()
        after.enqueue(Task(name="gh-queued-1", body=b"one"))
        after.enqueue(Task(name="gh-queued-2", body=b"two"))
        after.start(worker_url=worker.url, auth_token=TOKEN)

        for name in ("gh-in-flight", "gh-queued-1", "gh-queued-2"):
            _wait_for_state(after, name, "done")
        time.sleep(QUIET_SECONDS)
        answered = [r.headers["x-cloudtasks-taskname"] for r in worker.received if r.status]
        assert sorted(answered) == ["gh-in-flight", "gh-queued-1", "gh-queued-2"]
        # The killed process's request reached the worker but was never answered.
        assert [r.status for r in worker.requests_for("gh-in-flight")] == [None, 200]

    def test_opening_the_file_again_does_not_resend_a_task_in_flight(
        self, open_queue: QueueFactory, worker: RecordingWorker
    ) -> None:
        # `looprelay queue list`, `queue retry` and `replay` open the file while `up` runs.
        worker.script("gh-slow-worker", Answer(hang=True))
        dispatching = open_queue()
        dispatching.start(worker_url=worker.url, auth_token=TOKEN)
        dispatching.enqueue(Task(name="gh-slow-worker", body=BODY))
        worker.wait_for("gh-slow-worker", 1)

        listing = open_queue()
        assert [t.state for t in listing.list_tasks()] == ["leased"]

        time.sleep(QUIET_SECONDS)
        assert len(worker.requests_for("gh-slow-worker")) == 1


class TestDedupWindow:
    def test_a_duplicate_name_is_refused_inside_the_window_and_accepted_after_it(
        self, open_queue: QueueFactory, worker: RecordingWorker
    ) -> None:
        clock = FakeTime()
        queue = open_queue(settings=EmbeddedQueueConfig(dedup_window_seconds=60), now=clock)
        queue.start(worker_url=worker.url, auth_token=TOKEN)
        assert queue.enqueue(Task(name="gh-dedup", body=b"first")) is True
        _wait_for_state(queue, "gh-dedup", "done")

        clock.advance(59)
        assert queue.enqueue(Task(name="gh-dedup", body=b"second")) is False
        clock.advance(2)
        assert queue.enqueue(Task(name="gh-dedup", body=b"third")) is True

        _wait_until(lambda: len(worker.requests_for("gh-dedup")) == 2, "the second delivery")
        assert [r.body for r in worker.requests_for("gh-dedup")] == [b"first", b"third"]
        _wait_for_state(queue, "gh-dedup", "done")

    def test_purge_forgets_only_done_tasks_past_the_window(
        self, open_queue: QueueFactory, worker: RecordingWorker
    ) -> None:
        clock = FakeTime()
        queue = open_queue(
            retry=RetryConfig(max_attempts=1),
            settings=EmbeddedQueueConfig(dedup_window_seconds=60),
            now=clock,
        )
        queue.start(worker_url=worker.url, auth_token=TOKEN)
        queue.enqueue(Task(name="gh-old", body=BODY))
        _wait_for_state(queue, "gh-old", "done")
        clock.advance(50)
        worker.script("gh-dead", 500)
        queue.enqueue(Task(name="gh-recent", body=BODY))
        queue.enqueue(Task(name="gh-dead", body=BODY))
        _wait_for_state(queue, "gh-recent", "done")
        _wait_for_state(queue, "gh-dead", "dead")

        clock.advance(11)  # gh-old finished 61 s ago, gh-recent 11 s ago
        assert queue.purge_finished() == 1
        assert sorted(t.name for t in queue.list_tasks()) == ["gh-dead", "gh-recent"]

        clock.advance(1000)  # a dead letter waits for an operator, however old
        assert queue.purge_finished() == 1
        assert [t.name for t in queue.list_tasks()] == ["gh-dead"]


class TestStop:
    def test_stop_returns_promptly_while_idle(
        self, open_queue: QueueFactory, worker: RecordingWorker
    ) -> None:
        queue = open_queue(settings=EmbeddedQueueConfig(concurrency=4))
        queue.start(worker_url=worker.url, auth_token=TOKEN)
        time.sleep(0.2)  # every dispatcher is now waiting for work

        started = time.monotonic()
        queue.stop()
        assert time.monotonic() - started < 0.5

    def test_a_task_queued_after_stop_waits_for_the_next_start(
        self, open_queue: QueueFactory, worker: RecordingWorker
    ) -> None:
        queue = open_queue()
        queue.start(worker_url=worker.url, auth_token=TOKEN)
        queue.stop()
        queue.enqueue(Task(name="gh-later", body=BODY))
        time.sleep(QUIET_SECONDS)
        assert worker.requests_for("gh-later") == []

        queue.start(worker_url=worker.url, auth_token=TOKEN)
        _wait_for_state(queue, "gh-later", "done")
        assert len(worker.requests_for("gh-later")) == 1


class TestYield:
    def test_tasks_wait_while_more_urgent_work_runs_and_go_once_it_is_done(
        self, open_queue: QueueFactory, worker: RecordingWorker
    ) -> None:
        urgent = threading.Event()
        urgent.set()
        asked: list[float] = []

        def yield_to(seconds: float) -> None:
            asked.append(seconds)
            # Busy until the test says otherwise (the bound is checked in the next test).
            while urgent.is_set():
                time.sleep(0.01)

        queue = open_queue()
        queue.start(worker_url=worker.url, auth_token=TOKEN, yield_to=yield_to)
        try:
            queue.enqueue(Task(name="gh-later", body=BODY))
            time.sleep(QUIET_SECONDS)
            assert worker.requests_for("gh-later") == []
        finally:
            urgent.clear()
        worker.wait_for("gh-later", 1)
        assert asked and all(0 < seconds <= 1 for seconds in asked)

    def test_a_task_goes_after_the_bounded_wait_even_if_urgent_work_never_stops(
        self, open_queue: QueueFactory, worker: RecordingWorker
    ) -> None:
        def always_busy(seconds: float) -> None:
            time.sleep(seconds)  # never idle: each call waits out its whole bound

        queue = open_queue()
        queue.start(worker_url=worker.url, auth_token=TOKEN, yield_to=always_busy)
        queue.enqueue(Task(name="gh-starved", body=BODY))
        [request] = worker.wait_for("gh-starved", 1)
        assert request.body == BODY


class TestOlderFiles:
    def test_a_queue_file_of_an_older_version_opens_and_keeps_its_tasks(
        self, db_path: Path, open_queue: QueueFactory
    ) -> None:
        with sqlite3.connect(db_path) as db:
            db.executescript(
                "CREATE TABLE tasks (name TEXT PRIMARY KEY, body BLOB NOT NULL, state TEXT NOT"
                " NULL, attempts INTEGER NOT NULL DEFAULT 0, executions INTEGER NOT NULL"
                " DEFAULT 0, eta REAL NOT NULL, created_at REAL NOT NULL, finished_at REAL,"
                " last_status INTEGER, last_error TEXT);"
                "INSERT INTO tasks (name, body, state, eta, created_at)"
                " VALUES ('old', x'7b7d', 'pending', 0, 0);"
            )
        db.close()
        queue = open_queue()
        assert [(t.name, t.state) for t in queue.list_tasks()] == [("old", "pending")]
        assert queue.enqueue(Task(name="new", body=b"{}"))


class TestLeases:
    def test_a_task_whose_lease_expired_is_taken_again(
        self, open_queue: QueueFactory, worker: RecordingWorker
    ) -> None:
        # A dispatcher that hangs (or cannot write its outcome) past its lease holds the task
        # no longer: another dispatcher of the same process takes it again.
        clock = FakeTime()
        worker.script("gh-hung", Answer(hang=True))
        queue = open_queue(now=clock)
        queue.enqueue(Task(name="gh-hung", body=b"first"))
        queue.start(worker_url=worker.url, auth_token=TOKEN)
        worker.wait_for("gh-hung", 1)
        time.sleep(QUIET_SECONDS)
        assert _task(queue, "gh-hung").state == "leased"

        clock.advance(2 * SETTINGS.dispatch_deadline_seconds + LEASE_MARGIN_SECONDS + 1)
        _wait_for_state(queue, "gh-hung", "done")
        worker.release()  # the first dispatcher's answer never comes; it writes nothing
        time.sleep(QUIET_SECONDS)
        assert _task(queue, "gh-hung").state == "done"
        assert [r.status for r in worker.requests_for("gh-hung")] == [None, 200]
