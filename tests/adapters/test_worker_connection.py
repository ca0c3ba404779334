"""The embedded queue's connection to the worker, against a raw loopback server that counts
connections and can drop a keep-alive connection the way an idle timeout does."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator

import pytest

from looprelay.adapters.sqlite.worker_connection import REUSE_IDLE_SECONDS, WorkerConnection

DEADLINE = 20.0
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"


class Worker:
    """Answers each request 200 on a keep-alive connection; with ``drop_after_answer`` it
    closes every connection, without saying so, once it has answered on it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.connections = 0
        self.requests = 0
        self.drop_after_answer = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/worker"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buffered = b""
            while True:
                while b"\r\n\r\n" not in buffered:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(buffered) < length:
                    buffered += conn.recv(65536)
                buffered = buffered[length:]
                self.requests += 1
                conn.sendall(ANSWER)
                if self.drop_after_answer:
                    return


@pytest.fixture
def worker() -> Iterator[Worker]:
    serving = Worker()
    yield serving
    serving.listener.close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_connection_is_reused_while_it_was_idle_a_short_while(worker: Worker) -> None:
    clock = Clock()
    connection = WorkerConnection(worker.url, DEADLINE, monotonic=clock)
    assert connection.post(b"{}", {})[0] == 200
    clock.now += REUSE_IDLE_SECONDS / 2
    assert connection.post(b"{}", {})[0] == 200
    assert (worker.connections, worker.requests) == (1, 2)
    connection.close()


def test_a_connection_idle_past_the_reuse_limit_is_replaced_before_it_is_used(
    worker: Worker,
) -> None:
    clock = Clock()
    connection = WorkerConnection(worker.url, DEADLINE, monotonic=clock)
    assert connection.post(b"{}", {})[0] == 200
    clock.now += REUSE_IDLE_SECONDS
    assert connection.post(b"{}", {})[0] == 200
    assert (worker.connections, worker.requests) == (2, 2)
    connection.close()


def test_a_reused_connection_the_server_closed_is_sent_again_on_a_new_one(
    worker: Worker,
) -> None:
    worker.drop_after_answer = True
    connection = WorkerConnection(worker.url, DEADLINE, monotonic=Clock())
    assert connection.post(b"{}", {})[0] == 200
    assert connection.post(b"{}", {})[0] == 200  # the first connection is gone by now
    assert (worker.connections, worker.requests) == (2, 2)
    connection.close()


def test_a_new_connection_that_fails_is_not_retried() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        accepted: list[int] = []

        def hang_up() -> None:
            conn, _ = listener.accept()
            accepted.append(1)
            conn.recv(65536)
            conn.close()  # no answer at all

        threading.Thread(target=hang_up, daemon=True).start()
        connection = WorkerConnection(f"http://127.0.0.1:{port}/worker", DEADLINE)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            connection.post(b"{}", {})
        assert accepted == [1]
