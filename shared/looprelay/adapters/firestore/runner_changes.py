"""The runners whose records changed, pushed by Firestore, behind ``RunnerChanges``.

Scenario: 10,000 runners poll 20 instances of the runner API. Each instance keeps the runners
it authenticated lately in a bounded cache (``service.runner_cache.RunnerRecords``), and
must hear when one is revoked, rotated or reports a new status. The registry writes a small
change document (``{prefix}runner_changes/{auto id}``: ``runner_id``, ``at``) in the same
batch as each such change to a runner document. One real-time listener per instance on the
change documents of the last few minutes tells the cache which runners to read again. Its
result holds the changes of that window, not the fleet: at one change per runner-hour,
10,000 runners make 2.8 a second, so a 5-minute window holds about 830 documents, and each
push costs the client library's re-sort of those, not of 10,000 runner documents. The
listener is renewed on a window moved on (``ListenedQuery`` ``renew_seconds``), so old
documents stay out of every result; the store's TTL policy on ``expires_at`` deletes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter
from pydantic import BaseModel, Field

from looprelay.adapters.firestore.common import open_client
from looprelay.adapters.firestore.listener import CHECK_SECONDS, ListenedQuery, ListenerBacked
from looprelay.config.model import FirestoreConfig
from looprelay.ports import RunnerChanged

WINDOW_SECONDS = 300.0
"""How long a listener lives before it is renewed on a window moved on."""
MARGIN_SECONDS = 120.0
"""How far before its opening a listener's window starts: covers clocks that disagree and a
change written while the previous listener was being replaced."""
KEEP_DAYS = 1
"""How long a change document is kept (its ``expires_at``, the TTL field)."""


def change_document(runner_id: str) -> dict[str, Any]:
    """The change document announcing that ``runner_id``'s record changed (written by the
    registry in the same batch as the change)."""
    return {
        "runner_id": runner_id,
        "at": firestore.SERVER_TIMESTAMP,
        "expires_at": datetime.now(UTC) + timedelta(days=KEEP_DAYS),
    }


class FirestoreRunnerChanges(ListenerBacked[str]):
    """The ``RunnerChanges`` port on one Firestore real-time listener, renewed every
    ``WINDOW_SECONDS`` and re-opened when it drops. Safe across threads."""

    def __init__(
        self,
        client: firestore.Client,
        *,
        collection_prefix: str = "",
        check_seconds: float = CHECK_SECONDS,
        window_seconds: float = WINDOW_SECONDS,
    ) -> None:
        """Listen to the recent documents of ``{collection_prefix}runner_changes``."""
        changes = client.collection(f"{collection_prefix}runner_changes")
        self._on_change: RunnerChanged = lambda _ids: None

        def recent() -> firestore.Query:
            since = datetime.now(UTC) - timedelta(seconds=MARGIN_SECONDS)
            return changes.where(filter=FieldFilter("at", ">=", since))

        self._listened = ListenedQuery(
            recent,
            parse=_runner_id,
            name="runner changes",
            fallback="runners are authenticated by reading the store",
            on_change=self._pushed,
            check_seconds=check_seconds,
            renew_seconds=window_seconds,
        )

    @classmethod
    def from_config(cls, cfg: FirestoreConfig) -> FirestoreRunnerChanges:
        """The feed on the database ``store.firestore`` names, not listening yet: start it in
        the process that serves. Raises ``ConfigError`` without credentials."""
        return cls(open_client(cfg), collection_prefix=cfg.collection_prefix)

    def start(self, on_change: RunnerChanged) -> None:  # type: ignore[override]
        """See ``RunnerChanges.start``."""
        self._on_change = on_change
        self._listened.start()

    def live(self) -> bool:
        """See ``RunnerChanges.live``."""
        return self._listened.current() is not None

    def _pushed(self, changed: Sequence[str] | None) -> None:
        self._on_change(None if changed is None else set(changed))


class _Change(BaseModel):
    runner_id: str = Field(min_length=1)


def _runner_id(data: dict[str, Any]) -> str:
    # ``ValidationError`` marks a document that names no runner unreadable.
    return _Change.model_validate(data).runner_id
