"""Reading a headless turn's output: the shapes Claude 2.x and cursor-agent print, and bad ones."""

from __future__ import annotations

import json
from typing import Any

import pytest

from looprelay.agent import harnesses
from looprelay.agent.harnesses.output import MAX_MESSAGE_CHARS, Turn


def parse_turn(harness: str, *, exit_code: int, stdout: str, stderr: str) -> Turn:
    """The turn ``harness``'s own parser reads from this output."""
    return harnesses.get(harness).parse_turn(exit_code=exit_code, stdout=stdout, stderr=stderr)


SESSION_ID = "0b9d6f4e-3a53-4d7c-9a55-2f0f6f4b1c11"


def _claude(**changes: Any) -> str:
    """Claude 2.x's one result object, as ``claude -p --output-format json`` prints it."""
    result = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "duration_ms": 2745,
        "duration_api_ms": 0,
        "num_turns": 1,
        "result": "Done: the bug is fixed.",
        "session_id": SESSION_ID,
        "total_cost_usd": 0,
        "usage": {"input_tokens": 0, "output_tokens": 0},
        "permission_denials": [],
        "uuid": "6f1c0e4a-2b8d-4c3e-9a7f-0d5b1e2c3a4f",
    }
    return json.dumps({**result, **changes}, ensure_ascii=False) + "\n"


NOT_LOGGED_IN = _claude(is_error=True, result="Not logged in · Please run /login")
OBSERVED_NOT_LOGGED_IN = (
    # Claude Code 2.1.332 offline, `-p --output-format json --session-id ...`: exit 1, stderr
    # empty, this one line (usage and subagent_stats emptied here). subtype says "success".
    '{"duration_api_ms":0,"stop_reason":"stop_sequence","session_id":'
    '"33333333-3333-4333-8333-333333333333","total_cost_usd":0,"usage":{},"modelUsage":{},'
    '"permission_denials":[],"terminal_reason":"api_error","fast_mode_state":"off",'
    '"fast_mode_disabled_reason":"sdk_opt_in_required","subagent_stats":{},"safety_stops":0,'
    '"is_error":true,"num_turns":1,"subtype":"success","api_error_status":null,'
    '"result":"Not logged in · Please run /login","type":"result","duration_ms":131,'
    '"uuid":"c9c594e6-0000-4000-8000-000000000000","queued_turn_count":0,"result_index":0}\n'
)


