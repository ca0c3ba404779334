"""What every Firestore adapter shares: the client, error translation, timestamps, conditional
updates."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as gexc
from google.auth.exceptions import DefaultCredentialsError
from google.cloud import firestore

if TYPE_CHECKING:
    from looprelay.config.model import FirestoreConfig

log = logging.getLogger("looprelay.firestore")

MAX_CAS_ROUNDS = 25
"""Read-then-conditional-update rounds on one document before contention is Transient."""

TRANSIENT_ERRORS = (
    gexc.ServiceUnavailable,
    gexc.DeadlineExceeded,
    gexc.Aborted,
    gexc.ResourceExhausted,
    gexc.InternalServerError,
    gexc.RetryError,
)


@contextmanager
def translated(action: str) -> Iterator[None]:
    """Turn Firestore's retryable errors into ``Transient`` naming ``action``.

    ``FailedPrecondition`` outside a conditional write (which catches its own) means a query
    needs a composite index that is missing or still building: retryable, since a building
    index comes up by itself, and logged as an error with Firestore's own message, which names
    the index (a console link to create it).
    """
    from looprelay.errors import Transient

    try:
        yield
    except TRANSIENT_ERRORS as exc:
        raise Transient(
            f"Firestore could not {action} (unavailable or contended); retry later: {exc}"
        ) from exc
    except gexc.FailedPrecondition as exc:
        log.error(
            "Firestore could not %s: the query needs a composite index that is missing or "
            "still building; declare it in infra/firestore.tf and apply: %s",
            action,
            exc.message,
        )
        raise Transient(
            f"Firestore could not {action}: a composite index it needs is missing or still "
            f"building; retry later ({exc.message})"
        ) from exc


def open_client(cfg: FirestoreConfig) -> firestore.Client:
    """Open the database the ``store.firestore`` section names.

    Raises ``ConfigError`` when no Google credentials or project can be found.
    """
    from looprelay.errors import ConfigError

    try:
        return firestore.Client(project=cfg.project, database=cfg.database)
    except (DefaultCredentialsError, OSError) as exc:
        raise ConfigError(
            f"store.firestore: cannot open Firestore ({exc}); set store.firestore.project and"
            " credentials (GOOGLE_APPLICATION_CREDENTIALS), or FIRESTORE_EMULATOR_HOST"
        ) from exc


def utc(value: datetime) -> datetime:
    """Return a plain UTC datetime (the client returns ``DatetimeWithNanoseconds``)."""
    return datetime.combine(value.date(), value.timetz()).astimezone(UTC)


def conditional_update(
    client: firestore.Client,
    ref: firestore.DocumentReference,
    change: Callable[[dict[str, Any]], dict[str, Any] | None],
    *,
    action: str,
    also: tuple[firestore.DocumentReference, dict[str, Any]] | None = None,
) -> bool:
    """Apply ``change`` to the document with a last-update-time precondition, re-reading on
    conflict; ``change`` returns the fields to set, or None to leave the document alone.
    With ``also``, those fields are merged into that document in the same atomic write.

    Returns False when the document is missing or ``change`` declined. Raises ``Transient``
    after ``MAX_CAS_ROUNDS`` conflicting rounds or when Firestore is unavailable.
    """
    from looprelay.errors import Transient

    with translated(action):
        for _ in range(MAX_CAS_ROUNDS):
            snapshot = ref.get()
            if not snapshot.exists:
                return False
            fields = change(snapshot.to_dict() or {})
            if fields is None:
                return False
            option = client.write_option(last_update_time=snapshot.update_time)
            try:
                if also is None:
                    ref.update(fields, option=option)
                else:
                    batch = client.batch()
                    batch.update(ref, fields, option=option)
                    batch.set(*also, merge=True)
                    batch.commit()
            except (gexc.FailedPrecondition, gexc.NotFound):
                continue
            return True
    raise Transient(f"Firestore could not {action}: the document stayed contended")


REFS_PER_BATCH = 100
"""Documents asked for in one batch get."""


def get_documents(
    client: firestore.Client, refs: Sequence[firestore.DocumentReference], *, action: str
) -> dict[str, dict[str, Any]]:
    """The documents of ``refs`` that exist, by path: one batch get per ``REFS_PER_BATCH``
    of them (none for none); ``Transient`` (via ``translated``) when the store fails."""
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(refs), REFS_PER_BATCH):
        with translated(action):
            snapshots = list(client.get_all(list(refs[start : start + REFS_PER_BATCH])))
        for snapshot in snapshots:
            data = snapshot.to_dict() if snapshot.exists else None
            if data is not None:
                found[snapshot.reference.path] = data
    return found
