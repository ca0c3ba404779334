"""Work-item refs, which work items an event names, and how a PR links to issues."""

from __future__ import annotations

import time
from typing import Any

import pytest

from looprelay.core.envelope import Envelope, project_envelope
from looprelay.core.workitems import (
    MAX_FOUND_LINKS,
    Link,
    LinkSource,
    WorkItemRef,
    WorkItems,
    branch_issue,
    closing_references,
    merge_links,
    parse_ref,
    repository_ref,
    work_items,
)
from tests.samples import payload

HELLO = "codertocat/hello-world"


def _envelope(event: str, body: dict[str, Any]) -> Envelope:
    return project_envelope(event=event, delivery_id="d-1", payload=body, max_text_chars=65536)


def _ref(number: int, repository: str = HELLO) -> WorkItemRef:
    owner, repo = repository.split("/")
    return WorkItemRef(owner, repo, number)


def _pr(body_text: str | None = None, head_ref: str | None = None, **head_repo: Any) -> Envelope:
    body = payload("pull_request.opened")
    if body_text is not None:
        body["pull_request"]["body"] = body_text
    if head_ref is not None:
        body["pull_request"]["head"]["ref"] = head_ref
    if "full_name" in head_repo:
        body["pull_request"]["head"]["repo"]["full_name"] = head_repo["full_name"]
    if head_repo.get("deleted"):
        body["pull_request"]["head"]["repo"] = None
    return _envelope("pull_request", body)


class TestParseRef:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("github:octo/repo#15", WorkItemRef("octo", "repo", 15)),
            ("github:Octo/Repo.js#1", WorkItemRef("octo", "repo.js", 1)),
            (
                "github:ghe.example.com/octo/repo#15",
                WorkItemRef("octo", "repo", 15, "ghe.example.com"),
            ),
            (
                "github:ghe.example.com:8443/o/r_2#2",
                WorkItemRef("o", "r_2", 2, "ghe.example.com:8443"),
            ),
            ("github:github.com/octo/repo#15", WorkItemRef("octo", "repo", 15)),
        ],
    )
    def test_parses_a_ref_with_or_without_a_host(self, text: str, expected: WorkItemRef) -> None:
        assert parse_ref(text) == expected

    @pytest.mark.parametrize(
        "text",
        ["github:octo/repo#15", "github:ghe.example.com/octo/repo#15", "github:a-b/c.d_e-f#2"],
    )
    def test_format_is_the_inverse_of_parse(self, text: str) -> None:
        assert parse_ref(text).format() == text
        assert str(parse_ref(text)) == text

    def test_the_host_is_written_only_off_github_com(self) -> None:
        assert WorkItemRef("octo", "repo", 1, "GitHub.com").format() == "github:octo/repo#1"

    @pytest.mark.parametrize(
        "junk",
        [
            "",
            "octo/repo#15",
            "gitlab:octo/repo#15",
            "github:octo/repo",
            "github:octo/repo#0",
            "github:octo/repo#-1",
            "github:octo/repo#015",
            "github:octo/repo#12345678901",
            "github:octo#15",
            "github:/repo#1",
            "github:octo/repo#15 ",
            "github:octo/..#1",
            "github:-octo/repo#1",
            "github:a/b/c/d#1",
            "github:octo/repo#\uff11\uff15",  # fullwidth digits
            "github:\u043ecto/repo#1",  # Cyrillic o
            "github:octo/re po#1",
        ],
    )
    def test_junk_raises_a_value_error_naming_the_expected_shape(self, junk: str) -> None:
        with pytest.raises(ValueError, match="expected github:owner/repo#N"):
            parse_ref(junk)

    @pytest.mark.parametrize(
        ("owner", "repo", "number", "host"),
        [("", "r", 1, "github.com"), ("o", "r", 0, "github.com"), ("o/x", "r", 1, "github.com")],
    )
    def test_a_malformed_value_cannot_be_built(
        self, owner: str, repo: str, number: int, host: str
    ) -> None:
        with pytest.raises(ValueError, match="not a GitHub issue or pull request reference"):
            WorkItemRef(owner, repo, number, host)

    def test_same_repository_compares_host_owner_and_repo(self) -> None:
        assert _ref(1).same_repository(_ref(2))
        assert not _ref(1).same_repository(_ref(1, "other/lib"))
        assert not _ref(1).same_repository(WorkItemRef("codertocat", "hello-world", 1, "ghe.io"))


class TestRepositoryRef:
    @pytest.mark.parametrize(
        ("repository", "number"),
        [("Codertocat", 1), ("a/b/c", 1), ("octo/..", 1), ("octo/repo", 0), ("", 3)],
    )
    def test_a_malformed_repository_or_number_names_nothing(
        self, repository: str, number: int
    ) -> None:
        assert repository_ref(repository, number) is None

    def test_names_are_kept_in_lower_case(self) -> None:
        assert repository_ref("Codertocat/Hello-World", 4) == _ref(4)


