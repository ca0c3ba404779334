"""The PollCursors contract: every adapter (SQLite, Firestore) must pass the same cases. A
cursor is where one listing of one polled repository stands, so a restarted poller neither
misses what happened while it was down nor routes again what it routed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from looprelay.adapters.sqlite.poll_cursors import SqlitePollCursors
from looprelay.core.poll import ISSUE_COMMENTS, ISSUES, PollCursor, new_cursor
from looprelay.ports import PollCursors

T0 = datetime(2026, 12, 2, 9, 0, 0, 123456, tzinfo=UTC)


def _polled(cursor: PollCursor) -> PollCursor:
    return cursor.model_copy(
        update={
            "since": T0 + timedelta(minutes=5),
            "etag": 'W/"abc"',
            "etag_url": "https://api.github.com/repos/octo/widgets/issues/comments?since=x",
            "polled_at": T0 + timedelta(minutes=6),
            "failed_at": T0 + timedelta(minutes=1),
            "error": "GitHub GET /repos/octo/widgets/issues: HTTP 502",
            "retry_at": T0 + timedelta(minutes=7),
        }
    )


class TestPollCursors:
    def test_an_unknown_cursor_is_none(self, poll_cursors: PollCursors) -> None:
        assert poll_cursors.get_poll_cursor("octo/widgets", ISSUES) is None
        assert poll_cursors.list_poll_cursors() == []

    def test_a_saved_cursor_reads_back_whole(self, poll_cursors: PollCursors) -> None:
        cursor = _polled(new_cursor("octo/widgets", ISSUE_COMMENTS, now=T0))
        poll_cursors.save_poll_cursor(cursor)

        assert poll_cursors.get_poll_cursor("octo/widgets", ISSUE_COMMENTS) == cursor

    def test_a_later_save_replaces_the_earlier(self, poll_cursors: PollCursors) -> None:
        first = new_cursor("octo/widgets", ISSUES, now=T0)
        poll_cursors.save_poll_cursor(first)
        later = _polled(first)
        poll_cursors.save_poll_cursor(later)

        assert poll_cursors.get_poll_cursor("octo/widgets", ISSUES) == later
        assert poll_cursors.list_poll_cursors() == [later]

    def test_each_repository_and_listing_has_its_own(self, poll_cursors: PollCursors) -> None:
        cursors = [
            new_cursor("octo/widgets", ISSUES, now=T0),
            new_cursor("octo/widgets", ISSUE_COMMENTS, now=T0 + timedelta(seconds=1)),
            new_cursor("octo/gadgets", ISSUES, now=T0 + timedelta(seconds=2)),
        ]
        for cursor in cursors:
            poll_cursors.save_poll_cursor(cursor)

        assert poll_cursors.list_poll_cursors() == sorted(
            cursors, key=lambda c: (c.repository, c.listing)
        )
        assert poll_cursors.get_poll_cursor("octo/gadgets", ISSUE_COMMENTS) is None

    def test_a_repository_is_found_in_any_case(self, poll_cursors: PollCursors) -> None:
        cursor = new_cursor("Octo/Widgets", ISSUES, now=T0)
        poll_cursors.save_poll_cursor(cursor)

        assert cursor.repository == "octo/widgets"
        assert poll_cursors.get_poll_cursor("OCTO/widgets", ISSUES) == cursor


def test_sqlite_keeps_a_cursor_across_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "looprelay.db"
    first = SqlitePollCursors(path)
    cursor = _polled(new_cursor("octo/widgets", ISSUES, now=T0))
    first.save_poll_cursor(cursor)
    first.close()

    reopened = SqlitePollCursors(path)
    try:
        assert reopened.get_poll_cursor("octo/widgets", ISSUES) == cursor
    finally:
        reopened.close()
