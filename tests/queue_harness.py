"""What the queue contract suite needs from each backend: the queue and a view of what it holds."""

from __future__ import annotations

from typing import Protocol

from looprelay.ports import Queue


class QueueHarness(Protocol):
    """A queue under test plus a look into its backend."""

    @property
    def queue(self) -> Queue:
        """The adapter under test."""
        ...

    def held(self) -> dict[str, bytes]:
        """Task name -> body of every task the backend accepted."""
        ...

    def due(self, name: str) -> float | None:
        """When the held task ``name`` is due, in epoch seconds; None: at once."""
        ...
