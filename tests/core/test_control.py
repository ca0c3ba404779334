"""Control keywords, arming, and the work item's control state machine."""

from __future__ import annotations

import time
from typing import Any

import pytest

from looprelay.core.control import (
    DEFAULT_KEYWORDS,
    Action,
    Command,
    CommandRecord,
    ControlReading,
    ControlState,
    Effect,
    Keywords,
    NoOp,
    Signal,
    Transition,
    Verdict,
    apply_command,
    find_commands,
    read_command,
    read_signal,
)
from looprelay.core.envelope import Envelope, project_envelope
from looprelay.core.policy import Authorization
from tests.samples import payload

DEFAULTS = Keywords.from_config()
ALLOWED = Authorization.ALLOWED
S, C = ControlState, Command


def _envelope(name: str, edit: dict[str, Any] | None = None) -> Envelope:
    """Project fixture ``name``; ``edit`` maps dotted paths to replacement values."""
    body = payload(name)
    for path, value in (edit or {}).items():
        *parents, last = path.split(".")
        node = body
        for key in parents:
            node = node[key]
        node[last] = value
    return project_envelope(
        event=name.partition(".")[0], delivery_id="d-1", payload=body, max_text_chars=65536
    )


def _comment(text: str, name: str = "issue_comment.created") -> Envelope:
    key = "review.body" if name.startswith("pull_request_review.") else "comment.body"
    return _envelope(name, {key: text})


class TestKeywords:
    def test_defaults_are_the_loop_verb(self) -> None:
        assert dict(DEFAULTS.by_command) == {c: f"the-loop {c.value}" for c in Command}
        assert dict(DEFAULT_KEYWORDS)[Command.EXECUTE] == "the-loop execute"

    def test_an_override_replaces_one_command_and_normalises_spacing(self) -> None:
        keywords = Keywords.from_config({"start": "  go   now "})
        assert dict(keywords.by_command)[Command.START] == "go now"
        assert dict(keywords.by_command)[Command.STOP] == "the-loop stop"

    @pytest.mark.parametrize("disabled", ["", "   "])
    def test_an_empty_keyword_disables_that_command(self, disabled: str) -> None:
        keywords = Keywords.from_config({"cleanup": disabled})
        assert Command.CLEANUP not in dict(keywords.by_command)
        assert find_commands("the-loop cleanup", keywords) == ()

    def test_every_command_disabled_matches_nothing(self) -> None:
        keywords = Keywords.from_config(dict.fromkeys(Command, ""))
        assert find_commands("the-loop start the-loop stop", keywords) == ()

    @pytest.mark.parametrize(
        ("overrides", "message"),
        [
            ({"contribute": "the-loop contribute"}, "has no command 'contribute'"),
            ({"stop": "The-Loop  Start"}, "share the keyword"),
        ],
    )
    def test_a_bad_override_raises(self, overrides: dict[str, str], message: str) -> None:
        with pytest.raises(ValueError, match=message):
            Keywords.from_config(overrides)

    def test_an_empty_keyword_cannot_be_built_directly(self) -> None:
        with pytest.raises(ValueError, match="empty keyword"):
            Keywords(((Command.START, "  "),))


