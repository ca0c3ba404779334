"""The poll ingress's cursors in the embedded SQLite database: one JSON document per
repository and listing, behind ``PollCursors``."""

from __future__ import annotations

from pathlib import Path

from looprelay.adapters.sqlite.database import SqliteDatabase, open_database
from looprelay.core.poll import PollCursor

_SCHEMA = """
CREATE TABLE IF NOT EXISTS poll_cursors (
    repository TEXT NOT NULL,
    listing TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (repository, listing)
);
"""


class SqlitePollCursors:
    """The ``PollCursors`` port on SQLite."""

    def __init__(self, path: str | Path | SqliteDatabase) -> None:
        """Open (creating) the table in the database at ``path``; ``Transient`` on failure."""
        self._db = open_database(path, schema=_SCHEMA, what="SQLite poll cursors")

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def get_poll_cursor(self, repository: str, listing: str) -> PollCursor | None:
        """See ``PollCursors.get_poll_cursor``."""
        rows = self._db.rows(
            "SELECT doc FROM poll_cursors WHERE repository = ? AND listing = ?",
            (repository.lower(), listing),
        )
        return PollCursor.model_validate_json(rows[0]["doc"]) if rows else None

    def save_poll_cursor(self, cursor: PollCursor) -> None:
        """See ``PollCursors.save_poll_cursor``."""
        self._db.execute(
            "INSERT INTO poll_cursors (repository, listing, doc) VALUES (?,?,?)"
            " ON CONFLICT (repository, listing) DO UPDATE SET doc = excluded.doc",
            (cursor.repository.lower(), cursor.listing, cursor.model_dump_json()),
        )

    def list_poll_cursors(self) -> list[PollCursor]:
        """See ``PollCursors.list_poll_cursors``."""
        rows = self._db.rows("SELECT doc FROM poll_cursors ORDER BY repository, listing")
        return [PollCursor.model_validate_json(row["doc"]) for row in rows]
