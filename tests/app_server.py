"""Framework-free handlers served over real HTTP by looprelay's own ASGI stack.

``AppServer`` builds the application with ``app.asgi.build_asgi`` (the edge ``looprelay up``
uses: body caps, the thread pool) and serves it with ``app.server.LocalServer`` (uvicorn with
the same limits) on 127.0.0.1 and a free port, from a background thread. A runner API given as
``runner_api`` is served as ``looprelay up`` serves it: its long polls wait on the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from looprelay.app.asgi import AsyncHandler, Blocking, Endpoint, Handler, build_asgi
from looprelay.app.longpoll import runner_api_handler
from looprelay.app.server import LocalServer
from looprelay.service.runners import RunnerApi

RUNNER_PREFIX = "/runner/"


class AppServer:
    """Serves handlers on a port bound at construction; :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        *,
        exact: Mapping[str, Handler] | None = None,
        prefixes: Mapping[str, Handler] | None = None,
        runner_api: RunnerApi | None = None,
        served: Mapping[str, AsyncHandler] | None = None,
        max_body_bytes: int = 1 << 20,
        port: int = 0,
    ) -> None:
        """``exact`` and ``prefixes`` run on the pool; ``served`` (path prefix -> handler) on
        the event loop, as given."""
        blocking = Blocking()
        endpoints = [
            Endpoint(path, blocking(handler), max_body_bytes)
            for path, handler in {**(exact or {}), **(prefixes or {})}.items()
        ]
        endpoints += [Endpoint(path, h, max_body_bytes) for path, h in (served or {}).items()]
        if runner_api is not None:
            handler = runner_api_handler(runner_api, blocking)
            endpoints.append(Endpoint(RUNNER_PREFIX, handler, max_body_bytes))
        self._server = LocalServer(build_asgi(endpoints), host="127.0.0.1", port=port)

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port."""
        return self._server.address

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Serve from a background thread; returns once connections are accepted."""
        self._server.start()

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._server.stop()
