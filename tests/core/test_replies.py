"""What a headless turn leaves on GitHub: the answer cut to fit, or a short failure note."""

from __future__ import annotations

import pytest

from looprelay.core.markers import mark
from looprelay.core.replies import (
    GITHUB_MAX_COMMENT_CHARS,
    MAX_FAILURE_NOTE_CHARS,
    MAX_REPLY_CHARS,
    REPLY_MARKER_KIND,
    cut_to,
    failure_note,
    reply_body,
)

LONGEST_ID = "d" * 128


class TestCutTo:
    def test_text_within_the_limit_is_untouched(self) -> None:
        assert cut_to("short", 64) == "short"
        assert cut_to("x" * 64, 64) == "x" * 64

    @pytest.mark.parametrize(
        ("size", "limit"),
        [(65, 64), (1_001, 1_000), (99_999, 1_000), (100_000, 1_000), (1_000_000, 1_000)],
    )
    def test_longer_text_is_cut_and_says_how_much(self, size: int, limit: int) -> None:
        cut = cut_to("x" * size, limit)
        kept = cut.split("\n\n… (cut: ")[0]
        assert len(cut) <= limit and kept
        assert cut.endswith(f"\n\n… (cut: {size - len(kept)} more characters)")

    def test_a_too_small_limit_is_refused(self) -> None:
        with pytest.raises(ValueError, match="at least 64"):
            cut_to("text", 10)


class TestReplyBody:
    def test_an_answer_is_trimmed_and_a_blank_one_is_nothing(self) -> None:
        assert reply_body("\n  Fixed it.\n\n") == "Fixed it."
        assert reply_body(" \n\t") == ""

    def test_the_longest_reply_a_runner_may_send_fits_uncut(self) -> None:
        text = "y" * MAX_REPLY_CHARS
        assert reply_body(text) == text

    def test_any_answer_with_our_longest_marker_fits_in_one_comment(self) -> None:
        for text in ("🙂" * GITHUB_MAX_COMMENT_CHARS, "z" * 10 * GITHUB_MAX_COMMENT_CHARS):
            body = mark(reply_body(text), kind=REPLY_MARKER_KIND, id=LONGEST_ID)
            assert len(body) <= GITHUB_MAX_COMMENT_CHARS
            assert "more characters)\n\n<!-- looprelay:v1 kind=reply" in body


class TestFailureNote:
    def test_the_harness_message_goes_in_a_code_span(self) -> None:
        assert failure_note("claude", "Not logged in · Please run /login") == (
            "😕 claude turn failed: `Not logged in · Please run /login`"
        )

    def test_mentions_markdown_and_newlines_stay_inert(self) -> None:
        note = failure_note("cursor-agent", "ask @octocat\n`rm -rf` **now**")
        assert note == "😕 cursor-agent turn failed: `ask @octocat 'rm -rf' **now**`"

    def test_a_long_message_is_cut_to_the_note_limit(self) -> None:
        note = failure_note("claude", "e" * 5_000)
        assert len(note) == MAX_FAILURE_NOTE_CHARS and note.endswith("…`")

    def test_no_message_leaves_the_plain_note(self) -> None:
        assert failure_note("claude", " ") == "😕 claude turn failed"