class TestFindCommands:
    @pytest.mark.parametrize(
        ("body", "expected"),
        [
            ("the-loop start", (C.START,)),
            ("THE-LOOP START", (C.START,)),
            ("The-Loop Execute please", (C.EXECUTE,)),
            ("the-loop start.", (C.START,)),
            ("**the-loop start**", (C.START,)),
            ("(the-loop start)", (C.START,)),
            ("@the-loop start", (C.START,)),
            ("ok\nthe-loop start\nthanks", (C.START,)),
            ("the-loop\n   start", (C.START,)),
            ("the-loop  \n  start", (C.START,)),
            ("the-loop\r\nstart", (C.START,)),
            ("the-loop\tstart", (C.START,)),
            ("the-loop\u00a0start", (C.START,)),
            ("the-loop start ... the-loop start", (C.START,)),
            ("the-loop pause then the-loop stop", (C.PAUSE, C.STOP)),
            ("the-loop cleanup", (C.CLEANUP,)),
            ("the-loop resume", (C.RESUME,)),
        ],
    )
    def test_a_keyword_counts_as_a_whole_word_in_any_case(
        self, body: str, expected: tuple[Command, ...]
    ) -> None:
        assert find_commands(body, DEFAULTS) == expected

    @pytest.mark.parametrize(
        "body",
        [
            "xthe-loop start",
            "the-loop startup",
            "the-loop startlater",
            "the-loop start:now",
            "the-loop start-now",
            "the-loop start_now",
            "docs/the-loop start",
            "the-loop start/notes.md",
            "the-loop start.py",
            "x.the-loop start",
            "the-loop done",
            "the-loopstart",
            "the-loop\n\nstart",
            "let the-loop\n  \nStart with the tests",
        ],
    )
    def test_a_keyword_glued_to_a_word_or_path_or_split_by_a_blank_line_does_not_count(
        self, body: str
    ) -> None:
        assert find_commands(body, DEFAULTS) == ()

    @pytest.mark.parametrize(
        "body",
        [
            "the-loop \u017ftart",  # long s: Unicode case folding would make it "start"
            "the-l\u043e\u043ep start",  # Cyrillic o
            "the\u2010loop start",  # Unicode hyphen
            "\uff54\uff48\uff45-loop start",  # fullwidth letters
            "the-loop st\u0430rt",  # Cyrillic a
            "the-loop s\u200btart",  # zero-width space
        ],
    )
    def test_unicode_look_alikes_do_not_count(self, body: str) -> None:
        assert find_commands(body, DEFAULTS) == ()

    @pytest.mark.parametrize(
        ("body", "expected"),
        [
            ("`the-loop start`", ()),
            ("run `the-loop stop` to stop; the-loop start", (C.START,)),
            ("the-loop `x` start", ()),
            ("```\nthe-loop start\n```", ()),
            ("~~~\nthe-loop start\n~~~", ()),
            ("```\nunclosed fence\nthe-loop start", ()),
            ("``` the-loop start", ()),
            ("````\n```\nthe-loop start\n````\nthe-loop stop", (C.STOP,)),
            ("> the-loop stop", ()),
            ("> the-loop stop\n\nthe-loop start", (C.START,)),
            ("> earlier\nthe-loop start", (C.START,)),
            ("the-loop\n> quoted\nstart", ()),
            ("- > the-loop execute", ()),
        ],
    )
    def test_code_and_quotes_are_not_read(self, body: str, expected: tuple[Command, ...]) -> None:
        assert find_commands(body, DEFAULTS) == expected

    @pytest.mark.parametrize(
        ("body", "expected"),
        [
            ("go now", (C.EXECUTE,)),
            ("go", (C.START,)),
            ("go nowhere", (C.START,)),
            ("please /halt (now).", (C.STOP,)),
            ("/halt (now)x", ()),
        ],
    )
    def test_custom_keywords_prefer_the_longest_match(
        self, body: str, expected: tuple[Command, ...]
    ) -> None:
        keywords = Keywords.from_config({"start": "go", "execute": "go now", "stop": "/halt (now)"})
        assert find_commands(body, keywords) == expected

    @pytest.mark.parametrize(
        "body",
        [
            "```\n" + "the-loop start\n" * 13_000 + "```\nthe-loop stop",
            "x" + "`" * 199_990 + " the-loop stop",
            "a `b " * 40_000 + " the-loop stop",
            "the-loop " * 22_000 + "the-loop stop",
            "the-loop" + " " * 199_990 + "the-loop stop",
            "> the-loop start\n" * 12_000 + "the-loop stop",
            "x" * 199_990 + " the-loop stop",
        ],
    )
    def test_a_200000_character_body_stays_fast(self, body: str) -> None:
        assert len(body) >= 190_000
        started = time.perf_counter()
        assert find_commands(body, DEFAULTS) == (C.STOP,)
        assert time.perf_counter() - started < 1.0


