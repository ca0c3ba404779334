"""The ``unsynced`` receiver of ``bench/ingress.py``: ``looprelay up`` whose enqueues commit
without fsync.

Not a mode looprelay offers (its ack would not survive a power cut): ``bench/ingress.py`` puts
this folder on ``PYTHONPATH`` of that one ``looprelay up``; Python imports ``sitecustomize`` at
start-up. Only the queue's connection changes (the only one that opens the embedded queue
fully synced), so the table shows what the durable ack itself costs next to the real one.
"""

from __future__ import annotations

from pathlib import Path

from looprelay.adapters.sqlite import database as sqlite_common

_open = sqlite_common.SqliteDatabase.__init__


def _open_unsynced(
    self: sqlite_common.SqliteDatabase,
    path: str | Path,
    *,
    schema: str,
    what: str,
    synchronous: sqlite_common.Synchronous = "FULL",
) -> None:
    _open(self, path, schema=schema, what=what, synchronous=synchronous)
    if what == "embedded queue" and synchronous == "FULL":
        self.execute("PRAGMA synchronous=OFF")
        # Unsynced writes switch a FULL connection to NORMAL and synced ones back; with both
        # said to be NORMAL already, this one stays OFF.
        self._synchronous = self._mode = "NORMAL"


sqlite_common.SqliteDatabase.__init__ = _open_unsynced  # type: ignore[method-assign]
