"""GitHub deliveries for the real-Claude tests: the recorded payloads (tests/fixtures/github),
adapted to a work item, a comment or a pull request of ``REPOSITORY``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.samples import commented, installed, labeled, payload

__all__ = [
    "REPOSITORY",
    "PullRequestAt",
    "commented",
    "labeled",
    "pull_request_event",
    "pull_request_opened",
    "reviewed",
]

REPOSITORY = "Codertocat/Hello-World"
"""The repository as the recorded payloads spell it."""
FORK_REPOSITORY_ID = 990001
"""The id a fork's repository carries in these payloads (the base keeps the recorded one)."""
FORK_AUTHOR = {"login": "someone", "id": 990002, "type": "User"}
"""The fork's owner as a sender: a user ``routing.authorizedUsers`` does not list."""


@dataclass(frozen=True)
class PullRequestAt:
    """PR ``number`` of ``REPOSITORY`` closing issue ``closes``, its head ``head_sha`` in
    ``head_repository`` (a fork's name for a fork's PR), as a GitHub App ``installation``
    (None: none) delivers its events."""

    number: int
    closes: int
    head_sha: str
    head_repository: str
    installation: int | None


def _adapted(data: dict[str, Any], at: PullRequestAt) -> dict[str, Any]:
    """``data``'s pull request made the one ``at`` names."""
    pr = data["pull_request"]
    pr["number"] = at.number
    pr["body"] = f"Closes #{at.closes}"
    pr["head"]["ref"] = f"topic-{at.number}"
    pr["head"]["sha"] = at.head_sha
    pr["head"]["repo"]["full_name"] = at.head_repository
    pr["base"]["repo"]["full_name"] = REPOSITORY
    pr["base"]["ref"] = "main"  # the offline repository's branch (the recording's: master)
    if at.head_repository != REPOSITORY:  # looprelay tells a fork by its repository id
        pr["head"]["repo"]["id"] = FORK_REPOSITORY_ID
    return installed(data, at.installation)


def pull_request_opened(
    number: int, *, closes: int, head_sha: str, head_repository: str, installation: int | None
) -> dict[str, Any]:
    """A ``pull_request.opened`` delivery: PR ``number`` of ``REPOSITORY`` closing issue
    ``closes``, its head ``head_sha`` in ``head_repository`` (a fork's name for a fork's PR)."""
    at = PullRequestAt(number, closes, head_sha, head_repository, installation)
    return pull_request_event("opened", at)


def pull_request_event(
    action: str, at: PullRequestAt, *, by_fork_author: bool = False, label: str = ""
) -> dict[str, Any]:
    """A ``pull_request.<action>`` delivery (``opened``, ``labeled`` with ``label``,
    ``synchronize``) for the PR ``at`` names; sent by Codertocat, or by the fork's author with
    ``by_fork_author``."""
    name = "pull_request.synchronize" if action == "synchronize" else "pull_request.opened"
    data = payload(name)
    data["action"] = action
    data["number"] = at.number
    if action == "synchronize":
        data["before"], data["after"] = data["pull_request"]["head"]["sha"], at.head_sha
    if label:
        data["label"] = {"name": label, "color": "ededed"}
        data["pull_request"]["labels"] = [{"name": label}]
    if by_fork_author:
        data["sender"] = dict(data["sender"], **FORK_AUTHOR)
    return _adapted(data, at)


def reviewed(at: PullRequestAt, body: str) -> dict[str, Any]:
    """A ``pull_request_review.submitted`` delivery: Codertocat reviews the PR ``at`` names,
    saying ``body``."""
    data = payload("pull_request_review.submitted")
    data["review"]["body"] = body
    data["review"]["commit_id"] = at.head_sha
    return _adapted(data, at)
