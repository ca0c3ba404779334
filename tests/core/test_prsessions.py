"""Session per pull request: resolving the mode, choosing the endpoint, naming tmux sessions."""

from __future__ import annotations

import re
from typing import Any

import pytest

from looprelay.core.envelope import Envelope, project_envelope
from looprelay.core.prsessions import (
    DEFAULT_SESSION_PER_PR,
    REASON_NEVER,
    REASON_NO_PULL_REQUEST,
    REASON_NO_SEPARATE_CHECKOUT,
    REASON_NOT_TAKEN,
    REASON_OWN_SESSION,
    REASON_PULL_REQUEST_IS_WORK_ITEM,
    REASON_SAME_REPOSITORY,
    SESSION_PER_PR_MODES,
    TMUX_NAME_MAX_CHARS,
    EndpointChoice,
    SessionPerPr,
    choose_endpoint,
    effective_session_per_pr,
    is_cross_repository,
    resolve_session_per_pr,
    session_slug,
    tmux_session_name,
)
from tests.samples import payload

WORK_ITEM = "github:Codertocat/Hello-World#1"
WORK_ITEM_REPO = "Codertocat/Hello-World"
PR_REF = "github:Codertocat/Hello-World#2"
TMUX_SAFE = re.compile(r"^loop-[A-Za-z0-9_-]+$")


def _pr_envelope(head_repo: str | None = None) -> Envelope:
    body = payload("pull_request.opened")
    if head_repo is not None:
        body["pull_request"]["head"]["repo"]["full_name"] = head_repo
    return project_envelope(
        event="pull_request", delivery_id="d-1", payload=body, max_text_chars=65536
    )


def _choose(mode: SessionPerPr, envelope: Envelope, **overrides: Any) -> EndpointChoice:
    pr = envelope.pull_request
    assert pr is not None
    arguments: dict[str, Any] = {
        "mode": mode,
        "work_item_ref": WORK_ITEM,
        "work_item_repository": WORK_ITEM_REPO,
        "pr_ref": PR_REF,
        "pr_head_repository": pr.head_repo,
        "pr_base_repository": pr.base_repo,
        "pr_checkout_available": True,
    }
    arguments.update(overrides)
    return choose_endpoint(**arguments)


class TestResolveSessionPerPr:
    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            ("never", "never"),
            ("cross-repository", "cross-repository"),
            ("always", "always"),
            ("  ALWAYS ", "always"),
            ("Never", "never"),
            ("Cross-Repository\n", "cross-repository"),
            (True, "cross-repository"),
            (False, "never"),
            (None, "cross-repository"),
        ],
    )
    def test_a_declared_value_resolves_silently(self, raw: object, expected: str) -> None:
        assert resolve_session_per_pr(raw) == (expected, None)

    @pytest.mark.parametrize(
        "raw",
        ["sometimes", "", "   ", "3", "cross repository", 3, 0, 1, 1.5, [], ["always"], {"a": 1}],
    )
    def test_junk_warns_and_means_cross_repository_never_the_widest(self, raw: object) -> None:
        mode, warning = resolve_session_per_pr(raw)
        assert mode == "cross-repository"
        assert warning is not None
        assert repr(raw) in warning
        assert all(name in warning for name in SESSION_PER_PR_MODES)

    def test_the_warning_caps_a_huge_value(self) -> None:
        _, warning = resolve_session_per_pr("x" * 100_000)
        assert warning is not None and len(warning) < 300

    def test_the_shipped_default_is_cross_repository(self) -> None:
        assert DEFAULT_SESSION_PER_PR == "cross-repository"


