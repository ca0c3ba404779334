"""Registration tokens and runners in Firestore, behind ``RunnerRegistry``.

Layout: ``{prefix}registration_tokens/{token_hash}`` (with ``expires_at``, also the TTL field)
and ``{prefix}runners/{runner_id}``. A runner document is written about once per heartbeat,
far below Firestore's one-write-per-second guidance for a document.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from looprelay.adapters.firestore.common import (
    conditional_update,
    open_client,
    translated,
    utc,
)
from looprelay.config.model import FirestoreConfig
from looprelay.core.model import RegistrationToken, RunnerRecord
from looprelay.ports import RunnerStatus

_TIME_FIELDS = ("registered_at", "last_seen_at", "revoked_at")


class FirestoreRunnerRegistry:
    """The ``RunnerRegistry`` port on Firestore."""

    def __init__(self, client: firestore.Client, *, collection_prefix: str = "") -> None:
        """Use ``client``'s database, with collections named ``{collection_prefix}...``."""
        self._client = client
        self._tokens = client.collection(f"{collection_prefix}registration_tokens")
        self._runners = client.collection(f"{collection_prefix}runners")

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
        """See ``RunnerRegistry.add_runner``."""
        with translated("store a runner"):
            try:
                self._runners.document(runner.runner_id).create(runner.model_dump())
            except gexc.AlreadyExists as exc:
                raise ValueError(f"runner {runner.runner_id} already exists") from exc

    def get_runner(self, runner_id: str) -> RunnerRecord | None:
        """See ``RunnerRegistry.get_runner``."""
        with translated("read a runner"):
            snapshot = self._runners.document(runner_id).get()
        return _runner(snapshot.to_dict()) if snapshot.exists else None

    def list_runners(self, *, include_revoked: bool = True) -> list[RunnerRecord]:
        """See ``RunnerRegistry.list_runners``: without the revoked ones, only runners whose
        ``revoked_at`` is null are read (a single-field index; sorted here, not by the
        query, so no composite index is needed)."""
        query: firestore.Query | firestore.CollectionReference = self._runners
        if not include_revoked:
            query = self._runners.where(filter=FieldFilter("revoked_at", "==", None))
        with translated("list runners"):
            docs = query.stream()
            runners = [_runner(doc.to_dict()) for doc in docs]
        return sorted(runners, key=lambda r: (r.registered_at, r.runner_id))

    def _change(self, runner_id: str, fields: dict[str, Any], action: str) -> bool:
        def unless_revoked(doc: dict[str, Any]) -> dict[str, Any] | None:
            return None if doc.get("revoked_at") is not None else fields

        return conditional_update(
            self._client, self._runners.document(runner_id), unless_revoked, action=action
        )

    def revoke_runner(self, runner_id: str, *, at: datetime) -> bool:
        """See ``RunnerRegistry.revoke_runner``."""
        return self._change(runner_id, {"revoked_at": at}, "revoke a runner")

    def rotate_runner_secret(self, runner_id: str, *, secret_hash: str) -> bool:
        """See ``RunnerRegistry.rotate_runner_secret``."""
        return self._change(runner_id, {"secret_hash": secret_hash}, "rotate a runner secret")

    def record_heartbeat(self, runner_id: str, *, at: datetime, status: RunnerStatus) -> bool:
        """See ``RunnerRegistry.record_heartbeat``."""
        fields = {
            "last_seen_at": at,
            "version": status.version,
            "capacity": status.capacity,
            "repositories": list(status.repositories),
            "workspace": status.workspace,
            "sessions": status.sessions,
        }
        return self._change(runner_id, fields, "record a heartbeat")


def _runner(doc: dict[str, Any] | None) -> RunnerRecord:
    data = dict(doc or {})
    for name in _TIME_FIELDS:
        if data.get(name) is not None:
            data[name] = utc(data[name])
    return RunnerRecord.model_validate(data)
