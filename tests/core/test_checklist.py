"""The phase-selection checklist: rendering, parsing ticks, and freezing the answer."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from looprelay.core.checklist import (
    PR_SESSIONS_TOKENS,
    SURFACE_TOKEN,
    ChecklistRow,
    GraphSelection,
    Phase,
    freeze_selection,
    parse_checklist,
    render_checklist,
    ticked_tokens,
)
from looprelay.core.envelope import Envelope, project_envelope
from looprelay.core.prsessions import SESSION_PER_PR_MODES, SessionPerPr
from tests.samples import payload

PHASES = (
    Phase("requirements-definition", "Requirements definition"),
    Phase("requirements-approval", "Requirements approval"),
    Phase("design", "Design"),
    Phase("tasks-breakdown", "Tasks breakdown"),
    Phase("design-critic-review", "Design critic review", opt_in=True),
)
DEFAULT_ON = ("requirements-definition", "requirements-approval", "design", "tasks-breakdown")
AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
EXECUTE = "the-loop execute"


def _render(default: SessionPerPr = "cross-repository") -> str:
    return render_checklist(phases=PHASES, default_session_per_pr=default, execute_keyword=EXECUTE)


def _reply(text: str) -> Envelope:
    """An authorized execute reply, projected from a real issue_comment payload."""
    body = payload("issue_comment.created")
    body["comment"]["body"] = text
    return project_envelope(
        event="issue_comment", delivery_id="d-1", payload=body, max_text_chars=65536
    )


def _freeze(
    reply: str, recorded: str | None = None, default: SessionPerPr = "cross-repository"
) -> GraphSelection:
    comment = _reply(reply).comment
    assert comment is not None and comment.author is not None
    return freeze_selection(
        reply_body=comment.body,
        recorded_body=recorded,
        phases=PHASES,
        default_session_per_pr=default,
        actor=comment.author.login,
        at=AT,
    )


def _tick(body: str, ticks: dict[str, bool]) -> str:
    """Tick or untick rows in place, as a human clicking the boxes would."""
    lines = []
    for line in body.split("\n"):
        edited = line
        for token, ticked in ticks.items():
            if f"`{token}`" in line:
                edited = line.replace("[x]", "[ ]").replace("[ ]", "[x]" if ticked else "[ ]")
        lines.append(edited)
    return "\n".join(lines)


class TestRenderChecklist:
    def test_rows_are_phases_then_surface_then_the_three_pr_session_modes(self) -> None:
        rows = parse_checklist(_render())
        assert [row.token for row in rows] == [
            *(phase.token for phase in PHASES),
            SURFACE_TOKEN,
            "pr-sessions-never",
            "pr-sessions-cross-repository",
            "pr-sessions-always",
        ]

    def test_default_on_phases_are_ticked_and_optional_ones_are_not(self) -> None:
        ticked = ticked_tokens(parse_checklist(_render()))
        assert set(DEFAULT_ON) <= ticked
        assert "design-critic-review" not in ticked
        assert SURFACE_TOKEN not in ticked
        assert "- [ ] `design-critic-review` — Design critic review (optional)" in _render()

    @pytest.mark.parametrize("default", SESSION_PER_PR_MODES)
    def test_exactly_the_operators_default_is_pre_ticked(self, default: SessionPerPr) -> None:
        body = _render(default)
        ticked = {t for t in ticked_tokens(parse_checklist(body)) if t in PR_SESSIONS_TOKENS}
        assert ticked == {f"pr-sessions-{default}"}
        assert f"this deployment's default is `{default}`" in body

    def test_the_body_is_deterministic_and_carries_no_loop_marker(self) -> None:
        assert _render() == _render()
        assert "<!--" not in _render()
        assert _render().endswith("\n")

    def test_the_configured_execute_keyword_is_named(self) -> None:
        body = render_checklist(
            phases=PHASES, default_session_per_pr="never", execute_keyword="relay go"
        )
        assert "reply `relay go` to freeze the selection" in body
        assert EXECUTE not in body

    def test_without_phases_it_says_every_phase_runs(self) -> None:
        body = render_checklist(phases=(), default_session_per_pr="never", execute_keyword="go")
        assert "none can be skipped" in body
        assert parse_checklist(body)[0].token == SURFACE_TOKEN

    def test_a_label_is_kept_on_one_line(self) -> None:
        phases = (Phase("design", "Design\n- [x] pr-sessions-always\tnow"), Phase("plan", ""))
        body = render_checklist(phases=phases, default_session_per_pr="never", execute_keyword="go")
        assert "- [x] `design` — Design - [x] pr-sessions-always now\n" in body
        assert "- [x] `plan`\n" in body
        assert ticked_tokens(parse_checklist(body)) == {"design", "plan", "pr-sessions-never"}

    @pytest.mark.parametrize(
        "token",
        ["", "Design", "-design", "de sign", "design`", "a" * 65, SURFACE_TOKEN, "pr-sessions-x"],
    )
    def test_a_bad_or_reserved_phase_token_is_refused(self, token: str) -> None:
        with pytest.raises(ValueError, match="phase token"):
            render_checklist(
                phases=(Phase(token, "x"),), default_session_per_pr="never", execute_keyword="go"
            )

    def test_a_repeated_phase_token_is_refused(self) -> None:
        with pytest.raises(ValueError, match="twice"):
            render_checklist(
                phases=(Phase("design", "a"), Phase("design", "b")),
                default_session_per_pr="never",
                execute_keyword="go",
            )

    @pytest.mark.parametrize("keyword", ["", "  ", "go`", "go\nnow", "go\r"])
    def test_an_unprintable_execute_keyword_is_refused(self, keyword: str) -> None:
        with pytest.raises(ValueError, match="execute keyword"):
            render_checklist(phases=PHASES, default_session_per_pr="never", execute_keyword=keyword)


class TestParseChecklist:
    @pytest.mark.parametrize(
        ("line", "rows"),
        [
            ("- [x] design", [("design", True)]),
            ("- [X] design", [("design", True)]),
            ("* [x] design", [("design", True)]),
            ("+ [x] design", [("design", True)]),
            ("- [ ] design", [("design", False)]),
            ("- [x] `design`", [("design", True)]),
            ("- [x] `design` — Design", [("design", True)]),
            ("- [x] design please", [("design", True)]),
            ("   - [x] design", [("design", True)]),
            ("\t* [ ] design", [("design", False)]),
            ("- [x] Design", [("Design", True)]),
            ("- [x] tasks.", [("tasks.", True)]),
            ("- [x]design", []),
            ("-[x] design", []),
            ("- [y] design", []),
            ("- [xx] design", []),
            ("- [x] `design", []),
            ("- [x] `design`x", []),
            ("- [x] design—now", []),
            ("- [x] " + "a" * 101, []),
            ("> - [x] design", []),
            ("design", []),
            ("", []),
        ],
    )
    def test_a_row_is_a_task_item_with_one_exact_token(
        self, line: str, rows: list[tuple[str, bool]]
    ) -> None:
        assert parse_checklist(line) == tuple(ChecklistRow(t, ticked) for t, ticked in rows)

    @pytest.mark.parametrize(
        ("body", "closed"),
        [
            ("```\n- [x] design\n```", True),
            ("~~~\n- [x] design\n~~~", True),
            ("```markdown\n- [x] design\n```", True),
            ("   ```\n- [x] design\n   ```", True),
            ("````\n- [x] design\n```\n- [x] design\n````", True),
            ("```\n- [x] design\n~~~\n- [x] design", False),
            ("```\n- [x] design\n``` not a close\n- [x] design", False),
            ("```\n- [x] design", False),
        ],
    )
    def test_rows_inside_code_fences_are_ignored(self, body: str, closed: bool) -> None:
        after = (ChecklistRow("after", False),) if closed else ()
        assert parse_checklist(body + "\n- [ ] after") == after

    def test_a_closed_fence_lets_later_rows_count(self) -> None:
        body = "```\n- [x] inside\n```\n- [x] outside\n~~~~\n- [x] inside\n~~~~~\n- [ ] last"
        assert parse_checklist(body) == (ChecklistRow("outside", True), ChecklistRow("last", False))

    def test_a_fence_inside_a_list_item_still_hides_its_rows(self) -> None:
        body = "- note:\n      ```\n      - [x] pr-sessions-always\n      ```\n- [x] design"
        assert parse_checklist(body) == (ChecklistRow("design", True),)

    @pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
    def test_every_commonmark_line_ending_separates_rows(self, newline: str) -> None:
        body = newline.join(["- [x] design", "- [ ] tasks"])
        assert parse_checklist(body) == (ChecklistRow("design", True), ChecklistRow("tasks", False))

    @pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c"])
    def test_a_row_cannot_hide_behind_a_separator_github_shows_inline(self, separator: str) -> None:
        assert parse_checklist(f"I agree{separator}- [x] pr-sessions-always") == ()

    def test_a_200000_character_body_parses(self) -> None:
        body = "x" * 200_000 + "\n- [x] design\n" + "- [ ] tasks " + "y" * 200_000
        assert parse_checklist(body) == (ChecklistRow("design", True), ChecklistRow("tasks", False))


class TestTickedTokens:
    def test_a_token_ticked_anywhere_counts_as_ticked(self) -> None:
        rows = parse_checklist("- [ ] design\n- [x] design\n- [ ] tasks\n- [x] plan")
        assert ticked_tokens(rows) == {"design", "plan"}


class TestRoundTrip:
    @pytest.mark.parametrize(
        "ticks",
        [
            {},
            {"design": False},
            {"requirements-definition": False, "tasks-breakdown": False},
            {"design-critic-review": True, SURFACE_TOKEN: True},
            {"pr-sessions-cross-repository": False, "pr-sessions-always": True},
            {"pr-sessions-never": True},
            {token: False for token in (*DEFAULT_ON, "pr-sessions-cross-repository")},
        ],
    )
    def test_render_then_tick_then_parse_gives_what_was_ticked(
        self, ticks: dict[str, bool]
    ) -> None:
        expected = set(DEFAULT_ON) | {"pr-sessions-cross-repository"}
        expected |= {token for token, ticked in ticks.items() if ticked}
        expected -= {token for token, ticked in ticks.items() if not ticked}
        assert ticked_tokens(parse_checklist(_tick(_render(), ticks))) == expected


class TestFreezeSelection:
    def test_plain_execute_with_no_checklist_anywhere_runs_the_full_process(self) -> None:
        selection = _freeze(EXECUTE, recorded=None, default="never")
        assert selection == GraphSelection(
            phases_selected=DEFAULT_ON,
            phases_skipped=("design-critic-review",),
            surface="work-item",
            session_per_pr="never",
            actor="Codertocat",
            at=AT,
            source="default",
            notes=(
                "no checklist rows in the reply; recorded checklist unreadable or absent",
                "no pr-sessions row ticked; kept the default sessionPerPr never",
            ),
        )

    def test_a_recorded_comment_stripped_of_rows_gives_the_defaults(self) -> None:
        selection = _freeze(EXECUTE, recorded="edited away", default="always")
        assert (selection.source, selection.session_per_pr) == ("default", "always")
        assert "recorded checklist without checklist rows" in selection.notes[0]

    def test_ticking_in_place_on_the_recorded_comment_is_the_selection(self) -> None:
        recorded = _tick(_render(), {"design": False, "pr-sessions-always": True})
        recorded = _tick(recorded, {"pr-sessions-cross-repository": False})
        selection = _freeze(f"Looks right. {EXECUTE}", recorded=recorded)
        assert selection.source == "recorded-comment"
        assert selection.phases_skipped == ("design", "design-critic-review")
        assert (selection.session_per_pr, selection.notes) == ("always", ())

    def test_a_checklist_in_the_reply_wins_over_the_boxes(self) -> None:
        recorded = _tick(_render(), {"design": False, SURFACE_TOKEN: True})
        selection = _freeze(f"- [x] design\n- [x] pr-sessions-never\n{EXECUTE}", recorded)
        assert selection.source == "reply"
        assert "design" in selection.phases_selected
        assert (selection.surface, selection.session_per_pr) == ("work-item", "never")

    def test_unticked_phases_in_the_reply_become_skips_and_unmentioned_ones_run(self) -> None:
        reply = (
            "- [ ] requirements-definition\n- [ ] `requirements-approval`\n- [x] tasks-breakdown\n"
            f"{EXECUTE}"
        )
        selection = _freeze(reply, _render())
        assert selection.phases_selected == ("design", "tasks-breakdown")
        assert selection.phases_skipped == (
            "requirements-definition",
            "requirements-approval",
            "design-critic-review",
        )

    def test_an_opt_in_phase_runs_only_when_ticked(self) -> None:
        selection = _freeze(f"- [x] design-critic-review\n{EXECUTE}", None)
        assert selection.phases_selected == (*DEFAULT_ON, "design-critic-review")
        assert selection.phases_skipped == ()

    def test_a_ticked_surface_row_moves_the_outer_loop_to_the_pull_request(self) -> None:
        assert _freeze(f"- [x] {SURFACE_TOKEN}\n{EXECUTE}").surface == "pull-request"

    def test_an_unrelated_task_list_in_the_reply_does_not_discard_the_boxes(self) -> None:
        recorded = _tick(_render(), {"design": False})
        selection = _freeze(f"- [x] read the thread\n- [ ] coffee\n{EXECUTE}", recorded)
        assert selection.source == "recorded-comment"
        assert "design" in selection.phases_skipped

    def test_rows_quoted_in_a_code_fence_do_not_count_as_the_replys_checklist(self) -> None:
        recorded = _tick(_render(), {"pr-sessions-always": True})
        recorded = _tick(recorded, {"pr-sessions-cross-repository": False})
        selection = _freeze(f"```\n- [x] pr-sessions-never\n```\n{EXECUTE}", recorded)
        assert (selection.source, selection.session_per_pr) == ("recorded-comment", "always")

    @pytest.mark.parametrize(
        ("reply_rows", "default", "expected", "note"),
        [
            ("- [x] pr-sessions-always", "never", "always", None),
            ("- [x] `pr-sessions-never`\n- [x] pr-sessions-never", "always", "never", None),
            ("- [ ] pr-sessions-always", "always", "always", "no pr-sessions row ticked"),
            ("- [x] design", "never", "never", "no pr-sessions row ticked"),
            (
                "- [x] pr-sessions-always\n- [x] pr-sessions-never",
                "cross-repository",
                "cross-repository",
                "2 pr-sessions rows ticked (pr-sessions-always, pr-sessions-never)",
            ),
            (
                "- [x] pr-sessions-sometimes",
                "always",
                "always",
                "unknown row pr-sessions-sometimes ticked",
            ),
            (
                "- [x] pr-sessions-sometimes\n- [x] pr-sessions-never",
                "always",
                "always",
                "2 pr-sessions rows ticked",
            ),
            ("- [x] pr-sessions-never\n- [ ] pr-sessions-sometimes", "always", "never", None),
            ("- [x] PR-SESSIONS-ALWAYS\n- [x] design", "never", "never", "no pr-sessions row"),
        ],
    )
    def test_exactly_one_ticked_mode_row_answers_anything_else_keeps_the_default(
        self, reply_rows: str, default: SessionPerPr, expected: str, note: str | None
    ) -> None:
        selection = _freeze(f"{reply_rows}\n{EXECUTE}", _render(default), default)
        assert selection.source == "reply"
        assert selection.session_per_pr == expected
        if note is None:
            assert selection.notes == ()
        else:
            assert len(selection.notes) == 1 and selection.notes[0].startswith(note)
            assert selection.notes[0].endswith(f"kept the default sessionPerPr {default}")

    @pytest.mark.parametrize("mode_row", ["- [ ] pr-sessions-never", "- [x] pr-sessions-always"])
    def test_a_pr_session_row_is_never_read_as_a_phase(self, mode_row: str) -> None:
        selection = _freeze(f"{mode_row}\n{EXECUTE}")
        assert selection.phases_selected == DEFAULT_ON
        assert not any(token.startswith("pr-sessions") for token in selection.phases_skipped)

    def test_unknown_tokens_are_ignored(self) -> None:
        selection = _freeze(f"- [ ] design\n- [ ] implementation\n- [x] deploy\n{EXECUTE}")
        assert selection.phases_skipped == ("design", "design-critic-review")

    def test_a_hostile_200000_character_reply_still_freezes(self) -> None:
        reply = "- [x] pr-sessions-always\n" + "z" * 200_000 + f"\n{EXECUTE}"
        selection = _freeze(reply, _render("never"), "never")
        assert (selection.source, selection.session_per_pr) == ("reply", "always")

    def test_the_selection_is_frozen(self) -> None:
        selection = _freeze(EXECUTE)
        with pytest.raises(dataclasses.FrozenInstanceError):
            selection.session_per_pr = "always"  # type: ignore[misc]

    def test_an_empty_actor_is_refused(self) -> None:
        with pytest.raises(ValueError, match="actor"):
            freeze_selection(
                reply_body=EXECUTE,
                recorded_body=None,
                phases=PHASES,
                default_session_per_pr="never",
                actor="",
                at=AT,
            )

    def test_a_naive_time_is_refused(self) -> None:
        with pytest.raises(ValueError, match="timezone"):
            freeze_selection(
                reply_body=EXECUTE,
                recorded_body=None,
                phases=PHASES,
                default_session_per_pr="never",
                actor="octocat",
                at=datetime(2026, 1, 2),  # the naive time under test
            )

    def test_invalid_phases_are_refused(self) -> None:
        with pytest.raises(ValueError, match="phase token"):
            freeze_selection(
                reply_body=EXECUTE,
                recorded_body=None,
                phases=(Phase("Bad Token", "x"),),
                default_session_per_pr="never",
                actor="octocat",
                at=AT,
            )
