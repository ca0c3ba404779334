"""GitHub deliveries for the real-Claude tests: the recorded payloads (tests/fixtures/github),
adapted to a work item, a comment or a pull request of ``REPOSITORY``."""

from __future__ import annotations

from typing import Any

from tests.samples import commented, installed, labeled, payload

__all__ = ["REPOSITORY", "commented", "labeled", "pull_request_opened"]

REPOSITORY = "Codertocat/Hello-World"
"""The repository as the recorded payloads spell it."""
FORK_REPOSITORY_ID = 990001
"""The id a fork's repository carries in these payloads (the base keeps the recorded one)."""


def pull_request_opened(
    number: int, *, closes: int, head_sha: str, head_repository: str, installation: int | None
) -> dict[str, Any]:
    """A ``pull_request.opened`` delivery: PR ``number`` of ``REPOSITORY`` closing issue
    ``closes``, its head ``head_sha`` in ``head_repository`` (a fork's name for a fork's PR)."""
    data = payload("pull_request.opened")
    data["number"] = number
    pr = data["pull_request"]
    pr["number"] = number
    pr["body"] = f"Closes #{closes}"
    pr["head"]["ref"] = f"topic-{number}"
    pr["head"]["sha"] = head_sha
    pr["head"]["repo"]["full_name"] = head_repository
    pr["base"]["repo"]["full_name"] = REPOSITORY
    pr["base"]["ref"] = "main"  # the offline repository's default branch
    if head_repository != REPOSITORY:  # looprelay tells a fork by its repository id
        pr["head"]["repo"]["id"] = FORK_REPOSITORY_ID
    return installed(data, installation)
