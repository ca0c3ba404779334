"""The poll ingress's cursors in Firestore, behind ``PollCursors``.

Layout: ``{prefix}poll_cursors/{owner}~{repo}~{listing}``, no TTL: a cursor is where polling
stands, not a record to age out. One poller writes each, at most once a poll interval.
"""

from __future__ import annotations

from typing import Any

from google.cloud import firestore

from looprelay.adapters.firestore.common import open_client, translated, utc
from looprelay.config.model import FirestoreConfig
from looprelay.core.poll import PollCursor

_TIME_FIELDS = ("began", "since", "polled_at", "failed_at", "retry_at")


class FirestorePollCursors:
    """The ``PollCursors`` port on Firestore."""

    def __init__(self, client: firestore.Client, *, collection_prefix: str = "") -> None:
        """Use ``client``'s database, with collections named ``{collection_prefix}...``."""
        self._cursors = client.collection(f"{collection_prefix}poll_cursors")

    @classmethod
    def from_config(cls, cfg: FirestoreConfig) -> FirestorePollCursors:
        """Build from the ``store.firestore`` section; ``ConfigError`` without credentials."""
        return cls(open_client(cfg), collection_prefix=cfg.collection_prefix)

    def get_poll_cursor(self, repository: str, listing: str) -> PollCursor | None:
        """See ``PollCursors.get_poll_cursor``."""
        with translated("read a poll cursor"):
            data = self._cursors.document(_key(repository, listing)).get().to_dict()
        return None if data is None else _cursor(data)

    def save_poll_cursor(self, cursor: PollCursor) -> None:
        """See ``PollCursors.save_poll_cursor``."""
        with translated("write a poll cursor"):
            self._cursors.document(_key(cursor.repository, cursor.listing)).set(cursor.model_dump())

    def list_poll_cursors(self) -> list[PollCursor]:
        """See ``PollCursors.list_poll_cursors``."""
        with translated("list the poll cursors"):
            found = [_cursor(doc.to_dict() or {}) for doc in self._cursors.stream()]
        return sorted(found, key=lambda cursor: (cursor.repository, cursor.listing))


def _key(repository: str, listing: str) -> str:
    # "/" separates a document path; "~" is in no repository name nor listing.
    return f"{repository.lower().replace('/', '~')}~{listing}"


def _cursor(data: dict[str, Any]) -> PollCursor:
    times = {key: utc(data[key]) for key in _TIME_FIELDS if data.get(key)}
    return PollCursor.model_validate({**data, **times})
