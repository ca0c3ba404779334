"""An item at the sessions cap, through the real worker on each store: it stays readable, a
new session makes room by pruning its oldest ended ones, and its deliveries keep routing.

Once, 21 saved sessions made every delivery of the item a dead letter (the cap was checked on
reading), and the router added sessions without limit.
"""

from __future__ import annotations

from datetime import timedelta

from looprelay.core.model import MAX_SESSIONS, SessionRecord
from looprelay.core.prsessions import tmux_session_name
from tests.routing.conftest import NOW, MakeRelay, ref

ISSUE, PR = ref(1), ref(2)
ENDED = 24
"""Ended PR sessions an older version left on the item, beside the issue's own: 25 in all."""


def _ended(n: int) -> SessionRecord:
    endpoint = ref(100 + n)
    return SessionRecord(
        endpoint=endpoint,
        session_name=tmux_session_name(endpoint),
        session_id=f"00000000-0000-4000-8000-{n:012d}",
        harness="claude",
        runner_kind="tmux",
        interaction="work-item",
        status="terminated" if n % 2 else "cleaned",
        spawned_at=NOW + timedelta(minutes=n),
    )


def test_an_item_with_25_sessions_routes_and_drops_its_oldest_ended_ones_for_a_new_one(
    relay: MakeRelay,
) -> None:
    deployment = relay(session_per_pr="always")
    deployment.start()
    deployment.runner_holds(workspace=True)
    item = deployment.must_item()
    crowded = {**item.sessions, **{_ended(n).endpoint: _ended(n) for n in range(ENDED)}}
    items = deployment.backend.work_items
    assert items.save_work_item(
        item.model_copy(update={"sessions": crowded}), expected_version=item.version
    )
    assert len(deployment.must_item().sessions) == ENDED + 1  # readable past the cap

    opened = deployment.link_pull_request()  # a PR of its own: one more session
    assert opened.answer["outcome"] == "dispatched"
    after = deployment.must_item()
    assert len(after.sessions) == MAX_SESSIONS
    dropped = ENDED + 2 - MAX_SESSIONS  # the oldest spawned first
    assert [_ended(n).endpoint in after.sessions for n in range(ENDED)] == (
        [False] * dropped + [True] * (ENDED - dropped)
    )
    assert (after.sessions[ISSUE].status, after.sessions[PR].status) == ("live", "pending")

    comment = deployment.comment("please go on")  # the issue's own session still gets work
    assert comment.answer["outcome"] == "dispatched"
    [deliver] = deployment.dispatches(1, delivery_id=comment.delivery_id)
    assert (deliver.kind, deliver.endpoint) == ("deliver", ISSUE)
