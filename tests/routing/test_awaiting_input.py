"""A session that asked (``looprelay session ask``) awaits input until a person's comment
reaches it, through the real worker over real HTTP, on each store."""

from __future__ import annotations

from datetime import datetime

from tests.routing.conftest import MakeRelay, Relay, ref


def _asked(deployment: Relay, at: datetime) -> None:
    """What ``session ask`` leaves on the work item's own session."""
    item = deployment.must_item()
    session = item.sessions[ref(1)].model_copy(update={"awaiting_input_at": at})
    saved = item.model_copy(update={"sessions": dict(item.sessions) | {ref(1): session}})
    assert deployment.backend.work_items.save_work_item(saved, expected_version=item.version)


class TestAwaitingInput:
    def test_an_authorized_comment_answers_the_question(self, relay: MakeRelay) -> None:
        deployment = relay()
        deployment.start()
        deployment.runner_holds(workspace=False)
        _asked(deployment, deployment.clock.now())

        sent = deployment.comment("SQLite, please.")

        [deliver] = deployment.dispatches(1, delivery_id=sent.delivery_id)
        assert deliver.kind == "deliver"
        assert deployment.must_item().sessions[ref(1)].awaiting_input_at is None

    def test_a_refused_comment_leaves_it_waiting(self, relay: MakeRelay) -> None:
        deployment = relay()
        deployment.start()
        deployment.runner_holds(workspace=False)
        asked_at = deployment.clock.now()
        _asked(deployment, asked_at)

        sent = deployment.comment("Use MongoDB!", author="mallory")

        assert sent.answer["outcome"].startswith("refused")
        assert deployment.must_item().sessions[ref(1)].awaiting_input_at == asked_at
