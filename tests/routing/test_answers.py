"""A person whose comment goes nowhere sees why on GitHub: one marked answer and a 😕 reaction,
at most once per comment, on each store (the ``relay`` fixture runs on SQLite and Firestore)."""

from __future__ import annotations

from looprelay.core.answers import ALREADY_STARTED, ANSWER_KIND, HELD, NOT_AUTHORIZED, PAUSED
from looprelay.core.markers import Marker
from tests.routing.conftest import AUTO_LABEL, REPO, MakeRelay, Relay, comment_payload


def _answers(deployment: Relay, delivery_id: str) -> list[str]:
    """The bodies of looprelay's answers to one delivery, marker line removed."""
    needle = Marker(ANSWER_KIND, delivery_id).render()
    return [c.body.split(needle)[0].strip() for c in deployment.ours() if needle in c.body]


def test_a_comment_while_paused_is_answered_that_it_is_kept(relay: MakeRelay) -> None:
    deployment = relay()
    deployment.start()
    deployment.comment("the-loop pause")
    held = deployment.comment("Are you there?")

    assert _answers(deployment, held.delivery_id) == [HELD]
    assert deployment.reactions(held.comment_id or 0) == ["eyes"]  # it will go through
    assert [d.status for d in deployment.dispatches(1, delivery_id=held.delivery_id)] == ["held"]


def test_a_comment_dropped_while_paused_is_answered_so(relay: MakeRelay) -> None:
    deployment = relay(paused_events="drop")
    deployment.start()
    deployment.comment("the-loop pause")
    dropped = deployment.comment("Are you there?")

    assert _answers(deployment, dropped.delivery_id) == [PAUSED]
    assert deployment.reactions(dropped.comment_id or 0) == ["confused"]
    assert deployment.dispatches(1, delivery_id=dropped.delivery_id) == []


def test_a_start_without_the_label_says_which_label_arms_it(relay: MakeRelay) -> None:
    deployment = relay()
    early = deployment.comment("the-loop start")

    assert _answers(deployment, early.delivery_id) == [
        f"not armed: add the label `{AUTO_LABEL}` first, then `the-loop start`"
    ]
    assert deployment.reactions(early.comment_id or 0) == ["confused"]
    assert deployment.must_item().control == "idle"


def test_a_second_start_is_answered_already_started(relay: MakeRelay) -> None:
    deployment = relay()
    deployment.start()
    again = deployment.comment("the-loop start")

    assert _answers(deployment, again.delivery_id) == [ALREADY_STARTED]
    assert deployment.reactions(again.comment_id or 0) == ["confused"]
    assert [d.kind for d in deployment.dispatches(1) if d.kind == "spawn"] == ["spawn"]


def test_a_redelivered_comment_gets_its_answer_once(relay: MakeRelay) -> None:
    deployment = relay()
    comment_id = deployment.github.add_comment("the-loop start", number=1, repository=REPO)
    data = comment_payload("the-loop start", comment_id=comment_id)
    sent = deployment.send("issue_comment", data, comment_id=comment_id)
    deployment.deliver("issue_comment", data, delivery_id=sent.delivery_id)

    assert len(_answers(deployment, sent.delivery_id)) == 1
    assert deployment.reactions(comment_id) == ["confused"]


def test_an_unlisted_login_gets_no_answer(relay: MakeRelay) -> None:
    """Strangers are not talked to: a typo in authorizedUsers stays silent on GitHub."""
    deployment = relay()
    deployment.start()
    stranger = deployment.comment("Are you there?", author="octocatt")

    assert deployment.ledger(stranger.delivery_id).outcome == "refused:unauthorized-actor"
    assert _answers(deployment, stranger.delivery_id) == []
    assert deployment.reactions(stranger.comment_id or 0) == []


def test_with_answer_strangers_an_unlisted_login_is_answered_once(relay: MakeRelay) -> None:
    deployment = relay(answer_strangers=True)
    deployment.start()
    stranger = deployment.comment("Are you there?", author="octocatt")
    version = deployment.must_item().version
    data = comment_payload("Are you there?", comment_id=stranger.comment_id or 0, author="octocatt")
    deployment.deliver("issue_comment", data, delivery_id=stranger.delivery_id)  # redelivered

    assert deployment.ledger(stranger.delivery_id).outcome == "refused:unauthorized-actor"
    assert _answers(deployment, stranger.delivery_id) == [NOT_AUTHORIZED]
    assert deployment.reactions(stranger.comment_id or 0) == ["confused"]
    assert deployment.must_item().version == version  # a refusal writes nothing
