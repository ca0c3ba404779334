"""The ``routing`` section resolved into the core's policy, from a real config file: pinned
``authorizedUsers`` entries, the warning about logins listed alone, ``closeEndsSession``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from looprelay.config.model import load_config
from looprelay.config.routing import routing_policy
from looprelay.core.policy import CloseEndsSession
from looprelay.errors import ConfigError


def _routing(tmp_path: Path, yaml_text: str) -> Path:
    path = tmp_path / "looprelay.yaml"
    path.write_text("routing:\n" + yaml_text, encoding="utf-8")
    return path


class TestAuthorizedUsers:
    def test_entries_may_pin_a_login_to_an_id_or_give_a_login_or_an_id(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        path = _routing(
            tmp_path,
            "  authorizedUsers:\n"
            "    - {login: Octocat, id: 583231}\n"
            "    - Kate\n"
            "    - 42\n"
            "    - hubot\n",
        )
        with caplog.at_level(logging.WARNING, logger="looprelay.routing"):
            policy = routing_policy(load_config(path, environ={}).routing)

        assert dict(policy.users.pins) == {"octocat": 583231}
        assert policy.users.logins == {"kate", "hubot"}
        assert policy.users.ids == {583231, 42}
        [warning] = [r.getMessage() for r in caplog.records]
        assert warning.startswith("routing.authorizedUsers lists hubot, kate by login alone")
        assert "octocat" not in warning

    def test_no_warning_when_every_login_is_pinned(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        path = _routing(tmp_path, "  authorizedUsers: [{login: octocat, id: 583231}, 42]\n")
        with caplog.at_level(logging.WARNING, logger="looprelay.routing"):
            routing_policy(load_config(path, environ={}).routing)
        assert caplog.records == []

    @pytest.mark.parametrize(
        ("entries", "message"),
        [
            ("[{login: octocat}]", "entry 0 must be {login: LOGIN, id: NUMERIC_ID} (id: Field"),
            ("[kate, {id: 5}]", "entry 1 must be {login: LOGIN, id: NUMERIC_ID} (login: Field"),
            ("[{login: octocat, id: 0}]", "(id: Input should be greater than 0)"),
            ("[{login: octocat, id: 1, name: Mona}]", "(name: Extra inputs are not permitted)"),
        ],
    )
    def test_a_malformed_pinned_entry_is_a_config_error_naming_it(
        self, tmp_path: Path, entries: str, message: str
    ) -> None:
        path = _routing(tmp_path, f"  authorizedUsers: {entries}\n")
        with pytest.raises(ConfigError) as refused:
            load_config(path, environ={})
        assert "routing.authorizedUsers" in str(refused.value)
        assert message in str(refused.value)

    @pytest.mark.parametrize(
        ("entries", "message"),
        [
            (
                "[{login: octocat, id: 1}, {login: OctoCat, id: 2}]",
                "pins octocat to two user ids, 1 and 2",
            ),
            ("[{login: '@octocat', id: 1}]", "needs a GitHub login"),
        ],
    )
    def test_pins_that_cannot_mean_one_account_are_refused(
        self, tmp_path: Path, entries: str, message: str
    ) -> None:
        config = load_config(_routing(tmp_path, f"  authorizedUsers: {entries}\n"), environ={})
        with pytest.raises(ConfigError, match=r"^routing: ") as refused:
            routing_policy(config.routing)
        assert message in str(refused.value)


class TestCloseEndsSession:
    @pytest.mark.parametrize(
        ("yaml_text", "expected"),
        [
            ("  botLogins: []\n", CloseEndsSession.AUTHORIZED),
            ("  closeEndsSession: authorized\n", CloseEndsSession.AUTHORIZED),
            ("  closeEndsSession: anyone\n", CloseEndsSession.ANYONE),
        ],
    )
    def test_only_authorized_closes_end_sessions_unless_the_operator_says_anyone(
        self, tmp_path: Path, yaml_text: str, expected: CloseEndsSession
    ) -> None:
        config = load_config(_routing(tmp_path, yaml_text), environ={})
        assert routing_policy(config.routing).close_ends_session is expected

    def test_another_value_is_a_config_error_naming_the_key(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"routing\.closeEndsSession: Input should be"):
            load_config(_routing(tmp_path, "  closeEndsSession: everyone\n"), environ={})


class TestHarnessLabels:
    def test_labels_reach_the_policy_in_the_order_written(self, tmp_path: Path) -> None:
        path = _routing(
            tmp_path,
            "  authorizedUsers: [42]\n"
            "  harnessLabels:\n"
            "    'agent: gemini': gemini\n"
            "    'agent: codex': codex\n",
        )
        policy = routing_policy(load_config(path, environ={}).routing)
        assert policy.harness_labels == (("agent: gemini", "gemini"), ("agent: codex", "codex"))
        assert policy.harness == "claude"
