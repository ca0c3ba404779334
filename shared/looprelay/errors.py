"""The one error tree of looprelay, classified by who must act.

Adapters translate foreign exceptions into these once, at the edge; callers branch on the class,
never on message text.
"""

from __future__ import annotations


class LoopRelayError(Exception):
    """Base of every error looprelay raises on purpose."""


class ConfigError(LoopRelayError):
    """The operator's configuration is wrong; the message names the key and the fix."""


class BadDelivery(LoopRelayError):
    """A request from outside is malformed; ``status`` is the HTTP code it earns."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Unauthorized(LoopRelayError):
    """The caller did not prove who it is (401) or is not allowed (403)."""

    def __init__(self, message: str, *, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


class NotFound(LoopRelayError):
    """The thing a request names does not exist (404): an unknown dispatch id."""


class Conflict(LoopRelayError):
    """The request came too late: the state it acts on has moved on (409), e.g. a lease
    that passed to another runner."""


class Transient(LoopRelayError):
    """Try again later: a store, queue or GitHub hiccup (429/5xx, network, contention).
    ``retry_after`` (seconds), when known, is the earliest a retry can help."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimited(Transient):
    """GitHub asked not to be called for ``seconds`` more (``Retry-After``, a spent rate limit
    or a secondary limit): a caller that can wait does, instead of calling again."""

    def __init__(self, message: str, *, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


class Permanent(LoopRelayError):
    """Retrying cannot help; the work goes to the dead letters for an operator."""


class RunnerError(LoopRelayError):
    """An agent-side outcome with a machine-readable ``reason``, reported as a result."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