class TestBranchIssue:
    @pytest.mark.parametrize(
        ("branch", "expected"),
        [
            ("issue-15", 15),
            ("issue-15-login-form", 15),
            ("feature/ISSUE-7", 7),
            ("issue/9", 9),
            ("fix_issue-4", 4),
            ("tissue-3", None),
            ("reissue-3", None),
            ("issues-3", None),
            ("issue-0", None),
            ("issue-", None),
            ("issue_5", None),
            ("issue-\uff11\uff12", None),  # fullwidth digits
            ("changes", None),
            (None, None),
        ],
    )
    def test_reads_issue_n_from_a_branch_name(
        self, branch: str | None, expected: int | None
    ) -> None:
        assert branch_issue(branch) == expected


KEYWORDS = ["close", "closes", "closed", "fix", "fixes", "fixed", "resolve", "resolves", "resolved"]


class TestClosingReferences:
    @pytest.mark.parametrize("keyword", KEYWORDS + [k.upper() for k in KEYWORDS] + ["Fixes"])
    @pytest.mark.parametrize(
        ("reference", "expected"),
        [
            ("#12", _ref(12)),
            ("GH-12", _ref(12)),
            ("other/lib#12", _ref(12, "other/lib")),
            ("https://github.com/other/lib/issues/12", _ref(12, "other/lib")),
        ],
    )
    def test_every_keyword_and_form_names_an_issue(
        self, keyword: str, reference: str, expected: WorkItemRef
    ) -> None:
        body = f"This PR {keyword} {reference}."
        assert closing_references(body, repository=HELLO) == (expected,)

    @pytest.mark.parametrize(
        "body",
        [
            "Fixes: #12",
            "fixes:#12",
            "(fixes #12)",
            "Closes #12, and more",
            "resolved\t#12",
            "- [x] closes #12",
        ],
    )
    def test_punctuation_around_a_reference(self, body: str) -> None:
        assert closing_references(body, repository=HELLO) == (_ref(12),)

    @pytest.mark.parametrize(
        "body",
        [
            "fixes#12",
            "prefixes #12",
            "fixes #12abc",
            "fixes #\uff11\uff12",  # fullwidth digits
            "F\u0456xes #12",  # Cyrillic i
            "clo\u017fes #12",  # long s folds to "s" under Unicode IGNORECASE
            "fixes\n#12",
            "fixes #0",
            "fixes https://evil.example/codertocat/hello-world/issues/12",
            "fixes https://github.com/other/lib/pull/12",
            "mentions #12 without a keyword",
        ],
    )
    def test_near_misses_name_nothing(self, body: str) -> None:
        assert closing_references(body, repository=HELLO) == ()

    def test_an_enterprise_url_counts_on_its_own_host(self) -> None:
        body = "fixes https://GHE.example.com/o/r/issues/3"
        refs = closing_references(body, repository="o/r", host="ghe.example.com")
        assert refs == (WorkItemRef("o", "r", 3, "ghe.example.com"),)
        assert closing_references(body, repository="o/r") == ()

    def test_order_of_appearance_without_repeats(self) -> None:
        body = "Fixes #3, fixes #2 and closes #3"
        assert closing_references(body, repository=HELLO) == (_ref(3), _ref(2))

    def test_a_200000_character_body_stays_fast(self) -> None:
        body = ("fix " * 25_000) + (" " * 50_000) + ("x" * 50_000) + " closes #9"
        started = time.perf_counter()
        refs = closing_references(body, repository=HELLO)
        assert refs == (_ref(9),)
        assert time.perf_counter() - started < 1.0