class TestClaude:
    def test_a_success_gives_the_answer_and_the_session(self) -> None:
        turn = parse_turn("claude", exit_code=0, stdout=_claude(), stderr="")
        assert turn == Turn(
            ok=True, result="Done: the bug is fixed.", subtype="success", session_id=SESSION_ID
        )

    def test_is_error_with_exit_1_fails_with_the_harness_message(self) -> None:
        turn = parse_turn("claude", exit_code=1, stdout=NOT_LOGGED_IN, stderr="")
        assert turn == Turn(
            ok=False,
            error="Not logged in · Please run /login",
            subtype="success",
            session_id=SESSION_ID,
        )

    def test_the_line_claude_2_1_332_prints_offline(self) -> None:
        turn = parse_turn("claude", exit_code=1, stdout=OBSERVED_NOT_LOGGED_IN, stderr="")
        assert turn == Turn(
            ok=False,
            error="Not logged in · Please run /login",
            subtype="success",
            session_id="33333333-3333-4333-8333-333333333333",
        )

    @pytest.mark.parametrize(
        "said",
        [
            "Error: Session ID 11111111-1111-4111-8111-111111111111 is already in use.",
            "No conversation found with session ID: 22222222-2222-4222-8222-222222222222",
            "Error: Invalid session ID. Must be a valid UUID.",
        ],
    )
    def test_an_error_before_the_turn_prints_no_json_and_says_it_on_stderr(self, said: str) -> None:
        turn = parse_turn("claude", exit_code=1, stdout="", stderr=said + "\n")
        assert turn == Turn(ok=False, error=said)

    def test_is_error_fails_even_with_exit_0(self) -> None:
        turn = parse_turn("claude", exit_code=0, stdout=NOT_LOGGED_IN, stderr="")
        assert (turn.ok, turn.error, turn.result) == (
            False,
            "Not logged in · Please run /login",
            "",
        )

    def test_an_error_subtype_without_a_result_names_its_errors_or_itself(self) -> None:
        listed = _claude(subtype="error_during_execution", result=None, errors=["API down"])
        bare = _claude(subtype="error_max_turns", is_error=False, result=None)
        assert parse_turn("claude", exit_code=1, stdout=listed, stderr="").error == "API down"
        turn = parse_turn("claude", exit_code=0, stdout=bare, stderr="")
        assert (turn.ok, turn.error, turn.subtype) == (False, "error_max_turns", "error_max_turns")

    def test_a_non_zero_exit_fails_a_result_that_claims_success(self) -> None:
        turn = parse_turn("claude", exit_code=2, stdout=_claude(), stderr="Killed: out of memory\n")
        assert (turn.ok, turn.error, turn.result) == (False, "Killed: out of memory", "")

    def test_a_non_zero_exit_with_nothing_said_names_the_exit_code(self) -> None:
        turn = parse_turn("claude", exit_code=3, stdout=_claude(), stderr="")
        assert (turn.ok, turn.error) == (False, "exited with 3")

    @pytest.mark.parametrize(
        "printed",
        ["not-a-uuid", SESSION_ID.upper(), f"{SESSION_ID}\n", "", None, 42],
        ids=["word", "upper-case", "newline", "empty", "null", "number"],
    )
    def test_a_session_id_counts_only_as_a_canonical_uuid(self, printed: object) -> None:
        turn = parse_turn("claude", exit_code=0, stdout=_claude(session_id=printed), stderr="")
        assert (turn.ok, turn.session_id) == (True, "")


class TestCursorAgent:
    def test_its_result_shape_reads_the_same(self) -> None:
        printed = json.dumps(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "duration_ms": 5000,
                "duration_api_ms": 5000,
                "result": "Renamed the function.",
                "session_id": "c6b62c6f-7ead-4fd6-9922-e952131177ff",
                "request_id": "r-1",
            }
        )
        turn = parse_turn("cursor-agent", exit_code=0, stdout=printed, stderr="")
        assert turn == Turn(
            ok=True,
            result="Renamed the function.",
            subtype="success",
            session_id="c6b62c6f-7ead-4fd6-9922-e952131177ff",
        )

    @pytest.mark.parametrize(
        ("printed", "kept"),
        [
            ("chat_01HZX.v2:a-b", "chat_01HZX.v2:a-b"),
            ("x" * 100, "x" * 100),
            ("x" * 101, ""),
            ("-flag", ""),
            ("a b", ""),
            ("a/../b", ""),
            ("ünï", ""),
        ],
    )
    def test_its_ids_are_kept_as_given_when_their_characters_are_safe(
        self, printed: str, kept: str
    ) -> None:
        stdout = _claude(session_id=printed)
        assert parse_turn("cursor-agent", exit_code=0, stdout=stdout, stderr="").session_id == kept


