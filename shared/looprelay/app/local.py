"""``looprelay up``: the application ``app.compose`` builds over a data directory, served on
one loopback port by ``app.server``."""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from looprelay.app.compose import WEBHOOK_PATH, LocalApp, build_app, url_host
from looprelay.app.server import Limits, LocalServer, bind_listener
from looprelay.config.model import Config
from looprelay.errors import ConfigError

log = logging.getLogger("looprelay.up")


class LocalStack:
    """Everything ``looprelay up`` runs, built from a config and a data directory."""

    def __init__(
        self,
        config: Config,
        *,
        data_dir: Path,
        environ: Mapping[str, str],
        verify: bool = True,
        limits: Limits = Limits(),  # noqa: B008 - frozen
    ) -> None:
        """Lock the data directory, open the store and queue and bind the port; the server
        keeps to ``limits``.

        Raises ``ConfigError`` for a config ``looprelay up`` cannot run (Cloud Tasks queue,
        unset secret variables, a data directory in use, a port taken or not allowed).
        """
        self.config = config
        # The port first: a start refused for a taken port creates no data directory, secret
        # or database.
        listener = _listen(config.server.host, config.server.port)
        try:
            self.local: LocalApp = build_app(config, environ, data_dir=data_dir, verify=verify)
        except BaseException:
            listener.close()
            raise
        try:
            self._server = LocalServer(
                self.local.app,
                host=config.server.host,
                port=config.server.port,
                limits=replace(
                    limits, max_connections=config.server.max_connections or limits.max_connections
                ),
                listener=listener,
            )
        except BaseException:
            self.local.close()
            raise
        host, port = self._server.address
        self.base_url = f"http://{url_host(host)}:{port}"
        self.data_dir = self.local.data_dir
        self.secret_source = self.local.secret_source
        self.store = self.local.store
        self.queue = self.local.queue
        self.ingress = self.local.ingress
        self.runner_api = self.local.runner_api
        self.worker = self.local.worker

    @property
    def webhook_url(self) -> str:
        """Where GitHub (or ``looprelay send``) posts deliveries."""
        return self.base_url + WEBHOOK_PATH

    def serve(self, *, on_started: Callable[[], None]) -> int:
        """Serve on this (the main) thread until SIGINT or SIGTERM, then stop and close
        everything; return the exit status (1 when the server stopped serving by itself).

        ``on_started()`` runs once connections are accepted and queued tasks dispatched.
        """

        def started() -> None:
            self.local.start(host=self._server.address[0], port=self._server.address[1])
            log.info("looprelay up serving", extra={"fields": {"url": self.base_url}})
            on_started()

        try:
            return self._server.serve(on_started=started, on_stopping=self.local.stop_dispatching)
        finally:
            self.local.stop_dispatching()
            self.local.close()

    def start(self) -> None:
        """Serve from a background thread and start dispatching queued tasks."""
        self._server.start()
        host, port = self._server.address
        self.local.start(host=host, port=port)
        log.info("looprelay up serving", extra={"fields": {"url": self.base_url}})

    def stop(self) -> None:
        """Let in-flight tasks finish, stop taking requests, close files, release the lock."""
        self.local.stop_dispatching()  # its dispatchers' requests still need the server
        self._server.stop()
        self.local.close()


def _listen(host: str, port: int) -> socket.socket:
    """Bind ``host:port``; ``ConfigError`` saying what to change when that is not possible."""
    try:
        return bind_listener(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"{url_host(host)}:{port} is already in use; stop what listens there or pass "
                "another --port (0: any free port)"
            ) from exc
        raise ConfigError(
            f"cannot listen on {url_host(host)}:{port}: {exc.strerror or exc}; check --host "
            "and --port"
        ) from exc
