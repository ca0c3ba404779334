"""The runner's ``--harness-arg`` values: what an operator may pass, and the clear refusals."""

from __future__ import annotations

import pytest

from looprelay.agent.harness_options import parse_harness_args
from looprelay.errors import ConfigError


class TestAccepted:
    def test_values_become_each_harness_argv_in_order(self) -> None:
        parsed = parse_harness_args(
            [
                "claude=--model",
                "claude=opus",
                "cursor-agent=--force",
                "claude=--permission-mode=acceptEdits",
                "claude=--allowedTools",
                "claude=Bash(git:*) Edit",
            ]
        )

        assert parsed == {
            "claude": (
                "--model",
                "opus",
                "--permission-mode=acceptEdits",
                "--allowedTools",
                "Bash(git:*) Edit",
            ),
            "cursor-agent": ("--force",),
        }

    def test_an_argument_with_spaces_and_quotes_stays_one_argv_element(self) -> None:
        parsed = parse_harness_args(["claude=--append-system-prompt", "claude=say 'hi'; rm -rf /"])

        assert parsed["claude"][1] == "say 'hi'; rm -rf /"

    @pytest.mark.parametrize(
        "values",
        [
            ["claude=--dangerously-skip-permissions"],
            ["claude=--permission-mode", "claude=bypassPermissions"],
        ],
    )
    def test_bypass_is_the_operators_choice(self, values: list[str]) -> None:
        assert parse_harness_args(values)["claude"] == tuple(v.partition("=")[2] for v in values)

    def test_nothing_given_is_no_extra_args(self) -> None:
        assert parse_harness_args([]) == {}


class TestRefused:
    @pytest.mark.parametrize(
        ("value", "says"),
        [
            ("--model=opus", "HARNESS=ARG"),
            ("aider=--model=x", "HARNESS=ARG"),
            ("claude=", "1-4096 characters"),
            ("claude=" + "x" * 5000, "1-4096 characters"),
            ("claude=--model\nopus", "control character"),
            ("claude=fix everything", "is not a flag"),
            ("claude=--session-id=0b9d6f4e-3a53-4d7c-9a55-2f0f6f4b1c11", "set by the runner"),
            ("claude=--resume", "set by the runner"),
            ("claude=-p", "set by the runner"),
            ("claude=--output-format=text", "set by the runner"),
            ("cursor-agent=--print", "set by the runner"),
        ],
    )
    def test_a_bad_value_is_a_one_line_error_naming_it(self, value: str, says: str) -> None:
        with pytest.raises(ConfigError) as raised:
            parse_harness_args([value])

        assert says in str(raised.value)
        assert "\n" not in str(raised.value)

    @pytest.mark.parametrize(
        "values",
        [
            ["claude=--permission-mode=yolo"],
            ["claude=--permission-mode", "claude=yolo"],
            ["claude=--permission-mode"],
        ],
    )
    def test_an_unknown_permission_mode_is_refused(self, values: list[str]) -> None:
        with pytest.raises(ConfigError, match="is not one of acceptEdits"):
            parse_harness_args(values)
