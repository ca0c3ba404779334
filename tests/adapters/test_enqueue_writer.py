"""The enqueue writer: a process of its own that commits enqueues in batches, and the
parent's client turning its answers into futures. Real processes, real SQLite files."""

from __future__ import annotations

import select
import shutil
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from looprelay.adapters.embedded_queue import EmbeddedQueue
from looprelay.adapters.enqueue_process import EnqueueProcess
from looprelay.adapters.enqueue_writer import (
    DUPLICATE,
    FAILED,
    IDLE_CHECKPOINT_SECONDS,
    QUEUED,
    Request,
    commit_batch,
    encode_request,
    encode_result,
    take_requests,
    take_results,
)
from looprelay.adapters.sqlite_common import SqliteDatabase
from looprelay.config import EmbeddedQueueConfig, RetryConfig
from looprelay.errors import Transient

NOW = 1_000_000.0
WINDOW = 3600.0


@pytest.fixture
def queue_file(tmp_path: Path) -> Path:
    """A queue file with its tables, as ``EmbeddedQueue`` creates it."""
    path = tmp_path / "queue.sqlite3"
    EmbeddedQueue(path, retry=RetryConfig(), settings=EmbeddedQueueConfig()).close()
    return path


@pytest.fixture
def writer(queue_file: Path) -> Iterator[EnqueueProcess]:
    process = EnqueueProcess(queue_file)
    yield process
    process.close()


def _request(name: str, *, now: float = NOW, body: bytes = b"{}") -> Request:
    return Request(0, now, now - WINDOW, name, body)


def _names_on_disk(path: Path) -> list[str]:
    # A connection of its own sees only what was committed.
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT name FROM tasks ORDER BY name")]


class TestFrames:
    @given(
        requests=st.lists(
            st.builds(
                Request,
                seq=st.integers(0, 2**32 - 1),
                now=st.floats(allow_nan=False, allow_infinity=False),
                window_start=st.floats(allow_nan=False, allow_infinity=False),
                name=st.from_regex(r"[A-Za-z0-9_-]{1,500}", fullmatch=True),
                body=st.binary(max_size=300),
            ),
            max_size=5,
        ),
        cut=st.integers(0, 4000),
    )
    def test_requests_come_out_whole_however_the_bytes_are_split(
        self, requests: list[Request], cut: int
    ) -> None:
        stream = b"".join(encode_request(request) for request in requests)
        buffer = bytearray(stream[:cut])
        received = take_requests(buffer)
        buffer += stream[cut:]
        received += take_requests(buffer)
        assert received == requests
        assert not buffer

    def test_results_carry_their_code_and_text(self) -> None:
        buffer = bytearray(encode_result(7, QUEUED) + encode_result(8, FAILED, "disk full"))
        buffer += encode_result(9, DUPLICATE)[:3]  # a partial frame stays in the buffer
        assert take_results(buffer) == [(7, QUEUED, ""), (8, FAILED, "disk full")]
        assert len(buffer) == 3


class TestCommitBatch:
    def test_new_names_are_queued_and_a_name_taken_in_the_same_batch_is_a_duplicate(
        self, queue_file: Path
    ) -> None:
        database = SqliteDatabase(queue_file, schema="", what="queue")
        batch = [_request("a"), _request("b"), _request("a")]
        answers = take_results(bytearray(commit_batch(database, batch)))
        database.close()
        assert [code for _, code, _ in answers] == [QUEUED, QUEUED, DUPLICATE]
        assert _names_on_disk(queue_file) == ["a", "b"]

    def test_a_done_task_is_queued_again_only_once_its_dedup_window_has_passed(
        self, queue_file: Path
    ) -> None:
        database = SqliteDatabase(queue_file, schema="", what="queue")
        commit_batch(database, [_request("done")])
        database.execute("UPDATE tasks SET state = 'done', finished_at = ?", (NOW,))
        inside = take_results(bytearray(commit_batch(database, [_request("done", now=NOW + 60)])))
        after = take_results(
            bytearray(commit_batch(database, [_request("done", now=NOW + WINDOW + 1)]))
        )
        database.close()
        assert (inside[0][1], after[0][1]) == (DUPLICATE, QUEUED)

    def test_a_failed_transaction_fails_every_request_of_the_batch_and_writes_nothing(
        self, tmp_path: Path
    ) -> None:
        database = SqliteDatabase(tmp_path / "no-tables.sqlite3", schema="", what="queue")
        answers = take_results(bytearray(commit_batch(database, [_request("a"), _request("b")])))
        database.close()
        assert [code for _, code, _ in answers] == [FAILED, FAILED]
        assert "no such table" in answers[0][2]


