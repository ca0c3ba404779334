"""``looprelay up``: the webhook, worker and runner API on one loopback port, with the
embedded store and queue in a data directory."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from looprelay.adapters.clock import SystemClock
from looprelay.adapters.embedded_queue import EmbeddedQueue
from looprelay.adapters.http_server import (
    Deferred,
    DeferredHandle,
    EmbeddedHttpServer,
    Reply,
    Routes,
)
from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator
from looprelay.config import Config
from looprelay.datadir import (
    QUEUE_FILE,
    WEBHOOK_SECRET_FILE,
    WORKER_TOKEN_FILE,
    ensure_data_dir,
    lock_data_dir,
    read_or_create_secret,
)
from looprelay.errors import ConfigError
from looprelay.httpmsg import Request, Response, json_response
from looprelay.ingress import Ingress
from looprelay.leases import DispatchWaker
from looprelay.secrets_env import webhook_secrets_from_env
from looprelay.stores import open_stores
from looprelay.wiring import build_router, build_runner_api, github_client
from looprelay.worker import Worker

log = logging.getLogger("looprelay.up")

WEBHOOK_PATH = "/webhook"
WORKER_PATH = "/worker"
HEALTH_PATH = "/healthz"
RUNNER_PREFIX = "/runner/"
_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104


@dataclass(frozen=True)
class SecretSource:
    """Where the webhook secret comes from, for the banner."""

    description: str
    generated: bool
    path: Path | None


class WebhookPressure:
    """Counts webhook requests in flight, so background work can let them go first.

    GitHub waits 10 s for an ack and never retries a failed delivery by itself, while a
    queued task has hours; in one process the two share a core (and the GIL), so during a
    burst the queue's dispatchers wait for the webhook to be idle (for a bounded time).
    """

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._in_flight = 0

    def tracking(self, handle: DeferredHandle) -> DeferredHandle:
        """Wrap ``handle`` so each request counts from its arrival until it is answered."""

        def tracked(request: Request, reply: Reply) -> None:
            with self._idle:
                self._in_flight += 1
            answered = False

            def counted_reply(response: Response) -> None:
                nonlocal answered
                if not answered:
                    answered = True
                    self._leave()
                reply(response)

            try:
                handle(request, counted_reply)
            except BaseException:
                if not answered:
                    answered = True
                    self._leave()
                raise

        return tracked

    def wait_until_idle(self, seconds: float) -> None:
        """Return once no webhook request is in flight, or after ``seconds``."""
        with self._idle:
            self._idle.wait_for(lambda: not self._in_flight, seconds)

    def _leave(self) -> None:
        with self._idle:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.notify_all()


def acknowledge_when_durable(ingress: Ingress, queue: EmbeddedQueue) -> DeferredHandle:
    """The webhook for a server that must not block: the task goes to the queue's next group
    commit and the ack goes out once that commit is on disk (from whichever thread resolves
    the enqueue: in ``looprelay up``, the server's loop)."""

    def handle(request: Request, reply: Reply) -> None:
        admitted = ingress.admit(request)
        if isinstance(admitted, Response):
            reply(admitted)
            return

        def committed(done: Future[bool]) -> None:
            try:
                response = ingress.answer(admitted, done.result)
            except Exception:
                log.exception("webhook answer failed")
                response = json_response(500, {"error": "internal error"})
            reply(response)

        queue.enqueue_soon(admitted.task).add_done_callback(committed)

    return handle


class EmbeddedStack:
    """Everything ``looprelay up`` runs, built from a config and a data directory."""

    def __init__(
        self,
        config: Config,
        *,
        data_dir: Path,
        environ: Mapping[str, str],
        verify: bool = True,
    ) -> None:
        """Lock the data directory, open the store and queue and bind the port.

        Raises ``ConfigError`` for a config ``looprelay up`` cannot run (Cloud Tasks queue,
        unset secret variables, a data directory in use) and ``OSError`` when the port is
        taken.
        """
        if config.queue.backend != "embedded":
            raise ConfigError("`looprelay up` runs the embedded queue; set queue.backend: embedded")
        self.config = config
        self.data_dir = ensure_data_dir(data_dir)
        self._lock: IO[str] = lock_data_dir(self.data_dir)
        secrets, self.secret_source = self._webhook_secrets(environ)
        worker_token, _ = read_or_create_secret(self.data_dir / WORKER_TOKEN_FILE)
        self._server = EmbeddedHttpServer(
            host=config.server.host,
            port=config.server.port,
            max_body_bytes=config.webhook.max_body_bytes,
        )
        host, port = self._server.address
        self.base_url = f"http://{_url_host(host)}:{port}"
        self._stores = open_stores(config, data_dir=self.data_dir)
        self.store = self._stores.store
        self._worker_url = self._loopback_url(host, port) + WORKER_PATH
        self._worker_token = worker_token
        self.queue = EmbeddedQueue(
            self.data_dir / QUEUE_FILE,
            retry=config.queue.retry,
            settings=config.queue.embedded,
            # The loop reads the enqueue writer's answers itself: an ack goes out the moment
            # its commit lands, with no thread in between.
            watch=lambda sock: self._server.watch(sock, self.queue.collect_enqueued),
        )
        self.ingress = Ingress(
            secrets=secrets, queue=self.queue, config=config.webhook, verify=verify
        )
        clock = SystemClock()
        waker = DispatchWaker()
        github = github_client(config, environ)
        self.runner_api = build_runner_api(
            config,
            store=self.store,
            clock=clock,
            data_dir=self.data_dir,
            github=github,
            waker=waker,
            work_items=self._stores.work_items,
            runners=self._stores.runners,
        )
        self.worker = Worker(
            store=self.store,
            authenticator=SharedSecretAuthenticator(worker_token),
            clock=clock,
            handler=build_router(
                config,
                store=self.store,
                clock=clock,
                data_dir=self.data_dir,
                github=github,
                waker=waker,
                work_items=self._stores.work_items,
                runners=self._stores.runners,
            ),
        )

    @property
    def webhook_url(self) -> str:
        """Where GitHub (or ``looprelay send``) posts deliveries."""
        return self.base_url + WEBHOOK_PATH

    def start(self) -> None:
        """Serve and start dispatching queued tasks (including ones left from a previous run)."""
        pressure = WebhookPressure()
        routes = Routes(
            {
                WEBHOOK_PATH: Deferred(
                    pressure.tracking(acknowledge_when_durable(self.ingress, self.queue))
                ),
                WORKER_PATH: self.worker.handle,
                HEALTH_PATH: _health,
            },
            {RUNNER_PREFIX: self.runner_api.handle},
        )
        self._server.start(routes)
        self.queue.start(
            worker_url=self._worker_url,
            auth_token=self._worker_token,
            yield_to=pressure.wait_until_idle,
        )
        log.info("looprelay up serving", extra={"fields": {"url": self.base_url}})

    def stop(self) -> None:
        """Let in-flight tasks finish, stop taking requests, close files, release the lock."""
        self.queue.stop()  # its dispatchers' requests still need the server
        self._server.stop()
        self.queue.close()
        self._stores.close()
        self._lock.close()

    def _webhook_secrets(self, environ: Mapping[str, str]) -> tuple[list[bytes], SecretSource]:
        if self.config.github.webhook_secrets:
            names = ", ".join(self.config.github.webhook_secrets)
            return (
                webhook_secrets_from_env(self.config.github, environ),
                SecretSource(f"environment variable(s) {names}", False, None),
            )
        path = self.data_dir / WEBHOOK_SECRET_FILE
        value, generated = read_or_create_secret(path)
        return [value.encode()], SecretSource(f"file {path}", generated, path)

    @staticmethod
    def _loopback_url(host: str, port: int) -> str:
        return f"http://{_url_host(_ANY_ADDRESS.get(host, host))}:{port}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _health(request: Request) -> Response:
    return json_response(200, {"status": "ok"})