class TestReadCommand:
    def test_an_authorized_new_comment_runs_its_command_and_is_recorded(self) -> None:
        reading = read_command(_comment("the-loop start"), keywords=DEFAULTS, authorization=ALLOWED)
        assert reading == ControlReading(
            Verdict.COMMAND,
            (CommandRecord(C.START, "the-loop start", "Codertocat", 492700400, "d-1"),),
        )
        assert reading.command is C.START

    @pytest.mark.parametrize(
        ("name", "action"),
        [
            ("issue_comment.edited", "edited"),
            ("issue_comment.deleted", "deleted"),
            ("pull_request_review.submitted", "edited"),
            ("pull_request_review.submitted", "dismissed"),
            ("pull_request_review_comment.created", "edited"),
            ("issue_comment.created", None),
        ],
    )
    def test_an_edited_or_deleted_comment_never_runs_a_command(
        self, name: str, action: str | None
    ) -> None:
        key = "review.body" if name.startswith("pull_request_review.") else "comment.body"
        envelope = _envelope(name, {key: "the-loop stop", "action": action})
        reading = read_command(envelope, keywords=DEFAULTS, authorization=ALLOWED)
        assert reading.verdict is Verdict.NOT_NEW
        assert reading.command is None
        assert [record.command for record in reading.records] == [C.STOP]

    @pytest.mark.parametrize(
        "authorization",
        [Authorization.DENIED, Authorization.CLOSE_ONLY, Authorization.NO_ACTOR_CI],
    )
    def test_an_unauthorized_actor_typing_execute_is_refused(
        self, authorization: Authorization
    ) -> None:
        envelope = _envelope(
            "issue_comment.created",
            {
                "comment.body": "- [ ] `pr-sessions-always`\nthe-loop execute",
                "comment.user": {"login": "drive-by", "id": 666},
            },
        )
        reading = read_command(envelope, keywords=DEFAULTS, authorization=authorization)
        assert reading.verdict is Verdict.UNAUTHORIZED
        assert reading.command is None
        assert reading.records == (
            CommandRecord(C.EXECUTE, "the-loop execute", "drive-by", 492700400, "d-1"),
        )

    def test_two_different_commands_are_ambiguous(self) -> None:
        reading = read_command(
            _comment("the-loop pause then the-loop stop"), keywords=DEFAULTS, authorization=ALLOWED
        )
        assert reading.verdict is Verdict.AMBIGUOUS
        assert reading.command is None
        assert [record.command for record in reading.records] == [C.PAUSE, C.STOP]

    def test_the_same_command_twice_is_not_ambiguous(self) -> None:
        reading = read_command(
            _comment("the-loop stop. Really: the-loop stop"),
            keywords=DEFAULTS,
            authorization=ALLOWED,
        )
        assert reading.command is C.STOP

    @pytest.mark.parametrize(
        ("name", "edit"),
        [
            ("issue_comment.created", {"comment.body": "thanks, looks good"}),
            ("issues.opened", {"issue.body": "the-loop start"}),
            ("pull_request.opened", {"pull_request.body": "the-loop start"}),
            ("issues.labeled", {"issue.body": "the-loop execute"}),
            ("check_run.completed", {"check_run.output.summary": "the-loop cleanup"}),
        ],
    )
    def test_no_keyword_or_a_keyword_in_a_description_is_no_command(
        self, name: str, edit: dict[str, Any]
    ) -> None:
        reading = read_command(_envelope(name, edit), keywords=DEFAULTS, authorization=ALLOWED)
        assert reading == ControlReading(Verdict.NONE)

    @pytest.mark.parametrize(
        ("name", "author", "comment_id"),
        [
            ("pull_request_review.submitted", "Codertocat", 237895671),
            ("pull_request_review_comment.created", "Codertocat", 284312630),
        ],
    )
    def test_review_bodies_and_review_comments_carry_commands(
        self, name: str, author: str, comment_id: int
    ) -> None:
        reading = read_command(
            _comment("the-loop pause", name), keywords=DEFAULTS, authorization=ALLOWED
        )
        assert reading.records == (
            CommandRecord(C.PAUSE, "the-loop pause", author, comment_id, "d-1"),
        )
        assert reading.command is C.PAUSE

    def test_a_command_in_a_quoted_earlier_comment_does_not_run_again(self) -> None:
        envelope = _comment("> the-loop cleanup\n\nAgreed, but not yet.")
        reading = read_command(envelope, keywords=DEFAULTS, authorization=ALLOWED)
        assert reading.verdict is Verdict.NONE

    def test_a_comment_without_an_author_records_no_actor(self) -> None:
        envelope = _envelope(
            "issue_comment.created", {"comment.body": "the-loop stop", "comment.user": None}
        )
        reading = read_command(envelope, keywords=DEFAULTS, authorization=Authorization.DENIED)
        assert reading.verdict is Verdict.UNAUTHORIZED
        assert reading.records[0].actor is None


