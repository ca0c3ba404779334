"""Build the one ASGI application from configuration: ``build_app``.

Two shapes serve the same paths:

    POST /webhook       GitHub's deliveries (202 once the task is queued)
    POST /worker        the queue's tasks
    POST /runner/v1/... runner agents (schema/runner-api.openapi.json)
    POST /sweeper       Cloud Scheduler's redelivery sweep (cloud only)
    POST /poller        Cloud Scheduler's poll of github.poll.repositories (cloud only;
                        ``looprelay up`` polls from a thread of its own)
    GET  /healthz       liveness
    GET  /status        the operator's status page, or its JSON (app/status.py)

In the cloud each function serves its own path: the status page is the ``status`` function's,
apart from the sweeper, so a sweep (one at a time, on one instance) never holds a page view up
and a page view never takes the instance a scheduled sweep needs.

``build_app(config, environ, data_dir=...)`` is ``looprelay up``'s: the data directory locked,
the SQLite stores, the embedded queue (an enqueue is synced before its 202, and its
dispatchers POST to this same application's ``/worker``), and an in-process signal that wakes
long polls. ``build_app(config, environ, function=...)`` is one Cloud Function's: only that
function's endpoint is built (``looprelay.app.cloud``), so a cold start loads only what it needs,
and it also answers at ``/``, the function's own URL. Adapters are imported where a shape
needs them, never at import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, overload

from starlette.applications import Starlette

from looprelay.app.asgi import Blocking, Endpoint, build_asgi
from looprelay.app.messages import Request, Response, json_response
from looprelay.config.model import Config
from looprelay.config.order import order_rules
from looprelay.errors import ConfigError

if TYPE_CHECKING:
    from looprelay.adapters.sqlite.queue import SqliteQueue
    from looprelay.app.adapters import OpenStores
    from looprelay.app.polling import PollLoop
    from looprelay.app.webhook import WebhookPressure
    from looprelay.ports import Clock, PollCursors, Queue, Store
    from looprelay.service.ingress import Ingress
    from looprelay.service.runners import RunnerApi
    from looprelay.service.waker import DispatchWaker
    from looprelay.service.worker import Worker

log = logging.getLogger("looprelay.up")

WEBHOOK_PATH = "/webhook"
WORKER_PATH = "/worker"
HEALTH_PATH = "/healthz"
RUNNER_PREFIX = "/runner/"
SWEEPER_PATH = "/sweeper"
POLLER_PATH = "/poller"
FUNCTIONS = ("webhook", "worker", "runners", "sweeper", "poller", "status")
"""The Cloud Functions entry points, one endpoint each."""
_HEALTH_MAX_BODY_BYTES = 1024
_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104


@dataclass(frozen=True)
class SecretSource:
    """Where the webhook secret comes from, for the banner."""

    description: str
    generated: bool
    path: Path | None


class LocalApp:
    """``looprelay up``'s application and what it holds open: built by :func:`build_app`,
    started once the server's address is known, closed once it stopped serving."""

    def __init__(
        self,
        *,
        app: Starlette,
        stores: OpenStores,
        queue: SqliteQueue,
        ingress: Ingress,
        runner_api: RunnerApi,
        worker: Worker,
        pressure: WebhookPressure,
        waker: DispatchWaker,
        secret_source: SecretSource,
        worker_token: str,
        data_dir: Path,
        lock: IO[str],
        polling: PollLoop | None = None,
        closing: Sequence[Callable[[], None]] = (),
    ) -> None:
        """``polling``: the poll ingress's loop, started and stopped with dispatching;
        ``closing``: what else to close last."""
        self.app = app
        self.store: Store = stores.store
        self.queue = queue
        self.ingress = ingress
        self.runner_api = runner_api
        self.worker = worker
        self.secret_source = secret_source
        self.data_dir = data_dir
        self._stores = stores
        self._pressure = pressure
        self._waker = waker
        self._worker_token = worker_token
        self._lock = lock
        self.polling = polling
        self._closing = tuple(closing)

    def start(self, *, host: str, port: int) -> None:
        """Start dispatching queued tasks (left from a previous run included) to this
        application's ``/worker`` at ``host:port``, the address the server bound. The
        inbox leases a killed run left are freed first, as its leased tasks are."""
        self._stores.store.free_inboxes()
        self.queue.start(
            worker_url=f"http://{url_host(_ANY_ADDRESS.get(host, host))}:{port}{WORKER_PATH}",
            auth_token=self._worker_token,
            yield_to=self._pressure.wait_until_idle,
        )
        if self.polling is not None:
            self.polling.start()

    def stop_dispatching(self) -> None:
        """Answer waiting long polls "no work" (and every later one at once), then let
        in-flight tasks finish and dispatch no more (their requests need the server, so this
        comes before it stops)."""
        if self.polling is not None:
            self.polling.stop()
        self._waker.close()
        self.queue.stop()

    def close(self) -> None:
        """Commit what was enqueued, close the files, release the data directory's lock."""
        self.queue.close()
        self._stores.close()
        for close in self._closing:
            close()
        self._lock.close()