class TestEffectiveSessionPerPr:
    @pytest.mark.parametrize("frozen", SESSION_PER_PR_MODES)
    @pytest.mark.parametrize("default", SESSION_PER_PR_MODES)
    def test_the_work_items_frozen_choice_wins(
        self, frozen: SessionPerPr, default: SessionPerPr
    ) -> None:
        assert effective_session_per_pr(frozen, operator_default=default) == frozen

    @pytest.mark.parametrize("frozen", [None, "sometimes", "", 3, True, "ALWAYS", " never"])
    def test_no_usable_choice_routes_by_the_operators_default(self, frozen: object) -> None:
        assert effective_session_per_pr(frozen, operator_default="always") == "always"

    def test_one_work_items_choice_does_not_move_another_ones(self) -> None:
        chose_never = effective_session_per_pr("never", operator_default="cross-repository")
        never_answered = effective_session_per_pr(None, operator_default="cross-repository")
        assert (chose_never, never_answered) == ("never", "cross-repository")


class TestIsCrossRepository:
    @pytest.mark.parametrize(
        ("head", "base", "expected"),
        [
            ("Codertocat/Hello-World", "Codertocat/Hello-World", False),
            ("codertocat/hello-world", "CODERTOCAT/HELLO-WORLD", False),
            ("fork/Hello-World", "Codertocat/Hello-World", True),
            ("Codertocat/Hello-World", "upstream/Hello-World", True),
            (None, "Codertocat/Hello-World", False),
            (None, "upstream/Hello-World", True),
            (None, None, False),
        ],
    )
    def test_either_side_elsewhere_makes_the_pr_cross_repository(
        self, head: str | None, base: str | None, expected: bool
    ) -> None:
        crosses = is_cross_repository(
            work_item_repository=WORK_ITEM_REPO, pr_head_repository=head, pr_base_repository=base
        )
        assert crosses is expected


class TestChooseEndpoint:
    @pytest.mark.parametrize(
        ("mode", "head_repo", "endpoint", "reason"),
        [
            ("never", None, "work-item", REASON_NEVER),
            ("never", "fork/Hello-World", "work-item", REASON_NEVER),
            ("cross-repository", None, "work-item", REASON_SAME_REPOSITORY),
            ("cross-repository", "fork/Hello-World", "pull-request", REASON_OWN_SESSION),
            ("always", None, "pull-request", REASON_OWN_SESSION),
            ("always", "fork/Hello-World", "pull-request", REASON_OWN_SESSION),
        ],
    )
    def test_the_operator_chooses_which_pull_requests_get_their_own_session(
        self, mode: SessionPerPr, head_repo: str | None, endpoint: str, reason: str
    ) -> None:
        choice = _choose(mode, _pr_envelope(head_repo))
        assert (choice.endpoint, choice.reason, choice.declined) == (endpoint, reason, False)
        assert choice.ref == (PR_REF if endpoint == "pull-request" else WORK_ITEM)

    @pytest.mark.parametrize("mode", ["cross-repository", "always"])
    def test_a_candidate_without_its_own_checkout_is_declined_into_the_work_item(
        self, mode: SessionPerPr
    ) -> None:
        choice = _choose(mode, _pr_envelope("fork/Hello-World"), pr_checkout_available=False)
        assert choice == EndpointChoice("work-item", WORK_ITEM, REASON_NO_SEPARATE_CHECKOUT, True)

    def test_a_candidate_whose_own_session_no_runner_took_falls_back_to_the_work_item(
        self,
    ) -> None:
        choice = _choose("always", _pr_envelope(), pr_session_stuck=True)
        assert choice == EndpointChoice("work-item", WORK_ITEM, REASON_NOT_TAKEN, True)
        no_checkout = _choose(
            "always", _pr_envelope(), pr_session_stuck=True, pr_checkout_available=False
        )
        assert no_checkout.reason == REASON_NO_SEPARATE_CHECKOUT
        never = _choose("never", _pr_envelope(), pr_session_stuck=True)
        assert (never.reason, never.declined) == (REASON_NEVER, False)

    def test_a_non_candidate_is_never_declined_even_without_a_checkout(self) -> None:
        choice = _choose("cross-repository", _pr_envelope(), pr_checkout_available=False)
        assert (choice.endpoint, choice.declined) == ("work-item", False)

    @pytest.mark.parametrize("mode", SESSION_PER_PR_MODES)
    def test_an_event_without_a_pull_request_goes_to_the_work_item(
        self, mode: SessionPerPr
    ) -> None:
        choice = _choose(mode, _pr_envelope("fork/Hello-World"), pr_ref=None)
        assert choice == EndpointChoice("work-item", WORK_ITEM, REASON_NO_PULL_REQUEST)

    @pytest.mark.parametrize("mode", SESSION_PER_PR_MODES)
    def test_a_pull_request_that_is_the_work_item_keeps_its_session(
        self, mode: SessionPerPr
    ) -> None:
        choice = _choose(
            mode, _pr_envelope("fork/Hello-World"), pr_ref=WORK_ITEM, pr_is_work_item=True
        )
        assert choice == EndpointChoice("work-item", WORK_ITEM, REASON_PULL_REQUEST_IS_WORK_ITEM)


