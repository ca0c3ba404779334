"""A fork's pull request: no session of its own until an authorized person approves its head.

Each case runs ``decide`` on real payloads (the review comment and ``synchronize`` fixtures of
PR #2, linked to issue #1), edited so the head lives in a fork (another repository id).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from looprelay.core.decision import Decision
from looprelay.core.envelope import Envelope, project_envelope
from looprelay.core.forks import (
    FORK_NOTICE,
    REASON_FORK_NOT_APPROVED,
    REASON_FORK_SESSIONS_OFF,
    ForkSessions,
    observe_head,
)
from looprelay.core.model import PullRequestHead, PullRequestState, WorkItemRecord
from looprelay.core.render import PromptContext, TemplateError, render_prompt
from tests.core.test_decide import (
    NOW,
    POLICY,
    PR_REF,
    REF,
    _decide,
    _envelope,
    _item,
    _session,
    _situation,
)
from tests.samples import commented

FORK_ID = 990001
APPROVED = "a" * 40
PUSHED = "b" * 40
BASE_REF = "master"
OUTSIDER = {"login": "mallory", "id": 424242}


def _forked(data: dict[str, Any], sha: str) -> None:
    head = data["pull_request"]["head"]
    head["repo"]["id"] = FORK_ID
    head["repo"]["full_name"] = "mallory/Hello-World"
    head["sha"] = sha


def _review_comment(body: str = "Thanks, will look later.", *, sha: str = APPROVED) -> Envelope:
    """Codertocat (authorized) comments ``body`` on the fork PR #2, whose head is ``sha``."""

    def edit(data: dict[str, Any]) -> None:
        data["comment"]["body"] = body
        _forked(data, sha)

    return _envelope("pull_request_review_comment.created", edit)


def _push(sha: str) -> Envelope:
    """The fork's author pushes ``sha`` to PR #2 (``synchronize``); not authorized."""

    def edit(data: dict[str, Any]) -> None:
        _forked(data, sha)
        data["sender"].update(OUTSIDER)
        data["pull_request"]["number"] = 2

    return _envelope("pull_request.synchronize", edit, delivery="d-push")


def _fork_item(*sessions: Any, approved: str = "", head: str = APPROVED) -> WorkItemRecord:
    state = PullRequestState(
        fork=True, head_sha=head, base_ref=BASE_REF, approved_sha=approved, approved_by="x"
    )
    return _item(
        "started",
        _session(),
        *sessions,
        pull_requests=[PR_REF],
        pull_request_heads={PR_REF: state},
    )


def _declined(decision: Decision) -> list[object]:
    return [n.data["reason"] for n in decision.notes if n.name == "session.pr_session_declined"]


POLICY_ALWAYS = replace(POLICY, session_per_pr="always")


class TestAnUnapprovedFork:
    def test_a_routine_review_goes_to_the_work_items_session_declined_and_warned(self) -> None:
        situation = _situation(_review_comment(), _fork_item(), pr_checkout_available=True)

        decision = _decide(situation)

        (deliver,) = decision.dispatches
        assert (deliver.kind, deliver.endpoint, deliver.head) == ("deliver", REF, None)
        assert _declined(decision) == [REASON_FORK_NOT_APPROVED]
        assert FORK_NOTICE in deliver.prompt
        # The notice stands above the UNTRUSTED block, as rules do.
        assert deliver.prompt.index(FORK_NOTICE) < deliver.prompt.index("UNTRUSTED")
        assert decision.work_item is not None
        assert set(decision.work_item.sessions) == {REF}

    def test_a_first_sight_of_the_fork_records_it_as_a_fork_and_declines(self) -> None:
        item = _item("started", _session())
        situation = _situation(_review_comment(), item, pr_checkout_available=True)

        decision = _decide(situation, POLICY_ALWAYS)

        assert _declined(decision) == [REASON_FORK_NOT_APPROVED]
        assert decision.work_item is not None
        state = decision.work_item.pull_request_heads[PR_REF]
        assert (state.fork, state.head_sha, state.base_ref, state.approved_sha) == (
            True,
            APPROVED,
            BASE_REF,
            "",
        )

    def test_a_deleted_fork_counts_as_a_fork(self) -> None:
        def edit(data: dict[str, Any]) -> None:
            data["pull_request"]["head"]["repo"] = None

        envelope = _envelope("pull_request_review_comment.created", edit)
        assert envelope.pull_request is not None

        assert observe_head(None, envelope.pull_request).fork is True

    def test_a_same_repository_pull_request_is_trusted_as_it_is(self) -> None:
        envelope = _envelope("pull_request_review_comment.created")
        situation = _situation(envelope, _item("started", _session()), pr_checkout_available=True)

        decision = _decide(situation, POLICY_ALWAYS)

        (spawn,) = decision.dispatches
        assert spawn.endpoint == PR_REF
        assert spawn.head is not None and spawn.head.fork is False
        assert FORK_NOTICE not in spawn.prompt


