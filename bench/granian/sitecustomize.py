"""The ``granian`` receiver of ``bench/ingress.py``: ``looprelay up`` served by granian.

Not a mode looprelay offers: granian is the server measured against uvicorn before choosing
(docs/decisions/0007). ``bench/ingress.py`` puts this folder on ``PYTHONPATH`` of that one
``looprelay up``; Python imports ``sitecustomize`` at start-up, and this replaces
``LocalServer.serve`` with granian's embedded server (Rust HTTP, the ASGI app on this
process' uvloop) on the same address, the same application and the same stop sequence.
It needs the ``bench`` extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Callable

import uvloop
from granian.constants import Interfaces
from granian.http import HTTP1Settings
from granian.server.embed import Server

from looprelay.app import server as local_server

HEAD_MILLISECONDS = int(local_server.HEAD_SECONDS * 1000)


def _serve(
    self: local_server.LocalServer,
    *,
    on_started: Callable[[], None],
    on_stopping: Callable[[], None],
) -> int:
    host, port = self.address
    self._socket.close()  # granian binds the address itself

    async def main() -> None:
        loop = asyncio.get_running_loop()
        granian = Server(
            self._app,
            address=host,
            port=port,
            interface=Interfaces.ASGINL,
            backlog=local_server.BACKLOG,
            http1_settings=HTTP1Settings(header_read_timeout=HEAD_MILLISECONDS),
            websockets=False,
            log_enabled=False,
        )

        def stop() -> None:
            on_stopping()
            granian.stop()
            loop.call_soon_threadsafe(granian.main_loop_interrupt.set)

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, lambda: loop.run_in_executor(None, stop))
        serving = asyncio.ensure_future(granian.serve())
        while not serving.done():
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                await asyncio.sleep(0.02)
        on_started()
        await serving

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    return 0


local_server.LocalServer.serve = _serve  # type: ignore[method-assign]
