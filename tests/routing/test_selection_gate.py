"""The phase selection is a gate the session sees: its first prompt says the selection is
pending and what to do meanwhile, the checklist says what `execute` does, and the frozen
selection arrives as a message of its own (on each store)."""

from __future__ import annotations

from looprelay.config.model import DEFAULT_PHASES
from looprelay.core.plan import SELECTION_PENDING
from tests.routing.conftest import MakeRelay


def test_the_session_waits_for_the_selection_until_execute_freezes_it(relay: MakeRelay) -> None:
    deployment = relay()
    spawn = deployment.start()

    assert SELECTION_PENDING in spawn.prompt
    assert "as the process selection below allows" in spawn.prompt
    [checklist] = deployment.ours()
    assert "reply with `the-loop execute` to freeze the choice" in checklist.body
    assert "to start" not in checklist.body  # `start` already started the session

    sent = deployment.comment("the-loop execute")
    [frozen] = deployment.dispatches(1, delivery_id=sent.delivery_id)
    assert frozen.kind == "deliver"
    assert "## Frozen process selection" in frozen.prompt
    assert SELECTION_PENDING not in frozen.prompt


def test_the_opt_in_design_critic_review_is_listed_right_after_the_design() -> None:
    tokens = [token for token, _, _ in DEFAULT_PHASES]
    assert tokens.index("design-critic-review") == tokens.index("design") + 1
