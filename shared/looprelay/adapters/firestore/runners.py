"""Registration tokens and runners in Firestore, behind ``RunnerRegistry``.

Layout: ``{prefix}registration_tokens/{token_hash}`` (with ``expires_at``, also the TTL field),
``{prefix}runners/{runner_id}``, ``{prefix}runner_liveness/{runner_id}`` and
``{prefix}runner_changes/{shard}``.

Scenario: every instance of the runner API keeps the runners it authenticated lately in a
bounded cache, told of each change to one by a stamp in a shard document written in the same
batch (``runner_changes.py``), whose listener bills one read per change per instance. A
runner's identity (secret, labels, revocation) and status (version, repositories, sessions)
stay in its runner document, written on register, rotate and revoke and when a heartbeat
reports a new status; when it is alive and nothing else changed, the heartbeat only sets
``last_seen_at`` in its liveness document: a write that reads nothing and announces
nothing. Reading a runner reads both and keeps the later ``last_seen_at``; a liveness document
never makes a runner known or unrevoked, whatever it holds. Each document is written about
once per heartbeat (30 s) at most, far below Firestore's one write a second per document.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from looprelay.adapters.firestore.common import (
    conditional_update,
    get_documents,
    open_client,
    translated,
    utc,
)
from looprelay.adapters.firestore.runner_changes import stamp
from looprelay.config.model import FirestoreConfig
from looprelay.core.model import RegistrationToken, RunnerRecord
from looprelay.core.scheduling import with_last_seen
from looprelay.core.slots import WORKSPACE_LABEL
from looprelay.ports import RunnerStatus

_TIME_FIELDS = ("registered_at", "last_seen_at", "revoked_at")


class FirestoreRunnerRegistry:
    """The ``RunnerRegistry`` port on Firestore."""

    def __init__(self, client: firestore.Client, *, collection_prefix: str = "") -> None:
        """Use ``client``'s database, with collections named ``{collection_prefix}...``."""
        self._client = client
        self._tokens = client.collection(f"{collection_prefix}registration_tokens")
        self._runners = client.collection(f"{collection_prefix}runners")
        self._liveness = client.collection(f"{collection_prefix}runner_liveness")
        self._changes = client.collection(f"{collection_prefix}runner_changes")

    @classmethod
    def from_config(cls, cfg: FirestoreConfig) -> FirestoreRunnerRegistry:
        """Build from the ``store.firestore`` section; ``ConfigError`` without credentials."""
        return cls(open_client(cfg), collection_prefix=cfg.collection_prefix)

    def add_registration_token(self, token: RegistrationToken) -> None:
        """See ``RunnerRegistry.add_registration_token``."""
        with translated("store a registration token"):
            self._tokens.document(token.token_hash).create(token.model_dump())

    def consume_registration_token(self, token_hash: str, *, at: datetime) -> bool:
        """See ``RunnerRegistry.consume_registration_token``."""

        def use(doc: dict[str, Any]) -> dict[str, Any] | None:
            fresh = doc.get("used_at") is None and utc(doc["expires_at"]) > at
            return {"used_at": at} if fresh else None

        return conditional_update(
            self._client, self._tokens.document(token_hash), use, action="use a token"
        )

    def add_runner(self, runner: RunnerRecord) -> None:
        """See ``RunnerRegistry.add_runner``: its liveness document is written too, so none
        left from before can speak for it."""
        batch = self._client.batch()
        batch.create(self._runners.document(runner.runner_id), runner.model_dump())
        batch.set(self._alive(runner.runner_id), {"last_seen_at": runner.last_seen_at})
        with translated("store a runner"):
            try:
                batch.commit()
            except gexc.AlreadyExists as exc:
                raise ValueError(f"runner {runner.runner_id} already exists") from exc

    def get_runner(self, runner_id: str) -> RunnerRecord | None:
        """See ``RunnerRegistry.get_runner``: its two documents in one batch get."""
        return self.get_runners([runner_id]).get(runner_id)

    def get_runners(self, runner_ids: Collection[str]) -> dict[str, RunnerRecord]:
        """See ``RunnerRegistry.get_runners``: each runner's two documents (the runner and its
        liveness), ``common.REFS_PER_BATCH`` documents a batch get."""
        pairs = [(self._runners.document(r), self._alive(r)) for r in sorted(set(runner_ids))]
        refs = [ref for pair in pairs for ref in pair]
        docs = get_documents(self._client, refs, action="read runners")
        return {
            runner.id: with_last_seen(runner_from_document(record), _seen(docs.get(alive.path)))
            for runner, alive in pairs
            if (record := docs.get(runner.path)) is not None
        }

    def list_runners(self) -> list[RunnerRecord]:
        """See ``RunnerRegistry.list_runners``: the runner documents, then their liveness
        documents (sorted here, not by the query, so no index is needed)."""
        with translated("list runners"):
            runners = [runner_from_document(doc.to_dict()) for doc in self._runners.stream()]
        seen = self._seen_of([r.runner_id for r in runners])
        merged = [with_last_seen(r, seen.get(r.runner_id)) for r in runners]
        return sorted(merged, key=lambda r: (r.registered_at, r.runner_id))

    def find_checkout_runner(self) -> str | None:
        """See ``RunnerRegistry.find_checkout_runner``: at most two queries of one document,
        on equality filters alone (Firestore merges their single-field indexes)."""
        live = FieldFilter("revoked_at", "==", None)
        wants = (
            FieldFilter("workspace", "==", True),
            FieldFilter(f"labels.{WORKSPACE_LABEL}", "==", "true"),
        )
        with translated("find a runner that makes checkouts"):
            for want in wants:
                query = self._runners.where(filter=live).where(filter=want).limit(1)
                if (found := next(iter(query.stream()), None)) is not None:
                    return found.id
        return None

    def list_last_seen(self, runner_ids: Collection[str]) -> dict[str, datetime]:
        """See ``RunnerRegistry.list_last_seen``: their liveness documents alone,
        ``common.REFS_PER_BATCH`` a batch get."""
        return self._seen_of(sorted(set(runner_ids)))

    def _seen_of(self, runner_ids: list[str]) -> dict[str, datetime]:
        refs = {runner_id: self._alive(runner_id) for runner_id in runner_ids}
        docs = get_documents(
            self._client, list(refs.values()), action="read when runners were seen"
        )
        seen = {runner_id: _seen(docs.get(ref.path)) for runner_id, ref in refs.items()}
        return {runner_id: at for runner_id, at in seen.items() if at is not None}

    def _alive(self, runner_id: str) -> firestore.DocumentReference:
        return self._liveness.document(runner_id)

    def _change(self, runner_id: str, fields: dict[str, Any], action: str) -> bool:
        def unless_revoked(doc: dict[str, Any]) -> dict[str, Any] | None:
            return None if doc.get("revoked_at") is not None else fields

        # Announced in the same write: every instance's cache of this runner reads it again.
        shard, stamped = stamp(runner_id)
        announce = (self._changes.document(shard), stamped)
        return conditional_update(
            self._client,
            self._runners.document(runner_id),
            unless_revoked,
            action=action,
            also=announce,
        )

    def revoke_runner(self, runner_id: str, *, at: datetime) -> bool:
        """See ``RunnerRegistry.revoke_runner``."""
        return self._change(runner_id, {"revoked_at": at}, "revoke a runner")

    def rotate_runner_secret(self, runner_id: str, *, secret_hash: str) -> bool:
        """See ``RunnerRegistry.rotate_runner_secret``."""
        return self._change(runner_id, {"secret_hash": secret_hash}, "rotate a runner secret")

    def record_heartbeat(self, runner_id: str, *, at: datetime, status: RunnerStatus) -> bool:
        """See ``RunnerRegistry.record_heartbeat``: the runner document (1 read, 1 write),
        then its liveness document."""
        fields = {"last_seen_at": at, **status.record_fields()}
        if not self._change(runner_id, fields, "record a heartbeat"):
            return False
        self.record_alive(runner_id, at=at)
        return True

    def record_alive(self, runner_id: str, *, at: datetime) -> None:
        """See ``RunnerRegistry.record_alive``: one blind write of the liveness document."""
        with translated("record that a runner is alive"):
            self._alive(runner_id).set({"last_seen_at": at})


def runner_from_document(doc: dict[str, Any] | None) -> RunnerRecord:
    """The runner a runner document holds; ``ValidationError`` when it holds none."""
    data = dict(doc or {})
    for name in _TIME_FIELDS:
        if data.get(name) is not None:
            data[name] = utc(data[name])
    return RunnerRecord.model_validate(data)


def _seen(liveness: dict[str, Any] | None) -> datetime | None:
    at = (liveness or {}).get("last_seen_at")
    return utc(at) if at is not None else None
