"""``routing.harnessLabels``: a label on the issue picks the coding agent of its new sessions,
the session keeps it for every later event, and only a runner that runs it may take the work
(both stores, through the real worker)."""

from __future__ import annotations

from looprelay.core.model import DispatchRecord, RunnerRecord
from looprelay.core.scheduling import why_not
from tests.routing.conftest import NOW, REPO, MakeRelay, Relay, ref

LABELS = {"agent: codex": "codex", "agent: gemini": "gemini"}


def _runner(runner_id: str, *harnesses: str) -> RunnerRecord:
    return RunnerRecord(
        runner_id=runner_id,
        name=runner_id,
        secret_hash="sha256:unused",
        registered_at=NOW,
        repositories=[REPO],
        harnesses=list(harnesses),
    )


def _spawn_of_issue_labelled_codex(relay: MakeRelay) -> tuple[Relay, DispatchRecord]:
    deployment = relay(harness_labels=LABELS)
    deployment.given_armed()
    start = deployment.comment("the-loop start", labels=("agent: codex",))
    [spawn] = deployment.dispatches(delivery_id=start.delivery_id)
    return deployment, spawn


class TestHarnessLabels:
    def test_a_labelled_issue_gets_that_harness_and_keeps_it_for_later_comments(
        self, relay: MakeRelay
    ) -> None:
        deployment, spawn = _spawn_of_issue_labelled_codex(relay)
        assert (spawn.kind, spawn.harness) == ("spawn", "codex")
        assert deployment.must_item().sessions[ref(1)].harness == "codex"

        # The label comes off; the session still runs Codex, and so does the next turn.
        later = deployment.comment("Also fix the second typo.")
        [deliver] = deployment.dispatches(delivery_id=later.delivery_id)
        assert (deliver.kind, deliver.harness) == ("deliver", "codex")

    def test_an_unlabelled_issue_gets_the_configured_harness(self, relay: MakeRelay) -> None:
        deployment = relay(harness_labels=LABELS, harness="gemini")
        deployment.given_armed()
        start = deployment.comment("the-loop start", labels=("bug",))
        [spawn] = deployment.dispatches(delivery_id=start.delivery_id)
        assert spawn.harness == "gemini"

    def test_a_runner_without_the_harness_is_never_given_the_work_and_is_told_why(
        self, relay: MakeRelay
    ) -> None:
        _, spawn = _spawn_of_issue_labelled_codex(relay)
        claude_only = _runner("r-claude", "claude")
        codex_box = _runner("r-codex", "codex", "claude")
        live = [claude_only.runner_id, codex_box.runner_id]
        assert why_not(spawn, claude_only, live=live, holding=()) == "harness-missing:codex"
        assert why_not(spawn, codex_box, live=live, holding=()) is None