class TestSessionSlug:
    @pytest.mark.parametrize(
        ("ref", "name"),
        [
            ("github:octo/repo#15", "loop-github-octo-repo-15"),
            ("github:Octo_Cat/repo_2#7", "loop-github-Octo_Cat-repo_2-7"),
        ],
    )
    def test_a_plain_ref_keeps_a_readable_name_without_a_hash(self, ref: str, name: str) -> None:
        assert tmux_session_name(ref) == name

    @pytest.mark.parametrize(
        ("ref", "readable"),
        [
            ("github:Codertocat/Hello-World#2", "loop-github-Codertocat-Hello-World-2-"),
            ("github:octo/my.repo#1", "loop-github-octo-my-repo-1-"),
            ("github:ghe.example.com/octo/repo#1", "loop-github-ghe-example-com-octo-repo-1-"),
            ("--dangerously-skip-permissions", "loop-dangerously-skip-permissions-"),
        ],
    )
    def test_a_lossy_rewrite_gets_a_hash_suffix(self, ref: str, readable: str) -> None:
        name = tmux_session_name(ref)
        assert name.startswith(readable)
        assert re.fullmatch(r"[0-9a-f]{8}", name.removeprefix(readable))

    @pytest.mark.parametrize(
        "ref",
        [
            "github:octo/repo#15",
            "--dangerously-skip-permissions",
            "-t",
            "github:a:b.c/d#e f\tg\nh;i$j`k'l\"m",
            "github:ÅÄÖ/日本#1",
            "....",
            "#",
            "github:" + "a" * 500 + "/b#1",
            "x" * 10_000,
        ],
    )
    def test_the_name_is_safe_for_tmux_and_never_looks_like_a_flag(self, ref: str) -> None:
        name = tmux_session_name(ref)
        assert TMUX_SAFE.fullmatch(name)
        assert len(name) <= TMUX_NAME_MAX_CHARS
        assert not session_slug(ref).startswith("-")
        assert tmux_session_name(ref) == name

    @pytest.mark.parametrize(
        ("one", "other"),
        [
            ("github:octo/my.repo#1", "github:octo/my-repo#1"),
            ("github:o-a/b#1", "github:o/a-b#1"),
            ("github:" + "a" * 200 + "/x#1", "github:" + "a" * 200 + "/y#1"),
        ],
    )
    def test_refs_that_rewrite_alike_still_get_different_names(self, one: str, other: str) -> None:
        assert tmux_session_name(one) != tmux_session_name(other)

    def test_a_ref_with_nothing_readable_is_just_its_hash(self) -> None:
        assert re.fullmatch(r"loop-[0-9a-f]{8}", tmux_session_name("#::/"))

    def test_an_empty_ref_is_refused(self) -> None:
        with pytest.raises(ValueError, match="non-empty"):
            session_slug("")
