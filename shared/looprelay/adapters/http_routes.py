"""What the embedded HTTP server serves: paths to handlers, blocking or deferred."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from looprelay.httpmsg import Request, Response

Handler = Callable[[Request], Response]
Reply = Callable[[Response], None]
DeferredHandle = Callable[[Request, Reply], None]


@dataclass(frozen=True)
class Deferred:
    """A handler that never blocks: it runs on the server's loop and must call ``reply``
    exactly once, at once or later from any thread."""

    handle: DeferredHandle


Route = Handler | Deferred


class Routes:
    """Exact paths, then path prefixes (``/runner/``), to handlers."""

    def __init__(self, exact: Mapping[str, Route], prefixes: Mapping[str, Route]) -> None:
        self._exact = dict(exact)
        self._prefixes = dict(prefixes)

    def find(self, path: str) -> Route | None:
        """Return the handler owning ``path``, or None."""
        if path in self._exact:
            return self._exact[path]
        for prefix, handler in self._prefixes.items():
            if path.startswith(prefix):
                return handler
        return None
