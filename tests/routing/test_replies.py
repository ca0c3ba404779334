"""A headless turn's reply never reaches a session again (SPEC §2 loop prevention).

With token auth (``github.tokenEnv``) looprelay posts as the operator's own login, which is
often an authorized user and not a bot login: the marker alone must keep the reply out.
"""

from __future__ import annotations

import pytest

from looprelay.core.markers import mark
from looprelay.core.replies import REPLY_MARKER_KIND, failure_note, reply_body
from tests.routing.conftest import MAX_TEXT_CHARS, MakeRelay

DISPATCH_ID = "dp-" + "a" * 32


@pytest.mark.parametrize(
    "text",
    [
        reply_body("the-loop stop\n\nDone. " + "x" * (MAX_TEXT_CHARS + 500)),
        failure_note("claude", "Not logged in · Please run /login"),
    ],
    ids=["answer-longer-than-the-text-cap", "failure-note"],
)
def test_a_reply_under_an_authorized_login_is_dropped_as_self_marked(
    relay: MakeRelay, text: str
) -> None:
    deployment = relay()
    deployment.start(1)
    body = mark(text, kind=REPLY_MARKER_KIND, id=DISPATCH_ID)

    sent = deployment.comment(body, author="Codertocat", number=1)

    record = deployment.ledger(sent.delivery_id)
    assert (record.outcome, record.detail) == ("ignored", "dropped:self-marked")
    assert deployment.dispatches(1, delivery_id=sent.delivery_id) == []
    assert deployment.must_item().control == "started"
    unmarked = deployment.comment(text, author="Codertocat", number=1)
    assert deployment.ledger(unmarked.delivery_id).outcome == "dispatched"  # the marker mattered
