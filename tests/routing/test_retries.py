"""The router when the queue retries a delivery whose first attempt already saved its work item.

The worker can die after the work item and its dispatches were saved but before the ledger
settled (found by ``tests/faults/test_worker_faults.py``). Here the settle fails once with
``Transient`` (the worker answers 503 and the record stays open), which leaves the same state
behind; the queue's retry then runs the handler again on a work item it already moved. The
retry must report what the first attempt did, write nothing new, and redo the GitHub effects
the first attempt may not have reached.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from looprelay.errors import Transient
from tests.routing.conftest import (
    AUTO_LABEL,
    REPO,
    MakeRelay,
    Relay,
    comment_payload,
    issue_payload,
    pr_payload,
    ref,
)

ISSUE = ref(1)
PR = ref(2)
GITHUB_ATTEMPTS = 4
"""``GitHubRest``'s attempts per call: scripting this many failures makes the call fail."""


def _settle_fails_once(deployment: Relay, monkeypatch: pytest.MonkeyPatch) -> None:
    store = deployment.backend.store
    real = store.settle_delivery
    failures = [Transient("injected: the worker died before settling")]

    def settle(*args: Any, **kwargs: Any) -> bool:
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "settle_delivery", settle)


def _deliver_twice(
    deployment: Relay, event: str, data: dict[str, Any], delivery_id: str
) -> tuple[int, dict[str, Any]]:
    first = deployment.deliver(event, data, delivery_id=delivery_id)
    assert first[0] == 503
    return deployment.deliver(event, data, delivery_id=delivery_id)


def _kinds(deployment: Relay, delivery_id: str, number: int = 1) -> list[tuple[str, str]]:
    return [(d.kind, d.endpoint) for d in deployment.dispatches(number, delivery_id=delivery_id)]


class TestRetryAfterTheSave:
    def test_a_starting_label_retried_settles_as_dispatched_and_posts_one_checklist(
        self, relay: MakeRelay, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Before the fix the retry decided again on the started item: ``ignored``
        (``already-started``) in the ledger for the delivery that spawned."""
        deployment = relay(control={"require_start_command": False})
        _settle_fails_once(deployment, monkeypatch)
        data = issue_payload("labeled", labels=(AUTO_LABEL,), label=AUTO_LABEL)

        retry = _deliver_twice(deployment, "issues", data, "d-label")

        assert retry == (200, {"status": "settled", "outcome": "dispatched"})
        assert _kinds(deployment, "d-label") == [("spawn", ISSUE)]
        [checklist] = deployment.ours()
        digest = hashlib.sha256(ISSUE.encode()).hexdigest()[:16]
        assert f"kind=checklist id=wi-{digest}" in checklist.body

    def test_a_routed_spawn_retried_is_not_delivered_again(
        self, relay: MakeRelay, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Before the fix the retry found the PR's new session pending and wrote a ``deliver``
        of the same event beside the ``spawn``: the event reached the agent twice."""
        deployment = relay(session_per_pr="always")
        deployment.start()
        deployment.runner_holds(workspace=True)
        _settle_fails_once(deployment, monkeypatch)
        data = pr_payload("synchronize", number=2, body="Closes #1")

        retry = _deliver_twice(deployment, "pull_request", data, "d-pr")

        assert retry == (200, {"status": "settled", "outcome": "dispatched"})
        assert _kinds(deployment, "d-pr") == [("spawn", PR)]

    def test_a_comment_retried_takes_no_second_seq_and_still_gets_its_reaction(
        self, relay: MakeRelay, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Before the fix the retry saved the work item again, taking a second ``seq``."""
        deployment = relay()
        deployment.start()
        before = deployment.must_item()
        _settle_fails_once(deployment, monkeypatch)
        deployment.github.script(GITHUB_ATTEMPTS, match=r"/reactions$", status=502)
        comment_id = deployment.github.add_comment("please fix", repository=REPO)
        data = comment_payload("please fix", comment_id=comment_id)

        retry = _deliver_twice(deployment, "issue_comment", data, "d-comment")

        assert retry == (200, {"status": "settled", "outcome": "dispatched"})
        [deliver] = deployment.dispatches(1, delivery_id="d-comment")
        assert (deliver.kind, deliver.seq) == ("deliver", before.next_seq)
        assert deployment.must_item().next_seq == before.next_seq + 1
        assert deployment.reactions(comment_id) == ["eyes"]