class TestApproval:
    def test_start_on_the_fork_pr_approves_its_head_and_spawns_its_session_there(self) -> None:
        situation = _situation(
            _review_comment("the-loop start"), _fork_item(), pr_checkout_available=True
        )

        decision = _decide(situation)

        (spawn,) = decision.dispatches
        assert (spawn.kind, spawn.endpoint) == ("spawn", PR_REF)
        assert spawn.head == PullRequestHead(fork=True, sha=APPROVED, base_ref=BASE_REF)
        assert FORK_NOTICE not in spawn.prompt
        assert decision.work_item is not None
        state = decision.work_item.pull_request_heads[PR_REF]
        assert (state.approved_sha, state.approved_by, state.approved_at) == (
            APPROVED,
            "Codertocat",
            NOW,
        )
        approved = next(n for n in decision.notes if n.name == "pull_request.fork_approved")
        assert approved.data == {"pull_request": PR_REF, "sha": APPROVED, "actor": "Codertocat"}
        assert decision.work_item.commands[-1].command == "start"

    def test_start_commented_on_the_fork_pr_approves_it_under_the_default_mode(self) -> None:
        # An issue comment's payload names no head: the recorded one says it is a fork.
        data = commented(2, "Reviewed, go: the-loop start", comment_id=77, on_pull_request=True)
        envelope = project_envelope(
            event="issue_comment", delivery_id="d-7", payload=data, max_text_chars=65536
        )
        situation = _situation(envelope, _fork_item(), pr_checkout_available=True)

        decision = _decide(situation)

        (spawn,) = decision.dispatches
        assert (spawn.kind, spawn.endpoint, spawn.head) == (
            "spawn",
            PR_REF,
            PullRequestHead(fork=True, sha=APPROVED, base_ref=BASE_REF),
        )
        assert "Reviewed, go" in spawn.prompt

    def test_an_approved_head_routes_later_comments_to_the_prs_session(self) -> None:
        item = _fork_item(approved=APPROVED)
        situation = _situation(_review_comment(), item, pr_checkout_available=True)

        (spawn,) = _decide(situation).dispatches

        assert (spawn.endpoint, spawn.head) == (
            PR_REF,
            PullRequestHead(fork=True, sha=APPROVED, base_ref=BASE_REF),
        )

    def test_start_by_an_outsider_approves_nothing(self) -> None:
        def edit(data: dict[str, Any]) -> None:
            data["comment"]["body"] = "the-loop start"
            data["comment"]["user"].update(OUTSIDER)
            data["sender"].update(OUTSIDER)
            _forked(data, APPROVED)

        envelope = _envelope("pull_request_review_comment.created", edit)

        decision = _decide(_situation(envelope, _fork_item(), pr_checkout_available=True))

        assert decision.outcome == "refused:unauthorized-actor"
        assert decision.dispatches == ()
        assert decision.work_item is None or (
            decision.work_item.pull_request_heads[PR_REF].approved_sha == ""
        )

    def test_an_approval_waits_for_the_work_item_to_start(self) -> None:
        item = _fork_item().model_copy(update={"control": "armed"})
        situation = _situation(_review_comment("the-loop start"), item)

        decision = _decide(situation)

        assert (decision.outcome, decision.detail) == ("ignored", "fork-approved; not-started")
        assert decision.work_item is not None
        assert decision.work_item.pull_request_heads[PR_REF].approved_sha == APPROVED

    def test_fork_sessions_off_never_gives_the_fork_a_session(self) -> None:
        policy = replace(POLICY, fork_sessions=ForkSessions.OFF)
        situation = _situation(
            _review_comment("the-loop start"), _fork_item(), pr_checkout_available=True
        )

        decision = _decide(situation, policy)

        assert [(d.kind, d.endpoint) for d in decision.dispatches] == [("deliver", REF)]
        assert _declined(decision) == [REASON_FORK_SESSIONS_OFF]
        assert FORK_NOTICE in decision.dispatches[0].prompt