@overload
def build_app(
    config: Config, environ: Mapping[str, str], *, data_dir: Path, verify: bool = True
) -> LocalApp: ...


@overload
def build_app(config: Config, environ: Mapping[str, str], *, function: str) -> Starlette: ...


def build_app(
    config: Config,
    environ: Mapping[str, str],
    *,
    data_dir: Path | None = None,
    function: str | None = None,
    verify: bool = True,
) -> LocalApp | Starlette:
    """The application of ``looprelay up`` over ``data_dir``, or of the Cloud Function
    ``function`` (one of ``FUNCTIONS``).

    ``up``: locks the data directory (created private if missing), opens the store and the
    queue, reads or creates the webhook secret and the worker's token; ``verify=False``
    accepts unsigned deliveries. Raises ``ConfigError`` for a config that shape cannot run
    (``up`` with Cloud Tasks, unset secret variables, a data directory in use; a cloud
    webhook without secrets, a worker without OIDC, a sweeper without App auth) and
    ``Transient`` when a database cannot be opened.
    """
    if data_dir is not None:
        return _build_local(config, environ, data_dir=data_dir, verify=verify)
    if function not in FUNCTIONS:
        raise ConfigError(f"no Cloud Function {function!r}; one of {', '.join(FUNCTIONS)}")
    return _build_cloud(config, environ, function)


def _build_cloud(config: Config, environ: Mapping[str, str], function: str) -> Starlette:
    from looprelay.app import cloud

    blocking = Blocking()
    if function == "runners":
        from looprelay.app.longpoll import runner_api_handler

        runner_api = cloud.build_runner_api(config, environ)
        handler = runner_api_handler(runner_api.api, blocking)
        return build_asgi(
            [Endpoint(RUNNER_PREFIX, handler, _runner_max_body_bytes())],
            start=[runner_api.start],
        )
    if function == "webhook":
        from looprelay.app.ingress_http import size_refusal, webhook_handler

        ingress = cloud.build_ingress(config, environ)
        cap = config.webhook.max_body_bytes
        endpoints = [
            Endpoint(path, blocking(webhook_handler(ingress)), cap, size_refusal(ingress))
            for path in ("/", WEBHOOK_PATH)
        ]
    elif function == "worker":
        from looprelay.app.worker_http import worker_handler
        from looprelay.ports import MAX_TASK_BYTES

        worker = blocking(worker_handler(cloud.build_worker(config, environ)))
        endpoints = [Endpoint(path, worker, MAX_TASK_BYTES) for path in ("/", WORKER_PATH)]
    elif function == "sweeper":
        from looprelay.app.sweep import SweepHandler

        sweeper = SweepHandler(cloud.build_sweeper(config, environ))
        endpoints = [
            Endpoint(path, blocking(sweeper.handle), _HEALTH_MAX_BODY_BYTES)
            for path in ("/", SWEEPER_PATH)
        ]
    elif function == "poller":
        from looprelay.app.polling import PollHandler

        poller = PollHandler(cloud.build_poller(config, environ))
        endpoints = [
            Endpoint(path, blocking(poller.handle), _HEALTH_MAX_BODY_BYTES)
            for path in ("/", POLLER_PATH)
        ]
    else:
        from looprelay.app.status import DELIVERY_PATH, STATUS_PATH, status_handler, to_status

        # Behind IAM: Cloud Run has authenticated every caller (docs/operations.md).
        reader = cloud.build_status_reader(config)
        handler = status_handler(reader, blocking, local_only=False)
        endpoints = [
            Endpoint(STATUS_PATH, handler, _HEALTH_MAX_BODY_BYTES),
            Endpoint(DELIVERY_PATH, handler, _HEALTH_MAX_BODY_BYTES),
            Endpoint("/", to_status, _HEALTH_MAX_BODY_BYTES),
        ]
    return build_asgi(endpoints)