class TestReadSignal:
    @pytest.mark.parametrize(
        ("name", "edit", "label", "authorization", "expected"),
        [
            ("issues.labeled", {}, "bug", ALLOWED, Signal.ARM),
            ("issues.labeled", {}, "Bug", ALLOWED, None),
            ("issues.labeled", {}, "the-loop", ALLOWED, None),
            ("issues.labeled", {}, None, ALLOWED, None),
            ("issues.labeled", {}, "", ALLOWED, None),
            ("issues.labeled", {}, "bug", Authorization.DENIED, None),
            ("issues.labeled", {"action": "unlabeled"}, "bug", ALLOWED, None),
            ("issues.opened", {}, "bug", ALLOWED, Signal.ARM),
            ("issues.opened", {"action": "reopened"}, "bug", ALLOWED, Signal.ARM),
            ("issues.opened", {"issue.labels": []}, "bug", ALLOWED, None),
            ("issues.opened", {"action": "edited"}, "bug", ALLOWED, None),
            (
                "pull_request.opened",
                {"action": "labeled", "label": {"name": "bug"}},
                "bug",
                ALLOWED,
                Signal.ARM,
            ),
            ("issues.opened", {"action": "closed"}, "bug", Authorization.CLOSE_ONLY, Signal.CLOSE),
            ("pull_request.closed", {}, None, ALLOWED, Signal.CLOSE),
            ("pull_request.closed", {}, None, Authorization.DENIED, None),
            ("issue_comment.created", {}, "bug", ALLOWED, None),
            ("check_run.completed", {}, "bug", Authorization.NO_ACTOR_CI, None),
        ],
    )
    def test_labels_arm_and_closing_closes(
        self,
        name: str,
        edit: dict[str, Any],
        label: str | None,
        authorization: Authorization,
        expected: Signal | None,
    ) -> None:
        envelope = _envelope(name, edit)
        signal = read_signal(envelope, auto_execute_label=label, authorization=authorization)
        assert signal is expected


A, N = Action, NoOp
# (state, input, new state, effect) with requireStartCommand on: every pair of the machine.
REQUIRE_START_TABLE: list[tuple[ControlState, Command | Signal, ControlState, Effect]] = [
    (S.IDLE, Signal.ARM, S.ARMED, N("awaiting-start")),
    (S.IDLE, C.START, S.IDLE, N("not-armed")),
    (S.IDLE, C.STOP, S.IDLE, N("nothing-to-stop")),
    (S.IDLE, C.PAUSE, S.IDLE, N("nothing-to-pause")),
    (S.IDLE, C.RESUME, S.IDLE, N("nothing-to-resume")),
    (S.IDLE, C.EXECUTE, S.IDLE, N("not-started")),
    (S.IDLE, C.CLEANUP, S.CLEANED, A.CLEANUP),
    (S.IDLE, Signal.CLOSE, S.IDLE, N("nothing-running")),
    (S.ARMED, Signal.ARM, S.ARMED, N("already-armed")),
    (S.ARMED, C.START, S.STARTED, A.SPAWN),
    (S.ARMED, C.STOP, S.STOPPED, N("nothing-running")),
    (S.ARMED, C.PAUSE, S.ARMED, N("nothing-to-pause")),
    (S.ARMED, C.RESUME, S.ARMED, N("nothing-to-resume")),
    (S.ARMED, C.EXECUTE, S.ARMED, N("not-started")),
    (S.ARMED, C.CLEANUP, S.CLEANED, A.CLEANUP),
    (S.ARMED, Signal.CLOSE, S.IDLE, N("nothing-running")),
    (S.STARTED, Signal.ARM, S.STARTED, N("already-started")),
    (S.STARTED, C.START, S.STARTED, N("already-started")),
    (S.STARTED, C.STOP, S.STOPPED, A.TERMINATE),
    (S.STARTED, C.PAUSE, S.PAUSED, A.PAUSE),
    (S.STARTED, C.RESUME, S.STARTED, N("nothing-to-resume")),
    (S.STARTED, C.EXECUTE, S.STARTED, A.EXECUTE),
    (S.STARTED, C.CLEANUP, S.CLEANED, A.CLEANUP),
    (S.STARTED, Signal.CLOSE, S.IDLE, A.TERMINATE),
    (S.PAUSED, Signal.ARM, S.PAUSED, N("paused")),
    (S.PAUSED, C.START, S.STARTED, A.RESUME),
    (S.PAUSED, C.STOP, S.STOPPED, A.TERMINATE),
    (S.PAUSED, C.PAUSE, S.PAUSED, N("already-paused")),
    (S.PAUSED, C.RESUME, S.STARTED, A.RESUME),
    (S.PAUSED, C.EXECUTE, S.PAUSED, N("paused")),
    (S.PAUSED, C.CLEANUP, S.CLEANED, A.CLEANUP),
    (S.PAUSED, Signal.CLOSE, S.IDLE, A.TERMINATE),
    (S.STOPPED, Signal.ARM, S.ARMED, N("awaiting-start")),
    (S.STOPPED, C.START, S.STARTED, A.SPAWN),
    (S.STOPPED, C.STOP, S.STOPPED, N("already-stopped")),
    (S.STOPPED, C.PAUSE, S.STOPPED, N("nothing-to-pause")),
    (S.STOPPED, C.RESUME, S.STOPPED, N("nothing-to-resume")),
    (S.STOPPED, C.EXECUTE, S.STOPPED, N("not-started")),
    (S.STOPPED, C.CLEANUP, S.CLEANED, A.CLEANUP),
    (S.STOPPED, Signal.CLOSE, S.IDLE, N("nothing-running")),
    (S.CLEANED, Signal.ARM, S.ARMED, N("awaiting-start")),
    (S.CLEANED, C.START, S.CLEANED, N("not-armed")),
    (S.CLEANED, C.STOP, S.CLEANED, N("nothing-to-stop")),
    (S.CLEANED, C.PAUSE, S.CLEANED, N("nothing-to-pause")),
    (S.CLEANED, C.RESUME, S.CLEANED, N("nothing-to-resume")),
    (S.CLEANED, C.EXECUTE, S.CLEANED, N("not-started")),
    (S.CLEANED, C.CLEANUP, S.CLEANED, A.CLEANUP),
    (S.CLEANED, Signal.CLOSE, S.CLEANED, N("nothing-running")),
]
# Without requireStartCommand only arming differs: it starts the work item.
ARM_STARTS = {S.IDLE, S.ARMED, S.STOPPED, S.CLEANED}


