"""The loop-prevention marker: written at the end of looprelay's comments, read back, and
detected in any version (the predecessor's included)."""

from __future__ import annotations

import time

import pytest

from looprelay.core.markers import LEGACY_MARKER, Marker, is_marked, mark, read_marker

OURS = "<!-- looprelay:v1 kind=checklist id=d-1 -->"


class TestMarker:
    def test_mark_appends_the_hidden_marker(self) -> None:
        assert mark("Done.\n", kind="checklist", id="d-1") == f"Done.\n\n{OURS}"

    def test_mark_is_idempotent(self) -> None:
        once = mark("Done.", kind="checklist", id="d-1")
        assert mark(once, kind="checklist", id="d-1") == once

    def test_an_empty_body_is_just_the_marker(self) -> None:
        assert mark("  ", kind="checklist", id="d-1") == OURS

    @pytest.mark.parametrize(
        ("kind", "ident"),
        [
            ("", "d-1"),
            ("checklist", ""),
            ("check list", "d-1"),
            ("checklist", "a-->b"),
            ("-lead", "d-1"),
            ("checklist", "x" * 129),
            ("ch\u00e9cklist", "d-1"),
            ("checklist", "d-1\n"),
        ],
    )
    def test_a_kind_or_id_that_would_break_the_comment_raises(self, kind: str, ident: str) -> None:
        with pytest.raises(ValueError, match="must be 1-128 letters"):
            mark("x", kind=kind, id=ident)

    def test_read_marker_reads_back_kind_and_id(self) -> None:
        body = mark("hi", kind="attach", id="dispatch:0f3a.9")
        assert read_marker(body) == Marker(kind="attach", id="dispatch:0f3a.9")

    def test_read_marker_takes_the_last_marker(self) -> None:
        body = f"{OURS}\nquoted\n" + mark("reply", kind="confirmation", id="d-2")
        assert read_marker(body) == Marker(kind="confirmation", id="d-2")

    @pytest.mark.parametrize("body", ["", "plain", "<!-- looprelay:v1 kind=x -->", LEGACY_MARKER])
    def test_read_marker_finds_nothing_without_a_well_formed_marker(self, body: str) -> None:
        assert read_marker(body) is None

    @pytest.mark.parametrize(
        ("body", "expected"),
        [
            (OURS, True),
            (f"text\n{OURS}", True),
            ("<!--looprelay:v2 kind=y-->", True),
            ("<!-- LOOPRELAY:v1 whatever -->", True),
            (LEGACY_MARKER, True),
            ("looprelay:v1 kind=checklist id=d-1", False),
            ("<!-- an ordinary comment -->", False),
            ("", False),
        ],
    )
    def test_is_marked_detects_any_version_and_the_predecessors(
        self, body: str, expected: bool
    ) -> None:
        assert is_marked(body) is expected

    def test_detection_on_a_200000_character_body_is_fast(self) -> None:
        body = "<!-- " * 40_000
        started = time.perf_counter()
        assert not is_marked(body)
        assert read_marker(body) is None
        assert time.perf_counter() - started < 1.0