class TestANewPush:
    def test_the_authors_push_is_refused_but_moves_the_recorded_head(self) -> None:
        item = _fork_item(_session(PR_REF), approved=APPROVED)

        decision = _decide(_situation(_push(PUSHED), item))

        assert decision.outcome == "refused:unauthorized-actor"
        assert decision.dispatches == ()
        assert decision.work_item is not None
        state = decision.work_item.pull_request_heads[PR_REF]
        assert (state.head_sha, state.approved_sha) == (PUSHED, APPROVED)

    def test_after_a_push_events_are_declined_until_approved_again(self) -> None:
        item = _fork_item(_session(PR_REF), approved=APPROVED, head=PUSHED)
        situation = _situation(_review_comment(sha=PUSHED), item, pr_checkout_available=True)

        decision = _decide(situation)

        assert [(d.kind, d.endpoint) for d in decision.dispatches] == [("deliver", REF)]
        assert _declined(decision) == [REASON_FORK_NOT_APPROVED]

    def test_approving_the_new_head_respawns_the_prs_session_there(self) -> None:
        old = PullRequestHead(fork=True, sha=APPROVED, base_ref=BASE_REF)
        live = _session(PR_REF).model_copy(update={"head": old})
        item = _fork_item(live, approved=APPROVED, head=PUSHED)
        situation = _situation(
            _review_comment("the-loop start", sha=PUSHED), item, pr_checkout_available=True
        )

        decision = _decide(situation)

        assert [(d.kind, d.endpoint) for d in decision.dispatches] == [
            ("terminate", PR_REF),
            ("spawn", PR_REF),
        ]
        spawn = decision.dispatches[1]
        assert spawn.head == PullRequestHead(fork=True, sha=PUSHED, base_ref=BASE_REF)
        assert spawn.resume is True


class TestTheNotice:
    def test_an_operator_template_without_the_notice_gets_it_appended(self) -> None:
        context = _context(FORK_NOTICE)

        text = render_prompt(
            "{{ interaction_directive }}\n{{ payload_excerpt }}", context, sandboxed=True
        )

        assert text.rstrip().endswith(FORK_NOTICE)

    def test_a_notice_built_from_data_is_refused(self) -> None:
        with pytest.raises(TemplateError, match="constant"):
            _context(FORK_NOTICE + " and run ./install.sh")


def _context(notice: str) -> PromptContext:
    return PromptContext(
        work_item=REF,
        event="issue_comment",
        action="created",
        repository="codertocat/hello-world",
        delivery_id="d-1",
        interaction_directive=POLICY.interaction.directive,
        graph_context="",
        payload_excerpt="<UNTRUSTED>...</UNTRUSTED>",
        trust_notice=notice,
    )
