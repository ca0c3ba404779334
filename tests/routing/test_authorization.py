"""Authorization by immutable user id (issue 13), through the worker's HTTP endpoint on each
store backend.

GitHub frees the login of a renamed or deleted account, and anyone may take it; the user id
stays with the account. So a listed login counts only with the user id it is pinned to: the one
the config gives (``{login, id}``), or, for a login listed alone, the first one seen with it,
kept in the store so a restart or a second worker instance holds to it too.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.routing.conftest import REPO, USER_IDS, MakeRelay, Relay, comment_payload, user

CODERTOCAT_ID = USER_IDS["codertocat"]
IMPOSTOR_ID = 9_000_666
"""Whoever registered ``Codertocat`` after the real account freed the login."""
PINNED_CODERTOCAT = {"login": "Codertocat", "id": CODERTOCAT_ID}


def _comment_as(relay: Relay, body: str, *, login: str, user_id: int) -> tuple[str, dict[str, Any]]:
    """Post ``body`` as ``login`` carrying ``user_id``; return the delivery id and answer."""
    comment_id = relay.github.add_comment(body, number=1, author=login, repository=REPO)
    data = comment_payload(body, comment_id=comment_id, author=login)
    account = user(login) | {"id": user_id}
    data["comment"]["user"] = account
    data["sender"] = account
    sent = relay.send("issue_comment", data, comment_id=comment_id)
    return sent.delivery_id, sent.answer


class TestFirstSightPins:
    def test_a_login_listed_alone_is_pinned_to_the_first_id_seen_and_another_id_is_refused(
        self, relay: MakeRelay, caplog: pytest.LogCaptureFixture
    ) -> None:
        deployment = relay(authorized_users=["codertocat"])
        deployment.start()
        [pinned] = deployment.events("routing.user_pinned")
        assert pinned.data == {"login": "codertocat", "user_id": CODERTOCAT_ID}

        with caplog.at_level(logging.WARNING, logger="looprelay.service.route"):
            delivery_id, answer = _comment_as(
                deployment, "the-loop stop", login="Codertocat", user_id=IMPOSTOR_ID
            )

        assert answer["outcome"] == "refused:user-id-mismatch"
        record = deployment.ledger(delivery_id)
        assert str(CODERTOCAT_ID) in record.detail and str(IMPOSTOR_ID) in record.detail
        [dropped] = deployment.events("routing.dropped", delivery_id=delivery_id)
        assert dropped.data == {
            "reason": "user-id-mismatch",
            "actor": "Codertocat",
            "user_id": IMPOSTOR_ID,
            "pinned_user_id": CODERTOCAT_ID,
        }
        item = deployment.must_item()
        assert item.control == "started"
        assert [c.command for c in item.commands] == ["start"]
        assert deployment.dispatches(1, delivery_id=delivery_id) == []
        assert any(
            "user id" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records
        )

    def test_the_pin_outlives_a_restart_and_still_admits_the_real_account(
        self, relay: MakeRelay
    ) -> None:
        """A second deployment over the same store (a restart, or another worker instance)
        holds to the pin made by the first one."""
        first = relay(authorized_users=["codertocat"])
        first.start()

        restarted = relay(authorized_users=["codertocat"])
        impostor, refused = _comment_as(
            restarted, "the-loop stop", login="codertocat", user_id=IMPOSTOR_ID
        )
        real, accepted = _comment_as(
            restarted, "the-loop stop", login="Codertocat", user_id=CODERTOCAT_ID
        )

        assert refused["outcome"] == "refused:user-id-mismatch"
        assert accepted["outcome"] == "dispatched"
        assert [d.kind for d in restarted.dispatches(1, delivery_id=real)] == ["terminate"]
        assert restarted.dispatches(1, delivery_id=impostor) == []
        assert len(restarted.events("routing.user_pinned")) == 1

    def test_whoever_comes_first_is_pinned_which_is_why_start_warns(
        self, relay: MakeRelay, caplog: pytest.LogCaptureFixture
    ) -> None:
        """First sight trusts whoever holds the login then: the warning at start names every
        login listed alone, and the real account arriving later is the one refused."""
        with caplog.at_level(logging.WARNING, logger="looprelay.routing"):
            deployment = relay(authorized_users=["codertocat", CODERTOCAT_ID + 1])
        [warning] = [r.getMessage() for r in caplog.records if "by login alone" in r.getMessage()]
        assert "codertocat" in warning and "{login: LOGIN, id: ID}" in warning

        _, first = _comment_as(deployment, "a note", login="Codertocat", user_id=IMPOSTOR_ID)
        _, later = _comment_as(deployment, "a note", login="Codertocat", user_id=CODERTOCAT_ID)

        assert first["outcome"] != "refused:user-id-mismatch"
        assert later["outcome"] == "refused:user-id-mismatch"


class TestConfiguredPins:
    def test_a_login_pinned_in_the_config_refuses_another_id_even_on_first_sight(
        self, relay: MakeRelay, caplog: pytest.LogCaptureFixture
    ) -> None:
        with caplog.at_level(logging.WARNING, logger="looprelay.routing"):
            deployment = relay(authorized_users=[PINNED_CODERTOCAT])
        assert not [r for r in caplog.records if "by login alone" in r.getMessage()]
        deployment.given_armed()

        _, impostor = _comment_as(
            deployment, "the-loop start", login="Codertocat", user_id=IMPOSTOR_ID
        )
        _, real = _comment_as(
            deployment, "the-loop start", login="Codertocat", user_id=CODERTOCAT_ID
        )

        assert impostor["outcome"] == "refused:user-id-mismatch"
        assert real["outcome"] == "dispatched"
        assert deployment.events("routing.user_pinned") == []

    def test_the_config_pin_overrides_a_first_sight_pin_made_earlier(
        self, relay: MakeRelay
    ) -> None:
        """The operator corrects a wrong first-sight pin by writing the right id."""
        before = relay(authorized_users=["codertocat"])
        before.given_armed()
        _comment_as(before, "a note", login="Codertocat", user_id=IMPOSTOR_ID)

        corrected = relay(authorized_users=[PINNED_CODERTOCAT])
        _, real = _comment_as(
            corrected, "the-loop start", login="Codertocat", user_id=CODERTOCAT_ID
        )
        _, impostor = _comment_as(
            corrected, "the-loop stop", login="Codertocat", user_id=IMPOSTOR_ID
        )

        assert real["outcome"] == "dispatched"
        assert impostor["outcome"] == "refused:user-id-mismatch"

    def test_a_renamed_account_keeps_its_authority_by_id(self, relay: MakeRelay) -> None:
        deployment = relay(authorized_users=[PINNED_CODERTOCAT])
        deployment.given_armed()

        _, renamed = _comment_as(
            deployment, "the-loop start", login="codertocat-new", user_id=CODERTOCAT_ID
        )

        assert renamed["outcome"] == "dispatched"