class TestApplyCommand:
    def test_the_table_covers_every_state_and_input(self) -> None:
        pairs = {(state, given) for state, given, _, _ in REQUIRE_START_TABLE}
        assert pairs == {(s, i) for s in ControlState for i in [*Command, *Signal]}

    @pytest.mark.parametrize(("state", "given", "new_state", "effect"), REQUIRE_START_TABLE)
    def test_with_a_start_required(
        self,
        state: ControlState,
        given: Command | Signal,
        new_state: ControlState,
        effect: Effect,
    ) -> None:
        assert apply_command(state, given) == Transition(new_state, (effect,))

    @pytest.mark.parametrize(("state", "given", "new_state", "effect"), REQUIRE_START_TABLE)
    def test_without_a_start_required_arming_is_the_start(
        self,
        state: ControlState,
        given: Command | Signal,
        new_state: ControlState,
        effect: Effect,
    ) -> None:
        if given is Signal.ARM and state in ARM_STARTS:
            new_state, effect = S.STARTED, A.SPAWN
        assert apply_command(state, given, require_start=False) == (new_state, (effect,))

    def test_the_scenario_above_the_machine(self) -> None:
        steps: list[tuple[Command | Signal, ControlState, Effect]] = [
            (C.START, S.IDLE, N("not-armed")),
            (Signal.ARM, S.ARMED, N("awaiting-start")),
            (C.START, S.STARTED, A.SPAWN),
            (C.PAUSE, S.PAUSED, A.PAUSE),
            (C.RESUME, S.STARTED, A.RESUME),
            (C.STOP, S.STOPPED, A.TERMINATE),
            (C.START, S.STARTED, A.SPAWN),
            (Signal.CLOSE, S.IDLE, A.TERMINATE),
            (Signal.ARM, S.ARMED, N("awaiting-start")),
            (C.CLEANUP, S.CLEANED, A.CLEANUP),
            (C.START, S.CLEANED, N("not-armed")),
        ]
        state = S.IDLE
        for given, expected_state, expected_effect in steps:
            state, effects = apply_command(state, given)
            assert (given, state, effects) == (given, expected_state, (expected_effect,))