def _build_local(
    config: Config, environ: Mapping[str, str], *, data_dir: Path, verify: bool
) -> LocalApp:
    from looprelay.datadir import ensure_data_dir, lock_data_dir

    if config.queue.backend != "embedded":
        raise ConfigError("`looprelay up` runs the embedded queue; set queue.backend: embedded")
    data_dir = ensure_data_dir(data_dir)
    lock = lock_data_dir(data_dir)
    try:
        return _open_local(config, environ, data_dir=data_dir, verify=verify, lock=lock)
    except BaseException:
        lock.close()
        raise


def _open_local(
    config: Config, environ: Mapping[str, str], *, data_dir: Path, verify: bool, lock: IO[str]
) -> LocalApp:
    from looprelay.app.adapters import (
        github_client,
        local_queue_authenticator,
        open_local_queue,
        open_stores,
        system_clock,
    )
    from looprelay.app.ingress_http import size_refusal
    from looprelay.app.longpoll import runner_api_handler
    from looprelay.app.services import build_router, build_runner_api
    from looprelay.app.status import DELIVERY_PATH, STATUS_PATH, status_handler, to_status
    from looprelay.app.webhook import WebhookPressure, acknowledge_when_durable
    from looprelay.app.worker_http import worker_handler
    from looprelay.config.secrets import operator_token_from_env
    from looprelay.datadir import WORKER_TOKEN_FILE, read_or_create_secret
    from looprelay.ports import MAX_TASK_BYTES
    from looprelay.service.ingress import Ingress
    from looprelay.service.status import StatusReader
    from looprelay.service.waker import DispatchWaker
    from looprelay.service.worker import Worker, handler_budget

    secrets, secret_source = _webhook_secrets(config, environ, data_dir)
    operator_token = operator_token_from_env(config.server, environ)
    worker_token, _ = read_or_create_secret(data_dir / WORKER_TOKEN_FILE)
    stores = open_stores(config, data_dir=data_dir)
    queue = open_local_queue(config, data_dir=data_dir)
    clock, waker = system_clock(), DispatchWaker()
    ingress = Ingress(
        secrets=secrets, queue=queue, config=config.webhook, verify=verify, clock=clock
    )
    github = github_client(config, environ)
    runner_api = build_runner_api(
        config,
        store=stores.store,
        clock=clock,
        data_dir=data_dir,
        github=github,
        waker=waker,
        work_items=stores.work_items,
        runners=stores.runners,
    )
    router = build_router(
        config,
        store=stores.store,
        clock=clock,
        data_dir=data_dir,
        github=github,
        waker=waker,
        work_items=stores.work_items,
        runners=stores.runners,
    )
    worker = Worker(
        store=stores.store,
        authenticator=local_queue_authenticator(worker_token),
        clock=clock,
        handler=router,
        allowed_events=config.webhook.allowed_events(),
        order_wait=timedelta(seconds=config.routing.order_wait_seconds),
        order_rules=order_rules(config.routing),
        handler_budget_seconds=handler_budget(config.queue.embedded.dispatch_deadline_seconds),
        wakes=queue,
    )
    polling, cursors = _local_polling(
        config, environ, data_dir=data_dir, store=stores.store, queue=queue, clock=clock
    )
    status = StatusReader(
        store=stores.store,
        work_items=stores.work_items,
        runners=stores.runners,
        clock=clock,
        lost_after=timedelta(seconds=config.runners.lost_after_seconds),
        command_args=("--data", str(data_dir)),
        poll_cursors=cursors,
    )
    blocking, pressure = Blocking(), WebhookPressure()
    pages = status_handler(status, blocking, local_only=True, token=operator_token)
    webhook = pressure.tracking(acknowledge_when_durable(ingress, queue.enqueue_soon))
    cap = config.webhook.max_body_bytes
    app = build_asgi(
        [
            Endpoint(WEBHOOK_PATH, webhook, cap, size_refusal(ingress)),
            Endpoint(WORKER_PATH, blocking(worker_handler(worker)), MAX_TASK_BYTES),
            Endpoint(HEALTH_PATH, _health, _HEALTH_MAX_BODY_BYTES),
            *(
                Endpoint(path, pages, _HEALTH_MAX_BODY_BYTES)
                for path in (STATUS_PATH, DELIVERY_PATH)
            ),
            Endpoint("/", to_status, _HEALTH_MAX_BODY_BYTES),
            Endpoint(
                RUNNER_PREFIX, runner_api_handler(runner_api, blocking), _runner_max_body_bytes()
            ),
        ]
    )
    return LocalApp(
        app=app,
        stores=stores,
        queue=queue,
        ingress=ingress,
        runner_api=runner_api,
        worker=worker,
        pressure=pressure,
        waker=waker,
        secret_source=secret_source,
        worker_token=worker_token,
        data_dir=data_dir,
        lock=lock,
        polling=polling,
        closing=[close] if callable(close := getattr(cursors, "close", None)) else [],
    )


