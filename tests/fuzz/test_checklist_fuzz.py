"""Property-based tests of the phase-selection checklist: render, tick, parse, freeze.

Whatever phases and labels the operator configures, the rendered checklist parses back to its
own rows, ticking boxes in place is read exactly, arbitrary Markdown never raises, and only
rows looprelay can trust answer: the reply's own rows, else looprelay's recorded comment.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from hypothesis import assume, given
from hypothesis import strategies as st

from looprelay.core.checklist import (
    PR_SESSIONS_PREFIX,
    PR_SESSIONS_TOKENS,
    SURFACE_TOKEN,
    ChecklistRow,
    Phase,
    freeze_selection,
    parse_checklist,
    render_checklist,
    ticked_tokens,
)
from looprelay.core.markers import mark
from looprelay.core.prsessions import SESSION_PER_PR_MODES, SessionPerPr
from tests.fuzz.budget import examples
from tests.fuzz.strategies import hostile_text

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")

PHASE_TOKENS = st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True).filter(
    lambda token: token != SURFACE_TOKEN and not token.startswith(PR_SESSIONS_PREFIX)
)
PHASES = st.lists(
    st.builds(Phase, PHASE_TOKENS, hostile_text(max_size=60), st.booleans()),
    max_size=8,
    unique_by=lambda phase: phase.token,
)
MODES = st.sampled_from(SESSION_PER_PR_MODES)
EXECUTE_KEYWORDS = st.one_of(
    st.just("the-loop execute"),
    hostile_text(max_size=30).filter(
        lambda k: k.strip() != "" and not any(c in k for c in "`\r\n")
    ),
)


def _render(phases: list[Phase], default: SessionPerPr, keyword: str) -> str:
    return render_checklist(phases=phases, default_session_per_pr=default, execute_keyword=keyword)


def _tick(body: str, ticks: dict[str, bool]) -> str:
    """Click boxes in place, as a person on GitHub would."""
    lines = []
    for line in body.split("\n"):
        edited = line
        for token, ticked in ticks.items():
            if re.match(rf"- \[[ x]\] `{re.escape(token)}`", line):
                edited = ("- [x] " if ticked else "- [ ] ") + line[len("- [ ] ") :]
        lines.append(edited)
    return "\n".join(lines)


def _rendered_rows(phases: list[Phase], default: SessionPerPr) -> list[ChecklistRow]:
    return [
        *(ChecklistRow(phase.token, not phase.opt_in) for phase in phases),
        ChecklistRow(SURFACE_TOKEN, False),
        *(
            ChecklistRow(PR_SESSIONS_PREFIX + mode, mode == default)
            for mode in SESSION_PER_PR_MODES
        ),
    ]


class TestRoundTrip:
    @examples(1.5)
    @given(phases=PHASES, default=MODES, keyword=EXECUTE_KEYWORDS, data=st.data())
    def test_render_then_tick_then_parse_reads_exactly_the_boxes(
        self, phases: list[Phase], default: SessionPerPr, keyword: str, data: st.DataObject
    ) -> None:
        body = _render(phases, default, keyword)
        rows = _rendered_rows(phases, default)
        assert list(parse_checklist(body)) == rows
        marked = mark(body, kind="checklist", id="d-1")
        ticks = data.draw(st.dictionaries(st.sampled_from([r.token for r in rows]), st.booleans()))
        expected = [ChecklistRow(r.token, ticks.get(r.token, r.ticked)) for r in rows]
        assert list(parse_checklist(_tick(marked, ticks))) == expected


class TestParse:
    @examples(2)
    @given(body=hostile_text(max_size=3_000))
    def test_any_markdown_parses_to_well_formed_rows_without_raising(self, body: str) -> None:
        rows = parse_checklist(body)
        assert all(_TOKEN.fullmatch(row.token) for row in rows)
        assert ticked_tokens(rows) <= {row.token for row in rows}

    @examples(1)
    @given(
        before=hostile_text(max_size=200),
        fence=st.sampled_from(["```", "~~~", "````", "  ```python", "\t~~~~ x"]),
        token=PHASE_TOKENS,
    )
    def test_a_row_inside_a_fence_never_counts(self, before: str, fence: str, token: str) -> None:
        row = f"- [x] `{token}`\n"
        assume(not any(r.token == token for r in parse_checklist(before)))
        # Only where the text before leaves no fence open, so the row would count bare.
        assume(any(r.token == token for r in parse_checklist(f"{before}\n{row}")))
        assert all(r.token != token for r in parse_checklist(f"{before}\n{fence}\n{row}"))


UNTRUSTED_NOISE = st.lists(
    st.one_of(
        hostile_text(max_size=120),
        st.sampled_from(
            [
                "<!-- looprelay:v1 kind=checklist id=d-1 -->",
                "> - [x] `pr-sessions-always`",
                "```\n- [ ] `design`\n- [x] `pr-sessions-never`\n```",
                "- [x] buy-milk",
                "- [x]`pr-sessions-always`",
                "- [x] `pr-sessions-always`x",
                "the-loop execute",
            ]
        ),
    ),
    max_size=6,
).map("\n".join)


class TestFreeze:
    @examples(1.5)
    @given(
        phases=PHASES,
        default=MODES,
        reply=UNTRUSTED_NOISE,
        data=st.data(),
    )
    def test_a_reply_without_rows_of_its_own_leaves_the_recorded_comment_as_the_answer(
        self, phases: list[Phase], default: SessionPerPr, reply: str, data: st.DataObject
    ) -> None:
        known = {p.token for p in phases} | {SURFACE_TOKEN}
        assume(
            not any(
                r.token in known or r.token.startswith(PR_SESSIONS_PREFIX)
                for r in parse_checklist(reply)
            )
        )
        recorded = mark(_render(phases, default, "the-loop execute"), kind="checklist", id="d-1")
        tokens = [r.token for r in _rendered_rows(phases, default)]
        recorded = _tick(
            recorded, data.draw(st.dictionaries(st.sampled_from(tokens), st.booleans()))
        )

        def freeze(reply_body: str) -> tuple[object, ...]:
            selection = freeze_selection(
                reply_body=reply_body,
                recorded_body=recorded,
                phases=phases,
                default_session_per_pr=default,
                actor="octocat",
                at=AT,
            )
            return (
                selection.source,
                selection.phases_selected,
                selection.phases_skipped,
                selection.surface,
                selection.session_per_pr,
            )

        answer = freeze(reply)
        assert answer == freeze("")
        assert answer[0] == "recorded-comment"

    @examples(1.5)
    @given(phases=PHASES, default=MODES, reply=hostile_text(max_size=800), recorded=st.data())
    def test_any_reply_freezes_a_consistent_selection(
        self, phases: list[Phase], default: SessionPerPr, reply: str, recorded: st.DataObject
    ) -> None:
        body = recorded.draw(st.one_of(st.none(), hostile_text(max_size=400)))
        selection = freeze_selection(
            reply_body=reply,
            recorded_body=body,
            phases=phases,
            default_session_per_pr=default,
            actor="octocat",
            at=AT,
        )
        tokens = [p.token for p in phases]
        assert sorted(selection.phases_selected + selection.phases_skipped) == sorted(tokens)
        assert [t for t in tokens if t in selection.phases_selected] == list(
            selection.phases_selected
        )
        assert selection.session_per_pr in PR_SESSIONS_TOKENS.values()
        if selection.source == "default":
            assert selection.session_per_pr == default
            assert selection.phases_selected == tuple(p.token for p in phases if not p.opt_in)
