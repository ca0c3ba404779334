"""Property-based tests of the control-keyword parser and the control state machine.

A keyword counts only where its author says it: as whole words, in any ASCII case, with any
spacing short of a blank line; never inside code, a quote, or glued to a word. Whatever the
body or the operator's keywords, reading never raises and never finds a keyword that is not
there.
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from looprelay.core.control import (
    Command,
    ControlState,
    Keywords,
    Signal,
    Verdict,
    apply_command,
    find_commands,
    read_command,
)
from looprelay.core.envelope import project_envelope
from looprelay.core.policy import Authorization
from tests.fuzz.budget import examples
from tests.fuzz.strategies import hostile_text
from tests.samples import payload

DEFAULTS = Keywords.from_config()
# Prose that can open no code span, fence or quote, nor join a keyword to a word.
SAFE_PROSE = st.text(
    st.sampled_from(list("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789,;!?()*_\"'#=+@")),
    max_size=60,
)
GAPS = st.sampled_from([" ", "  ", "\t", " \n", "\n ", "\u00a0", " \r\n  "])
OVERRIDES = st.dictionaries(
    st.sampled_from([c.value for c in Command]),
    st.one_of(hostile_text(max_size=24), st.sampled_from(["go", "go now", "/halt (now)", ""])),
    max_size=6,
)


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def _spelled(draw: st.DrawFn, keyword: str) -> str:
    """The keyword in random ASCII case, its words apart by any single-paragraph spacing."""
    words = [
        "".join(c.upper() if draw(st.booleans()) else c.lower() for c in word)
        for word in keyword.split()
    ]
    return "".join(
        word + (draw(GAPS) if i < len(words) - 1 else "") for i, word in enumerate(words)
    )


def _mentions_keyword(text: str, keywords: Keywords = DEFAULTS) -> bool:
    return any(_normal(k) in _normal(text) for _, k in keywords.by_command)


class TestFindCommands:
    @examples(2)
    @given(body=hostile_text(max_size=2_000), overrides=OVERRIDES)
    def test_never_raises_and_finds_only_keywords_that_are_there(
        self, body: str, overrides: dict[str, str]
    ) -> None:
        try:
            keywords = Keywords.from_config(overrides)
        except ValueError:
            keywords = DEFAULTS  # two commands sharing a keyword: refused at config time
        found = find_commands(body, keywords)
        texts = dict(keywords.by_command)
        assert len(set(found)) == len(found)
        for command in found:
            assert _normal(texts[command]) in _normal(body), (command, texts[command])

    @examples(2)
    @given(data=st.data(), before=SAFE_PROSE, after=SAFE_PROSE, command=st.sampled_from(Command))
    def test_a_keyword_said_in_its_own_paragraph_is_found_in_any_case_and_spacing(
        self, data: st.DataObject, before: str, after: str, command: Command
    ) -> None:
        spelled = data.draw(_spelling(command))
        found = find_commands(f"{before}\n\n{spelled}\n\n{after}", DEFAULTS)
        assert command in found

    @examples(2)
    @given(
        data=st.data(),
        before=SAFE_PROSE,
        after=SAFE_PROSE,
        command=st.sampled_from(Command),
        hiding=st.sampled_from(
            [
                "`{}`",
                "``{}``",
                "```\n{}\n```",
                "~~~~\n{}\n~~~~",
                "  ```sh\n{}",
                "> {}",
                "- > {}",
                "x{}",
                "{}x",
                "{}-x",
                "{}:x",
                "docs/{}",
                "{}.py",
                "a.{}",
                "\\{}",
            ]
        ),
    )
    def test_a_keyword_in_code_a_quote_or_glued_to_a_word_is_not_found(
        self,
        data: st.DataObject,
        before: str,
        after: str,
        command: Command,
        hiding: str,
    ) -> None:
        assume(not _mentions_keyword(before) and not _mentions_keyword(after))
        spelled = data.draw(_spelling(command))
        body = f"{before}\n\n{hiding.format(spelled)}\n\n{after}"
        assert find_commands(body, DEFAULTS) == ()

    @examples(1)
    @given(
        first=st.sampled_from(Command),
        second=st.sampled_from(Command),
        middle=SAFE_PROSE,
    )
    def test_distinct_commands_come_back_in_the_order_written(
        self, first: Command, second: Command, middle: str
    ) -> None:
        assume(first is not second and not _mentions_keyword(middle))
        body = f"the-loop {first}\n\n{middle}\n\nthe-loop {second}\n\nthe-loop {first}"
        assert find_commands(body, DEFAULTS) == (first, second)


def _spelling(command: Command) -> st.SearchStrategy[str]:
    @st.composite
    def spelled(draw: st.DrawFn) -> str:
        return _spelled(draw, dict(DEFAULTS.by_command)[command])

    return spelled()


class TestReadCommand:
    @examples(1)
    @given(
        body=hostile_text(max_size=600),
        action=st.sampled_from(["created", "edited", "deleted", None, "submitted"]),
        authorization=st.sampled_from(Authorization),
        sample=st.sampled_from(
            [
                "issue_comment.created",
                "pull_request_review.submitted",
                "pull_request_review_comment.created",
            ]
        ),
    )
    def test_only_a_new_comment_by_an_allowed_actor_with_one_command_commands(
        self, body: str, action: str | None, authorization: Authorization, sample: str
    ) -> None:
        data: dict[str, Any] = payload(sample)
        data["review" if sample.startswith("pull_request_review.") else "comment"]["body"] = body
        data["action"] = action
        envelope = project_envelope(
            event=sample.partition(".")[0], delivery_id="d-1", payload=data, max_text_chars=65536
        )
        reading = read_command(envelope, keywords=DEFAULTS, authorization=authorization)
        found = find_commands(body, DEFAULTS)
        assert [record.command for record in reading.records] == list(found)
        commands = (
            bool(found)
            and action in {"created", "submitted"}
            and authorization is Authorization.ALLOWED
        )
        assert (reading.command is not None) == (commands and len(found) == 1)
        if commands and len(found) > 1:
            assert reading.verdict is Verdict.AMBIGUOUS


class TestStateMachine:
    @examples(1)
    @given(
        inputs=st.lists(st.one_of(st.sampled_from(Command), st.sampled_from(Signal)), max_size=30),
        require_start=st.booleans(),
    )
    def test_any_sequence_of_inputs_is_answered_and_cleanup_always_cleans(
        self, inputs: list[Command | Signal], require_start: bool
    ) -> None:
        state = ControlState.IDLE
        for command in inputs:
            transition = apply_command(state, command, require_start=require_start)
            assert len(transition.effects) == 1
            if command is Command.CLEANUP:
                assert transition.state is ControlState.CLEANED
            if transition.state is ControlState.STARTED and state is ControlState.IDLE:
                assert not require_start  # arming alone starts only without requireStartCommand
            state = transition.state