def _local_polling(
    config: Config,
    environ: Mapping[str, str],
    *,
    data_dir: Path,
    store: Store,
    queue: Queue,
    clock: Clock,
) -> tuple[PollLoop | None, PollCursors | None]:
    """The poll loop and its cursors when ``github.poll.repositories`` names any."""
    if not config.github.poll.repositories:
        return None, None
    from looprelay.app.adapters import open_poll_cursors
    from looprelay.app.polling import PollLoop
    from looprelay.app.services import build_poller

    cursors = open_poll_cursors(config, data_dir=data_dir)
    poller = build_poller(config, environ, store=store, queue=queue, cursors=cursors, clock=clock)
    return PollLoop(poller, interval_seconds=config.github.poll.interval_seconds), cursors


def url_host(host: str) -> str:
    """``host`` as it goes in a URL (IPv6 addresses in brackets)."""
    return f"[{host}]" if ":" in host else host


def _webhook_secrets(
    config: Config, environ: Mapping[str, str], data_dir: Path
) -> tuple[list[bytes], SecretSource]:
    from looprelay.config.secrets import webhook_secrets_from_env
    from looprelay.datadir import WEBHOOK_SECRET_FILE, read_or_create_secret

    if config.github.webhook_secrets:
        names = ", ".join(config.github.webhook_secrets)
        return (
            webhook_secrets_from_env(config.github, environ),
            SecretSource(f"environment variable(s) {names}", False, None),
        )
    path = data_dir / WEBHOOK_SECRET_FILE
    value, generated = read_or_create_secret(path)
    return [value.encode()], SecretSource(f"file {path}", generated, path)


def _runner_max_body_bytes() -> int:
    from looprelay.wire.runner_api import MAX_BODY_BYTES

    return MAX_BODY_BYTES


async def _health(request: Request) -> Response:
    return json_response(200, {"status": "ok"})