class TestWorkItems:
    @pytest.mark.parametrize("name", ["issues.opened", "issues.labeled", "issue_comment.created"])
    def test_an_issue_event_names_the_issue(self, name: str) -> None:
        items = work_items(_envelope(name.partition(".")[0], payload(name)), recorded={_ref(5)})
        assert items == WorkItems(own=(_ref(1),))

    def test_a_comment_on_a_pull_request_names_the_pr_and_its_recorded_links(self) -> None:
        body = payload("issue_comment.created")
        body["issue"]["pull_request"] = {"url": "https://api.github.com/repos/o/r/pulls/1"}
        items = work_items(_envelope("issue_comment", body), recorded={_ref(7)})
        assert items.own == (_ref(1),)
        assert items.linked == (Link(_ref(7), frozenset({LinkSource.RECORDED})),)

    def test_a_plain_pull_request_names_itself_only(self) -> None:
        assert work_items(_pr()) == WorkItems(own=(_ref(2),))

    def test_a_closing_keyword_links_the_issue(self) -> None:
        items = work_items(_pr("Fixes #12"))
        assert items.own == (_ref(2),)
        assert items.linked == (Link(_ref(12), frozenset({LinkSource.KEYWORD})),)
        assert items.refs == (_ref(12), _ref(2))

    def test_a_same_repository_branch_links_the_issue_weakly(self) -> None:
        items = work_items(_pr(head_ref="issue-7-login"))
        assert items.linked == (Link(_ref(7), frozenset({LinkSource.BRANCH})),)
        assert items.linked[0].weak

    @pytest.mark.parametrize(
        "head",
        [{"full_name": "forker/Hello-World"}, {"deleted": True}],
        ids=["fork", "deleted-fork"],
    )
    def test_a_cross_repository_branch_name_links_nothing(self, head: dict[str, Any]) -> None:
        assert work_items(_pr(head_ref="issue-7", **head)).linked == ()

    def test_the_head_repository_is_compared_case_insensitively(self) -> None:
        items = work_items(_pr(head_ref="issue-7", full_name="CODERTOCAT/hello-world"))
        assert items.linked_refs == (_ref(7),)

    def test_sources_merge_in_priority_order(self) -> None:
        items = work_items(
            _pr("Closes #9 and closes #7", head_ref="issue-7"), recorded={_ref(4), _ref(9)}
        )
        assert items.linked == (
            Link(_ref(7), frozenset({LinkSource.BRANCH, LinkSource.KEYWORD})),
            Link(_ref(9), frozenset({LinkSource.KEYWORD, LinkSource.RECORDED})),
            Link(_ref(4), frozenset({LinkSource.RECORDED})),
        )
        assert not items.linked[0].weak

    def test_a_pr_body_naming_another_repositorys_issue_links_there(self) -> None:
        items = work_items(_pr("Fixes other/lib#3"))
        assert items.linked == (
            Link(_ref(3, "other/lib"), frozenset({LinkSource.KEYWORD}), cross_repository=True),
        )
        assert _ref(3) not in items.refs

    def test_a_qualified_reference_to_this_repository_is_not_cross_repository(self) -> None:
        items = work_items(_pr("Fixes CODERTOCAT/Hello-World#5"))
        assert items.linked == (Link(_ref(5), frozenset({LinkSource.KEYWORD})),)

    def test_a_pr_never_links_to_itself(self) -> None:
        items = work_items(_pr("Fixes #2", head_ref="issue-2"), recorded={_ref(2)})
        assert items == WorkItems(own=(_ref(2),))

    def test_one_body_links_at_most_a_bounded_number_of_issues(self) -> None:
        body = " ".join(f"fixes #{n}" for n in range(3, 60))
        items = work_items(_pr(body), recorded={_ref(100)})
        assert len(items.linked) == MAX_FOUND_LINKS + 1
        assert items.linked[-1].ref == _ref(100)

    @pytest.mark.parametrize(
        ("event", "name"),
        [
            ("pull_request_review", "pull_request_review.submitted"),
            ("pull_request_review_comment", "pull_request_review_comment.created"),
            ("pull_request", "pull_request.closed"),
            ("pull_request", "pull_request.synchronize"),
        ],
    )
    def test_pr_shaped_events_name_the_pr_and_its_links(self, event: str, name: str) -> None:
        body = payload(name)
        body["pull_request"]["body"] = "Resolves #30"
        items = work_items(_envelope(event, body))
        assert (items.own, items.linked_refs) == ((_ref(2),), (_ref(30),))

    def test_a_ci_event_names_its_pull_requests_and_their_recorded_links(self) -> None:
        items = work_items(
            _envelope("check_run", payload("check_run.completed")), recorded={_ref(8)}
        )
        assert items.own == (_ref(2),)
        assert items.linked_refs == (_ref(8),)

    def test_a_ci_event_for_several_prs_names_each_once(self) -> None:
        body = payload("check_run.completed")
        prs = body["check_run"]["pull_requests"]
        prs.extend([dict(prs[0], number=3), dict(prs[0])])
        items = work_items(_envelope("check_run", body))
        assert items.own == (_ref(2), _ref(3))

    @pytest.mark.parametrize(
        ("event", "name"),
        [
            ("installation", "installation.created"),
            ("installation_repositories", "installation_repositories.added"),
            ("push", "push"),
            ("ping", "ping"),
        ],
    )
    def test_other_events_name_nothing(self, event: str, name: str) -> None:
        assert work_items(_envelope(event, payload(name))) == WorkItems()

    def test_a_malformed_repository_name_names_nothing(self) -> None:
        body = payload("issues.opened")
        body["repository"]["full_name"] = "no-slash"
        assert work_items(_envelope("issues", body)) == WorkItems()

    def test_a_malformed_host_is_a_configuration_error(self) -> None:
        with pytest.raises(ValueError, match="not a GitHub issue or pull request reference"):
            work_items(_pr(), host="ghe example")

    def test_an_enterprise_host_is_written_into_every_ref(self) -> None:
        items = work_items(_pr("Fixes #12"), host="ghe.example.com")
        assert [str(ref) for ref in items.refs] == [
            "github:ghe.example.com/codertocat/hello-world#12",
            "github:ghe.example.com/codertocat/hello-world#2",
        ]


class TestMergeLinks:
    def test_adds_new_links_and_never_drops_recorded_ones(self) -> None:
        found = work_items(_pr("Fixes #12")).linked
        assert merge_links({_ref(4)}, found) == {_ref(4), _ref(12)}

    def test_a_pr_whose_link_was_edited_out_stays_linked(self) -> None:
        recorded = merge_links(frozenset(), work_items(_pr("Fixes #12")).linked)
        later = work_items(_pr("no keyword any more"), recorded=recorded)
        assert later.linked_refs == (_ref(12),)
        assert merge_links(recorded, later.linked) == recorded
