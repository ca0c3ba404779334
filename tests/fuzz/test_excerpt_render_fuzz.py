"""Property-based tests of the UNTRUSTED excerpt and of the prompts built around it.

Whatever text a payload carries, the excerpt keeps each free-text field within its cap and all
of them within the budget, stays printable-ASCII JSON in which no payload text starts a line or
holds a backtick, and so cannot close its fence or forge the end line. The prompt carries the
interaction directive unaltered, once, above the untrusted block.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from looprelay.config.templates import (
    CHECKLIST_COMMENT,
    CONFIRMATION_COMMENT,
    EVENT_PROMPT,
    SPAWN_PROMPT,
    bundled_template,
)
from looprelay.core.control import Keywords
from looprelay.core.envelope import Envelope, project_envelope
from looprelay.core.excerpt import (
    TEXT_BUDGET_CHARS,
    TEXT_MAX_CHARS,
    TRUNCATION_NOTE,
    UNTRUSTED_BEGIN,
    UNTRUSTED_END,
    render_excerpt,
    wrap_untrusted,
)
from looprelay.core.interaction import DIRECTIVES, ModeResolution
from looprelay.core.model import SessionRecord, WorkItemRecord
from looprelay.core.plan import Plan, RoutingPolicy, Templates
from looprelay.core.policy import AuthorizedUsers
from tests.fuzz.budget import examples
from tests.fuzz.strategies import github_payloads, hostile_text, long_text, set_path

BOUNDARIES = st.from_regex(r"[A-Za-z0-9]{16,64}", fullmatch=True)
_FIRST_CHAR_OF_A_LINE = re.compile(r"^ *[{}\[\]\"0-9-]")
REF = "github:codertocat/hello-world#1"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@st.composite
def envelopes(draw: st.DrawFn) -> tuple[Envelope, dict[str, Any]]:
    """An envelope projected from a payload whose free text is hostile, long, or both."""
    event, data = draw(github_payloads())
    for path in ("comment.body", "issue.title", "pull_request.title"):
        if draw(st.booleans()):
            set_path(
                data, path, draw(st.one_of(hostile_text(max_size=600), long_text(max_chars=9_000)))
            )
    data["action"] = draw(st.sampled_from(["created", "opened", "submitted", "labeled"]))
    envelope = project_envelope(
        event=event,
        delivery_id="72d3162e-cc78-11e3-81ab-4c9367dc0958",
        payload=data,
        max_text_chars=draw(st.sampled_from([256, 65_536])),
    )
    return envelope, data


def _sources(envelope: Envelope) -> dict[str, str]:
    texts = {
        "issue.title": envelope.issue.title if envelope.issue else None,
        "pull_request.title": envelope.pull_request.title if envelope.pull_request else None,
        "comment.body": envelope.comment.body if envelope.comment else None,
    }
    return {name: text for name, text in texts.items() if text is not None}


def _excerpt_texts(excerpt: dict[str, Any]) -> dict[str, str]:
    texts = {
        "issue.title": excerpt.get("issue", {}).get("title"),
        "pull_request.title": excerpt.get("pull_request", {}).get("title"),
        "comment.body": excerpt.get("comment", {}).get("body"),
    }
    return {name: text for name, text in texts.items() if text is not None}


class TestExcerpt:
    @examples(1.5)
    @given(projected=envelopes())
    def test_caps_hold_and_kept_text_is_a_prefix_of_the_original(
        self, projected: tuple[Envelope, dict[str, Any]]
    ) -> None:
        envelope, _ = projected
        excerpt = render_excerpt(envelope)
        decoded = json.loads(excerpt)
        sources, kept = _sources(envelope), _excerpt_texts(decoded)
        assert set(kept) == set(sources)
        total = 0
        for name, text in kept.items():
            cut = name in decoded.get("truncated", [])
            body = text.removesuffix(TRUNCATION_NOTE) if cut else text
            assert len(body) <= TEXT_MAX_CHARS
            assert sources[name].startswith(body)
            if len(body) < len(sources[name]) or name in envelope.truncated:
                assert cut and text.endswith(TRUNCATION_NOTE), name
            else:
                assert not cut and body == sources[name]
            total += len(body)
        assert total <= TEXT_BUDGET_CHARS

    @examples(1.5)
    @given(projected=envelopes(), boundary=BOUNDARIES)
    def test_payload_text_cannot_start_a_line_hold_a_backtick_or_forge_the_end(
        self, projected: tuple[Envelope, dict[str, Any]], boundary: str
    ) -> None:
        envelope, _ = projected
        excerpt = render_excerpt(envelope)
        assert excerpt.isascii() and "`" not in excerpt
        assert all(c == "\n" or " " <= c <= "~" for c in excerpt)
        for line in excerpt.split("\n"):
            assert _FIRST_CHAR_OF_A_LINE.match(line), line
        block = wrap_untrusted(excerpt, boundary=boundary)
        lines = block.split("\n")
        assert lines[:2] == [f"{UNTRUSTED_BEGIN} {boundary}", "```json"]
        assert lines[-3:] == ["```", f"{UNTRUSTED_END} {boundary}", ""]
        assert block.count("```") == 2
        assert block.count(boundary) == 2


def _policy(mode: str) -> RoutingPolicy:
    return RoutingPolicy(
        users=AuthorizedUsers.from_config(["octocat"]),
        bot_logins=frozenset(),
        keywords=Keywords.from_config(),
        auto_execute_label="looprelay:auto",
        require_start=False,
        session_per_pr="cross-repository",
        interaction=ModeResolution("cli" if mode == "cli" else "work-item"),
        harness="claude",
        runner_kind="tmux",
        phases=(),
    )


OPERATOR_TEMPLATES = st.sampled_from(
    [
        "{{ payload_excerpt }}",
        "Event {{ event }} on {{ work_item }}\n\n{{ payload_excerpt }}\n",
        "{# interaction_directive #}{{ graph_context }}{{ payload_excerpt }}",
    ]
)


class TestPrompt:
    @examples(1.5)
    @given(
        projected=envelopes(),
        boundary=BOUNDARIES,
        mode=st.sampled_from(["work-item", "cli"]),
        live=st.booleans(),
    )
    def test_the_directive_is_unaltered_once_and_above_the_intact_untrusted_block(
        self,
        projected: tuple[Envelope, dict[str, Any]],
        boundary: str,
        mode: str,
        live: bool,
    ) -> None:
        envelope, _ = projected
        templates = Templates(
            event_prompt=bundled_template(EVENT_PROMPT),
            spawn_prompt=bundled_template(SPAWN_PROMPT),
            checklist_comment=bundled_template(CHECKLIST_COMMENT),
            confirmation_comment=bundled_template(CONFIRMATION_COMMENT),
            boundary=boundary,
        )
        prompt = _prompt(envelope, templates, mode=mode, live=live)
        directive = DIRECTIVES["cli" if mode == "cli" else "work-item"]
        block = wrap_untrusted(render_excerpt(envelope), boundary=boundary)
        assert prompt.count(directive) == 1
        assert prompt.count(block) == 1
        assert prompt.index(directive) < prompt.index(block)
        assert prompt.count(f"{UNTRUSTED_BEGIN} {boundary}") == 1
        assert prompt.count(f"{UNTRUSTED_END} {boundary}") == 1
        headings = [line for line in prompt.split("\n") if line.startswith("## Interaction mode")]
        assert headings == [directive.split("\n", 1)[0]]

    @examples(0.8)
    @given(projected=envelopes(), boundary=BOUNDARIES, source=OPERATOR_TEMPLATES)
    def test_an_operator_template_without_the_directive_still_carries_it_unaltered_once(
        self, projected: tuple[Envelope, dict[str, Any]], boundary: str, source: str
    ) -> None:
        envelope, _ = projected
        templates = Templates(
            event_prompt=source,
            spawn_prompt=source,
            checklist_comment="",
            confirmation_comment="",
            boundary=boundary,
            sandboxed_event=True,
            sandboxed_spawn=True,
        )
        prompt = _prompt(envelope, templates, mode="work-item", live=True)
        block = wrap_untrusted(render_excerpt(envelope), boundary=boundary)
        assert prompt.count(DIRECTIVES["work-item"]) == 1
        assert prompt.count(block) == 1
        assert prompt.endswith(DIRECTIVES["work-item"])


def _prompt(envelope: Envelope, templates: Templates, *, mode: str, live: bool) -> str:
    sessions = {}
    if live:
        sessions[REF] = SessionRecord(
            endpoint=REF,
            session_name="loop-x",
            session_id="9b2c7c55-0c8e-4c47-8a39-5d0a2f3d1e77",
            harness="claude",
            runner_kind="tmux",
            interaction="work-item",
            status="live",
        )
    item = WorkItemRecord(
        ref=REF, repository="Codertocat/Hello-World", number=1, sessions=sessions, next_seq=1
    )
    plan = Plan(item, envelope, _policy(mode), templates, T0, "fuzz-seed")
    return plan.send(endpoint=REF).prompt
