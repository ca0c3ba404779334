"""The runners whose records changed, pushed by Firestore, behind ``RunnerChanges``.

Scenario: 10,000 runners poll 20 instances of the runner API. Each instance keeps the runners
it authenticated lately in a bounded cache (``service.runner_cache.RunnerRecords``) and must
hear when one is revoked, rotated or reports a new status. The registry stamps the runner in
a small document of the current ``BUCKET_SECONDS`` (``{prefix}runner_changes/{bucket}-{shard}``:
``at.{runner_id}``, a server timestamp, spread over ``SHARDS``) in the same batch as each such
change to its runner document. One real-time listener per instance on the buckets of the last
minute or so tells the cache which runners to read again: a change pushes one bucket document,
whose stamps differing from the ones held name the runners that changed.

The listener's result is a few buckets, whatever the fleet's size: at 10,000 runners changing
once an hour (2.8 changes a second) about 20 documents holding about 200 stamps, so a push
costs the client library's re-sort of 20 documents, not of the 10,000 runner documents a
listener on the runners re-sorted (``bench/fleet.py``). The listener is renewed every
``RENEW_SECONDS`` on a window moved on (``ListenedQuery`` ``renew_seconds``); the old result
stands until the new one's first push, whose stamps are all news (the cache reads those few
runners again). A stamp is a blind merge of one field: no read; each bucket document is written
at most 0.7 times a second at 10,000 runners, under Firestore's one a second per document. Old
buckets are deleted by the store's TTL policy on ``expires_at``.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from looprelay.adapters.firestore.common import open_client
from looprelay.adapters.firestore.listener import CHECK_SECONDS, ListenedQuery, ListenerBacked
from looprelay.config.model import FirestoreConfig
from looprelay.ports import RunnerChanged

SHARDS = 4
"""Documents one bucket's stamps are spread over, so each is written under once a second."""
BUCKET_SECONDS = 20
"""How long one set of bucket documents takes the stamps."""
MARGIN_SECONDS = 20.0
"""How far before a listener opens its window starts: clocks that disagree, and changes
written while the previous listener was being replaced."""
RENEW_SECONDS = 40.0
"""How long a listener lives before it is replaced by one on a window moved on."""
KEEP_HOURS = 1
"""How long a bucket document is kept (its ``expires_at``, the TTL field)."""


def _bucket(at: float) -> int:
    return int(at // BUCKET_SECONDS)


def stamp(runner_id: str) -> tuple[str, dict[str, Any]]:
    """The bucket document's id and the merge that stamps ``runner_id`` as changed now
    (written by the registry in the same batch as the change). The shard follows the runner
    id (the same in every process: not Python's salted ``hash``)."""
    bucket = _bucket(time.time())
    shard = zlib.crc32(runner_id.encode()) % SHARDS
    name = f"{bucket}-{shard}"
    expires = datetime.now(UTC) + timedelta(hours=KEEP_HOURS)
    doc = {"name": name, "bucket": bucket, "expires_at": expires}
    return name, doc | {"at": {runner_id: firestore.SERVER_TIMESTAMP}}


@dataclass(frozen=True)
class _Shard:
    shard_id: str
    stamps: Mapping[str, Any]


class FirestoreRunnerChanges(ListenerBacked[_Shard]):
    """The ``RunnerChanges`` port on one Firestore real-time listener, renewed every
    ``RENEW_SECONDS`` and re-opened when it drops. Safe across threads."""

    def __init__(
        self,
        client: firestore.Client,
        *,
        collection_prefix: str = "",
        check_seconds: float = CHECK_SECONDS,
        renew_seconds: float = RENEW_SECONDS,
    ) -> None:
        """Listen to the recent bucket documents of ``{collection_prefix}runner_changes``."""
        changes = client.collection(f"{collection_prefix}runner_changes")

        def recent() -> firestore.Query:
            since = _bucket(time.time() - MARGIN_SECONDS)
            return changes.where(filter=FieldFilter("bucket", ">=", since))

        self._on_change: RunnerChanged = lambda _ids: None
        self._lock = threading.Lock()
        self._held: dict[str, Mapping[str, Any]] = {}
        """Each bucket document's stamps as last pushed: what a push is compared with."""
        self._listened = ListenedQuery(
            recent,
            parse=_shard,
            name="runner changes",
            fallback="runners are authenticated by reading the store",
            on_change=self._pushed,
            check_seconds=check_seconds,
            renew_seconds=renew_seconds,
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

    def _pushed(self, changed: Sequence[_Shard] | None) -> None:
        if changed is None:
            with self._lock:
                self._held.clear()
            self._on_change(None)
            return
        runner_ids: set[str] = set()
        with self._lock:
            for shard in changed:
                held = self._held.get(shard.shard_id, {})
                runner_ids.update(r for r, at in shard.stamps.items() if held.get(r) != at)
                self._held[shard.shard_id] = shard.stamps
            result = self._listened.current()
            if result is not None:  # forget the buckets that left the window
                for gone in set(self._held) - {s.shard_id for s in result.documents.values()}:
                    del self._held[gone]
        self._on_change(runner_ids)


def _shard(data: dict[str, Any]) -> _Shard:
    stamps = data.get("at") or {}
    return _Shard(str(data.get("name", "")), stamps)
