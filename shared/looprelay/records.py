"""Documents the store keeps: the delivery ledger and the event log.

These are pydantic models because they cross an edge (SQLite rows, Firestore documents, the
``--json`` output of listing commands).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

RECEIVED = "received"
"""Ledger outcome of a delivery the worker has taken but not yet settled."""

SETTLED_OUTCOMES = ("dispatched", "ignored", "failed")
"""Settled outcomes besides ``refused:<reason>`` (SPEC §2, delivery ledger)."""

MAX_DETAIL_CHARS = 2_000
"""Cap on the free-text ``detail`` of a ledger record, so no document can grow without bound."""


def is_valid_outcome(outcome: str) -> bool:
    """Tell whether ``outcome`` is one the ledger may hold."""
    if outcome == RECEIVED or outcome in SETTLED_OUTCOMES:
        return True
    prefix, _, reason = outcome.partition(":")
    return prefix == "refused" and bool(reason)


class DeliveryRecord(BaseModel):
    """One GitHub delivery as the worker saw it; keyed by ``X-GitHub-Delivery``."""

    model_config = ConfigDict(frozen=True)

    delivery_id: str
    event: str
    action: str | None = None
    outcome: str = RECEIVED
    detail: str = Field(default="", max_length=MAX_DETAIL_CHARS)
    attempts: int = 1
    received_at: datetime
    settled_at: datetime | None = None
    envelope: str = ""
    """The slim envelope as JSON, kept so a dead letter can be replayed."""

    @property
    def settled(self) -> bool:
        """Whether the delivery has reached its one final outcome."""
        return self.outcome != RECEIVED


class EventRecord(BaseModel):
    """One structured event of the log that ``looprelay events`` lists."""

    model_config = ConfigDict(frozen=True)

    name: str
    at: datetime
    delivery_id: str | None = None
    work_item: str | None = None
    severity: str = "INFO"
    data: dict[str, Any] = Field(default_factory=dict)


class RegistrationToken(BaseModel):
    """A single-use token an operator mints to let one runner register; stored hashed."""

    model_config = ConfigDict(frozen=True)

    token_hash: str
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None = None


MAX_RUNNER_LABELS = 32


class RunnerRecord(BaseModel):
    """A registered runner agent. Only the hash of its secret is ever stored."""

    model_config = ConfigDict(frozen=True)

    runner_id: str
    name: str
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_RUNNER_LABELS)
    secret_hash: str
    registered_at: datetime
    last_seen_at: datetime | None = None
    revoked_at: datetime | None = None
    version: str = ""
    capacity: int = 1

    @property
    def revoked(self) -> bool:
        """Whether an operator revoked this runner."""
        return self.revoked_at is not None
