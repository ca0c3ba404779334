"""The runners not revoked, pushed by Firestore as they change, behind ``RunnerDirectory``.

Scenario: an instance of the runner API authenticates every poll and heartbeat of its
runners. One real-time listener on the runner documents whose ``revoked_at`` is null
(``listener.ListenedQuery``) keeps them in memory, so a request whose secret matches the
runner held reads nothing. The documents change only on register, rotate and revoke, and
when a heartbeat reports a new status: a heartbeat that only says the runner is alive writes
its liveness document, which nobody listens to (``runners.py``). A revoked runner leaves the
result, and a rotated secret replaces the one held, as soon as the push arrives (well under a
second); until then, and for anything the directory does not hold, the caller reads the
registry (``service.runners.RunnerApi.authenticate``).
"""

from __future__ import annotations

from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from looprelay.adapters.firestore.common import open_client
from looprelay.adapters.firestore.listener import CHECK_SECONDS, ListenedQuery, ListenerBacked
from looprelay.adapters.firestore.runners import runner_from_document
from looprelay.config.model import FirestoreConfig
from looprelay.core.model import RunnerRecord


class FirestoreRunnerDirectory(ListenerBacked[RunnerRecord]):
    """The ``RunnerDirectory`` port on one Firestore real-time listener, re-opened when it
    drops. Safe across threads; :meth:`start` it once, :meth:`close` it once."""

    def __init__(
        self,
        client: firestore.Client,
        *,
        collection_prefix: str = "",
        check_seconds: float = CHECK_SECONDS,
    ) -> None:
        """Listen to the runners of ``{collection_prefix}runners`` not revoked."""
        runners = client.collection(f"{collection_prefix}runners")
        self._listened = ListenedQuery(
            runners.where(filter=FieldFilter("revoked_at", "==", None)),
            parse=runner_from_document,
            name="runner",
            fallback="runners are authenticated by reading the store",
            check_seconds=check_seconds,
        )

    @classmethod
    def from_config(cls, cfg: FirestoreConfig) -> FirestoreRunnerDirectory:
        """The directory on the database ``store.firestore`` names, not listening yet:
        :meth:`start` it in the process that serves (until then :meth:`find` vouches for
        nobody). Raises ``ConfigError`` without credentials."""
        return cls(open_client(cfg), collection_prefix=cfg.collection_prefix)

    def find(self, runner_id: str) -> RunnerRecord | None:
        """See ``RunnerDirectory.find``."""
        result = self._listened.current()
        return None if result is None else result.documents.get(runner_id)