class TestEnqueueProcess:
    def test_concurrent_submits_each_get_their_own_answer_and_every_task_is_on_disk(
        self, writer: EnqueueProcess, queue_file: Path
    ) -> None:
        names = [f"task-{n:03d}" for n in range(120)]
        futures: list[Future[bool]] = []
        lock = threading.Lock()

        def submit(chunk: list[str]) -> None:
            for name in chunk:
                future = writer.submit(_request(name))
                with lock:
                    futures.append(future)

        threads = [threading.Thread(target=submit, args=(names[i::6],)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert all(future.result(30) for future in futures)
        assert not writer.submit(_request("task-000")).result(30)  # taken: a duplicate
        assert _names_on_disk(queue_file) == names

    def test_a_killed_writer_fails_what_it_did_not_answer_and_the_next_submit_restarts_it(
        self, writer: EnqueueProcess, queue_file: Path
    ) -> None:
        assert writer.submit(_request("before")).result(30)
        process = writer._process
        assert process is not None
        process.send_signal(signal.SIGSTOP)  # hold it, so the next task stays unanswered
        stuck = writer.submit(_request("stuck"))
        process.kill()
        with pytest.raises(Transient):
            stuck.result(30)
        assert writer.submit(_request("after")).result(30)
        assert "after" in _names_on_disk(queue_file)

    def test_close_answers_what_was_sent_before_it_and_refuses_what_comes_after(
        self, queue_file: Path
    ) -> None:
        writer = EnqueueProcess(queue_file)
        sent = [writer.submit(_request(f"n{n}")) for n in range(30)]
        writer.close()
        assert all(future.result(0) for future in sent)
        assert len(_names_on_disk(queue_file)) == 30
        with pytest.raises(Transient):
            writer.submit(_request("late")).result(5)

    def test_a_writer_that_cannot_open_its_file_fails_the_start_and_the_submit(
        self, tmp_path: Path
    ) -> None:
        writer = EnqueueProcess(tmp_path / "no-such-folder" / "queue.sqlite3")
        try:
            with pytest.raises(Transient, match="exited while starting"):
                writer.start()
            with pytest.raises(Transient):
                writer.submit(_request("a")).result(30)
        finally:
            writer.close()

    def test_an_idle_writer_folds_its_log_into_the_database_file(
        self, writer: EnqueueProcess, queue_file: Path, tmp_path: Path
    ) -> None:
        assert all(writer.submit(_request(f"n{n}")).result(30) for n in range(20))
        # The database file alone, without its write-ahead log, holds what was checkpointed.
        alone = tmp_path / "alone.sqlite3"
        deadline = time.monotonic() + 10 * IDLE_CHECKPOINT_SECONDS
        while time.monotonic() < deadline:
            shutil.copyfile(queue_file, alone)
            if len(_names_on_disk(alone)) == 20:
                break
            time.sleep(0.2)
        assert len(_names_on_disk(alone)) == 20

    def test_a_watching_loop_is_told_the_socket_and_its_collect_resolves_the_futures(
        self, queue_file: Path
    ) -> None:
        sockets = []
        writer = EnqueueProcess(queue_file, on_start=sockets.append)
        try:
            future = writer.submit(_request("watched"))
            assert len(sockets) == 1
            readable, _, _ = select.select(sockets, [], [], 30)
            # The answer is waiting on the socket, and nobody but the watcher reads it.
            assert readable and not future.done()
            writer.collect()
            assert future.result(0) is True
        finally:
            writer.close()