class TestOutputShapes:
    def test_noise_lines_before_the_object_are_skipped(self) -> None:
        stdout = "Warning: update available\n{not json\n" + "noise " * 5000 + "\n" + _claude()
        assert parse_turn("claude", exit_code=0, stdout=stdout, stderr="").result == (
            "Done: the bug is fixed."
        )

    def test_a_stream_ends_with_the_result_line(self) -> None:
        events = [
            {"type": "system", "subtype": "init", "session_id": SESSION_ID},
            {"type": "assistant", "message": {"content": [{"type": "text", "text": "hm"}]}},
        ]
        stdout = "".join(json.dumps(e) + "\n" for e in events) + _claude(result="final")
        assert parse_turn("claude", exit_code=0, stdout=stdout, stderr="").result == "final"

    def test_a_pretty_printed_object_is_read(self) -> None:
        stdout = json.dumps(json.loads(_claude()), indent=2) + "\n"
        assert parse_turn("claude", exit_code=0, stdout=stdout, stderr="").ok

    def test_a_cut_off_last_line_falls_back_to_an_earlier_result(self) -> None:
        stdout = _claude(result="earlier") + '{"type": "result", "result": "cut of'
        assert parse_turn("claude", exit_code=0, stdout=stdout, stderr="").result == "earlier"

    def test_replacement_characters_and_lone_surrogates_come_out_sendable(self) -> None:
        raw = b'{"type":"result","is_error":false,"result":"caf\xc3\xa9 \xff ok \\ud800!"}\n'
        turn = parse_turn("claude", exit_code=0, stdout=raw.decode("utf-8", "replace"), stderr="")
        assert turn.result == "café \ufffd ok ?!"
        turn.result.encode("utf-8")  # would raise on a lone surrogate

    def test_a_huge_answer_survives_whole(self) -> None:
        answer = "ü" * 300_000
        turn = parse_turn("claude", exit_code=0, stdout=_claude(result=answer), stderr="")
        assert turn.result == answer

    def test_nesting_too_deep_to_decode_is_skipped(self) -> None:
        deep = '{"a":' * 200_000 + "1" + "}" * 200_000 + "\n"
        turn = parse_turn("claude", exit_code=0, stdout=_claude() + deep, stderr="")
        assert turn.result == "Done: the bug is fixed."

    def test_json_that_is_not_a_result_is_no_result(self) -> None:
        stdout = '{"type": "assistant"}\n[1, 2]\n"text"\n'
        turn = parse_turn("claude", exit_code=0, stdout=stdout, stderr="")
        assert (turn.ok, turn.error) == (False, 'printed no JSON result; [1, 2] · "text"')


class TestFailuresWithoutJson:
    def test_empty_output_says_so(self) -> None:
        assert parse_turn("claude", exit_code=0, stdout="", stderr="").error == "printed nothing"
        turn = parse_turn("claude", exit_code=127, stdout="", stderr="")
        assert (turn.ok, turn.error) == (False, "exited with 127 and printed nothing")

    def test_the_last_lines_of_stderr_are_the_message(self) -> None:
        stderr = (
            "Traceback (most recent call last):\n  File x\n\n"
            "\x1b[31mError: Session ID 0b9d is already in use.\x1b[0m\n\n"
        )
        turn = parse_turn("claude", exit_code=1, stdout="partial out", stderr=stderr)
        assert turn == Turn(ok=False, error="File x · Error: Session ID 0b9d is already in use.")

    def test_stdout_speaks_when_stderr_is_silent(self) -> None:
        turn = parse_turn(
            "cursor-agent", exit_code=1, stdout="Error: not authenticated\n", stderr=""
        )
        assert turn.error == "Error: not authenticated"

    def test_a_success_exit_without_a_result_is_a_failure(self) -> None:
        turn = parse_turn("claude", exit_code=0, stdout="Hello! How can I help?\n", stderr="")
        assert (turn.ok, turn.error) == (False, "printed no JSON result; Hello! How can I help?")

    def test_a_long_message_is_cut_to_a_line_for_people(self) -> None:
        turn = parse_turn("claude", exit_code=1, stdout="", stderr="e" * 10_000)
        assert len(turn.error) == MAX_MESSAGE_CHARS and turn.error.endswith("…")

    def test_a_long_is_error_result_is_cut_too(self) -> None:
        stdout = _claude(is_error=True, result="API Error:\n" + "x" * 5_000)
        turn = parse_turn("claude", exit_code=1, stdout=stdout, stderr="")
        assert turn.error.startswith("API Error: xxx") and len(turn.error) == MAX_MESSAGE_CHARS
