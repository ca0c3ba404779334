"""The poll ingress's pure part: a listing item becomes the envelope GitHub's webhook delivery
of the same event projects to (real payloads from tests/fixtures/github), and the two front
doors' deliveries of one event share one identity (core.sameevent)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from looprelay.core.envelope import Envelope, project_envelope
from looprelay.core.model import AppliedDelivery
from looprelay.core.poll import (
    ISSUE_COMMENTS,
    ISSUES,
    PolledDelivery,
    PollTarget,
    comment_delivery,
    issue_event_delivery,
    new_cursor,
    opened_delivery,
    poll_rows,
    review_comment_delivery,
    review_delivery,
)
from looprelay.core.sameevent import applied_before, event_identity
from tests.samples import payload

LONG_AGO = datetime(2019, 1, 1, tzinfo=UTC)
RECEIVED = datetime(2019, 5, 15, 15, 20, 30, tzinfo=UTC)


def _project(event: str, delivery_id: str, data: dict[str, Any]) -> Envelope:
    return project_envelope(
        event=event,
        delivery_id=delivery_id,
        payload=data,
        max_text_chars=65_536,
        received_at=RECEIVED,
    )


def _polled(found: PolledDelivery | None) -> Envelope:
    assert found is not None
    return _project(found.event, found.delivery_id, found.payload)


def _webhook(name: str) -> tuple[dict[str, Any], PollTarget]:
    data = payload(name)
    return data, PollTarget(data["repository"], data.get("installation", {}).get("id"))


def _same_but_the_id(polled: Envelope, webhook: Envelope) -> None:
    assert polled.model_copy(update={"delivery_id": webhook.delivery_id}) == webhook


def test_a_polled_issue_comment_is_the_webhooks_issue_comment() -> None:
    data, target = _webhook("issue_comment.created")
    found = comment_delivery(data["comment"], issue=data["issue"], target=target, since=LONG_AGO)
    polled = _polled(found)

    assert polled.delivery_id == f"poll-comment-{data['comment']['id']}"
    _same_but_the_id(polled, _project("issue_comment", "guid-1", data))


def test_a_polled_review_is_the_webhooks_review_though_rest_spells_its_state_in_capitals() -> None:
    data, target = _webhook("pull_request_review.submitted")
    listed = data["review"] | {"state": data["review"]["state"].upper()}
    found = review_delivery(
        listed, pull_request=data["pull_request"], target=target, since=LONG_AGO
    )
    polled = _polled(found)

    assert polled.comment is not None and polled.comment.review_state == "commented"
    _same_but_the_id(polled, _project("pull_request_review", "guid-2", data))


def test_a_polled_review_comment_is_the_webhooks_review_comment() -> None:
    data, target = _webhook("pull_request_review_comment.created")
    found = review_comment_delivery(
        data["comment"], pull_request=data["pull_request"], target=target, since=LONG_AGO
    )
    _same_but_the_id(_polled(found), _project("pull_request_review_comment", "guid-3", data))


def test_a_polled_label_event_is_the_webhooks_labeled_delivery() -> None:
    data, target = _webhook("issues.labeled")
    event = {
        "id": 6430295168,
        "event": "labeled",
        "actor": data["sender"],
        "label": data["label"],
        "created_at": data["issue"]["updated_at"],
        "issue": data["issue"] | {"updated_at": "2019-05-16T09:00:00Z"},  # as listed later
    }
    found = issue_event_delivery(event, pull_request=None, target=target, since=LONG_AGO)
    polled = _polled(found)

    assert polled.delivery_id == "poll-event-6430295168"
    _same_but_the_id(polled, _project("issues", "guid-4", data))
    assert event_identity(polled) == event_identity(_project("issues", "guid-4", data))


def test_a_label_event_on_a_pull_request_is_a_pull_request_delivery() -> None:
    pr_data, target = _webhook("pull_request.opened")
    issue = {"number": pr_data["number"], "pull_request": {"url": "..."}}
    event = {
        "id": 7,
        "event": "labeled",
        "actor": pr_data["sender"],
        "label": {"name": "bug"},
        "created_at": "2019-05-15T15:20:33Z",
        "issue": issue,
    }
    polled = _polled(
        issue_event_delivery(
            event, pull_request=pr_data["pull_request"], target=target, since=LONG_AGO
        )
    )
    assert (polled.event, polled.action, polled.label) == ("pull_request", "labeled", "bug")
    assert polled.pull_request is not None
    assert polled.pull_request.number == pr_data["number"]


def test_a_polled_opened_issue_is_the_webhooks_opened_delivery() -> None:
    data, target = _webhook("issues.opened")
    listed = data["issue"] | {"updated_at": "2019-05-16T09:00:00Z"}  # as listed later
    found = opened_delivery(listed, pull_request=None, target=target, since=LONG_AGO)
    webhook = data | {"issue": data["issue"] | {"updated_at": data["issue"]["created_at"]}}

    _same_but_the_id(_polled(found), _project("issues", "guid-8", webhook))


def test_a_polled_opened_pull_request_is_the_webhooks_opened_pull_request() -> None:
    data, target = _webhook("pull_request.opened")
    pull = data["pull_request"]
    listed = {"id": 9, "number": data["number"], "created_at": pull["created_at"]}
    listed |= {"user": pull["user"], "pull_request": {"url": pull["url"]}}
    found = opened_delivery(listed, pull_request=pull, target=target, since=LONG_AGO)
    webhook = data | {"pull_request": pull | {"updated_at": pull["created_at"]}}

    polled = _polled(found)
    _same_but_the_id(polled, _project("pull_request", "guid-9", webhook))
    assert event_identity(polled) == event_identity(_project("pull_request", "g", data))


@pytest.mark.parametrize("action", ["assigned", "mentioned", "referenced"])
def test_issue_events_no_webhook_action_stands_for_are_left_out(action: str) -> None:
    data, target = _webhook("issues.labeled")
    event = {"id": 8, "event": action, "actor": data["sender"], "issue": data["issue"]}
    event["created_at"] = "2019-05-15T15:20:33Z"
    assert issue_event_delivery(event, pull_request=None, target=target, since=LONG_AGO) is None


def test_an_edit_of_a_comment_made_before_the_cursor_is_no_new_comment() -> None:
    data, target = _webhook("issue_comment.created")
    edited = data["comment"] | {"updated_at": "2026-12-02T10:00:00Z"}
    since = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    assert comment_delivery(edited, issue=data["issue"], target=target, since=since) is None


def test_a_pending_review_is_not_submitted_yet() -> None:
    data, target = _webhook("pull_request_review.submitted")
    pending = data["review"] | {"state": "PENDING"}
    found = review_delivery(
        pending, pull_request=data["pull_request"], target=target, since=LONG_AGO
    )
    assert found is None


def test_a_label_added_again_later_is_another_event() -> None:
    data, _ = _webhook("issues.labeled")
    first = _project("issues", "guid-5", data)
    again = data | {"issue": data["issue"] | {"updated_at": "2019-05-15T16:00:00Z"}}
    identity = event_identity(first)
    assert identity is not None and identity.at is not None
    applied = [
        AppliedDelivery(
            delivery_id="guid-5", outcome="ignored", event_key=identity.key, event_at=identity.at
        )
    ]

    assert applied_before(event_identity(first), applied) == applied[0]
    assert applied_before(event_identity(_project("issues", "guid-6", again)), applied) is None


def test_two_pull_requests_opened_in_the_same_second_are_two_events() -> None:
    # Both close one issue, so one work item applies both: the second must not be dropped.
    data, _ = _webhook("pull_request.opened")
    other = data | {"number": 6, "pull_request": data["pull_request"] | {"number": 6}}
    first = event_identity(_project("pull_request", "guid-8", data))
    second = event_identity(_project("pull_request", "guid-9", other))
    assert first is not None and second is not None and first.at == second.at
    applied = [
        AppliedDelivery(delivery_id="guid-8", outcome="ok", event_key=first.key, event_at=first.at)
    ]

    assert applied_before(first, applied) == applied[0]
    assert applied_before(second, applied) is None


def test_an_edited_comment_has_no_identity_to_share() -> None:
    data = payload("issue_comment.edited")
    assert event_identity(_project("issue_comment", "guid-7", data)) is None


def test_the_status_rows_say_how_far_behind_and_why() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    fresh = new_cursor("octo/widgets", ISSUES, now=now)
    polled = fresh.model_copy(update={"polled_at": now - timedelta(seconds=40)})
    older = new_cursor("octo/widgets", ISSUE_COMMENTS, now=now).model_copy(
        update={"polled_at": now - timedelta(seconds=70)}
    )
    limited = new_cursor("octo/gadgets", ISSUES, now=now).model_copy(
        update={
            "failed_at": now - timedelta(seconds=5),
            "error": "rate-limited for 3600 s",
            "retry_at": now + timedelta(hours=1),
        }
    )

    gadgets, widgets = poll_rows([polled, older, limited], now=now)

    assert (widgets.repository, widgets.behind_seconds, widgets.error) == ("octo/widgets", 70, "")
    assert gadgets.behind_seconds is None and gadgets.polled_at is None
    assert gadgets.error == "rate-limited for 3600 s"
    assert gadgets.retry_at == now + timedelta(hours=1)
