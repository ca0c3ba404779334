"""Projecting real payloads into the slim envelope the worker receives."""

from __future__ import annotations

import json
from typing import Any

import pytest

from looprelay.core.envelope import project_envelope
from tests.samples import payload

CAP = 1_000


def _project(event: str, body: dict[str, Any], cap: int = CAP) -> Any:
    return project_envelope(event=event, delivery_id="d-1", payload=body, max_text_chars=cap)


class TestProjectEnvelope:
    def test_issue_comment_keeps_what_the_worker_needs(self) -> None:
        envelope = _project("issue_comment", payload("issue_comment.created"))
        assert (envelope.event, envelope.action, envelope.delivery_id) == (
            "issue_comment",
            "created",
            "d-1",
        )
        assert envelope.repository is not None
        assert envelope.repository.full_name == "Codertocat/Hello-World"
        assert envelope.sender is not None and envelope.sender.login == "Codertocat"
        assert envelope.issue is not None
        assert (envelope.issue.number, envelope.issue.labels) == (1, ["bug"])
        assert not envelope.issue.is_pull_request
        assert envelope.comment is not None and envelope.comment.id == 492700400
        assert envelope.comment.body.startswith("You are totally right!")
        assert envelope.truncated == []

    def test_a_comment_on_a_pull_request_is_marked_as_such(self) -> None:
        body = payload("issue_comment.created")
        body["issue"]["pull_request"] = {"url": "https://api.github.com/repos/o/r/pulls/1"}
        envelope = _project("issue_comment", body)
        assert envelope.issue is not None and envelope.issue.is_pull_request

    def test_pull_request_records_where_its_head_lives(self) -> None:
        envelope = _project("pull_request", payload("pull_request.opened"))
        pr = envelope.pull_request
        assert pr is not None
        assert (pr.number, pr.head_ref, pr.head_repo, pr.base_repo) == (
            2,
            "changes",
            "Codertocat/Hello-World",
            "Codertocat/Hello-World",
        )
        assert pr.body.startswith("This is a pretty simple change")

    def test_a_review_becomes_the_comment_with_its_state(self) -> None:
        envelope = _project("pull_request_review", payload("pull_request_review.submitted"))
        assert envelope.comment is not None
        assert (envelope.comment.id, envelope.comment.review_state) == (237895671, "commented")
        assert envelope.pull_request is not None and envelope.pull_request.number == 2

    def test_review_comment(self) -> None:
        envelope = _project(
            "pull_request_review_comment", payload("pull_request_review_comment.created")
        )
        assert envelope.comment is not None and envelope.comment.id == 284312630
        assert envelope.comment.review_state is None

    def test_labeled_issue_names_the_label(self) -> None:
        assert _project("issues", payload("issues.labeled")).label == "bug"

    def test_check_run_names_its_pull_requests(self) -> None:
        check = _project("check_run", payload("check_run.completed")).check
        assert check is not None
        assert (check.name, check.conclusion, check.pull_requests) == (
            "Octocoders-linter",
            "failure",
            [2],
        )

    def test_installation_repositories(self) -> None:
        envelope = _project("installation_repositories", payload("installation_repositories.added"))
        assert envelope.repositories_added == ["Codertocat/Space"]
        assert envelope.installation_id == 957387

    def test_free_text_is_capped_and_the_cut_is_recorded(self) -> None:
        body = payload("issue_comment.created")
        body["comment"]["body"] = "x" * 200_000
        body["issue"]["title"] = "t" * 5_000
        envelope = _project("issue_comment", body, cap=4_000)
        assert envelope.comment is not None and len(envelope.comment.body) == 4_000
        assert envelope.issue is not None and len(envelope.issue.title) == 1_024
        assert sorted(envelope.truncated) == ["comment.body", "issue.title"]

    @pytest.mark.parametrize(
        "mangle",
        [
            lambda b: b.update(issue="not an object"),
            lambda b: b["issue"].update(number="1"),
            lambda b: b["issue"].update(number=True),
            lambda b: b["comment"].update(body=["a", "list"]),
            lambda b: b.update(sender=None),
            lambda b: b["issue"].update(labels={"name": "x"}),
            lambda b: b.update(repository=[]),
        ],
    )
    def test_fields_of_the_wrong_type_are_left_out_not_trusted(self, mangle: Any) -> None:
        body = payload("issue_comment.created")
        mangle(body)
        envelope = _project("issue_comment", body)
        assert envelope.delivery_id == "d-1"

    def test_an_empty_object_projects_to_an_empty_envelope(self) -> None:
        envelope = _project("issues", {})
        assert envelope.model_dump(exclude_defaults=True) == {
            "delivery_id": "d-1",
            "event": "issues",
        }

    def test_a_lone_surrogate_escaped_in_the_json_becomes_a_replacement_character(self) -> None:
        # Found by tests/fuzz: json.loads accepts "\ud800", but the envelope then could not be
        # serialised to UTF-8 for the queue and the webhook answered 500.
        body = json.loads(
            '{"action": "created", "label": {"name": "bug\\udfff"},'
            ' "issue": {"number": 1, "title": "t\\ud800", "labels": [{"name": "\\ud800"}]},'
            ' "comment": {"id": 2, "body": "a\\ud83d b \\ud83d\\ude00",'
            ' "user": {"login": "x\\udc00"}}}'
        )
        envelope = _project("issue_comment", body)
        assert envelope.comment is not None and envelope.issue is not None
        assert envelope.comment.body == "a\ufffd b \U0001f600"
        assert envelope.comment.author is not None
        assert envelope.comment.author.login == "x\ufffd"
        assert (envelope.issue.title, envelope.issue.labels) == ("t\ufffd", ["\ufffd"])
        assert envelope.label == "bug\ufffd"
        assert envelope.model_dump_json().count("\ufffd") == 5
