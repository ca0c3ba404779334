"""Posting looprelay's own comments at most once, even when a delivery or result is retried."""

from __future__ import annotations

from collections.abc import Collection

from looprelay.core.policy import Marker, mark
from looprelay.ports import GitHub


def post_once(
    github: GitHub,
    *,
    installation_id: int | None,
    repository: str,
    number: int,
    body: str,
    kind: str,
    marker_id: str,
    bot_logins: Collection[str],
) -> int:
    """Post ``body`` with the hidden marker (``kind``, ``marker_id``) unless a comment of ours
    with that marker is already there; return the comment's id.

    A comment counts as ours only when its author is one of ``bot_logins`` (predecessor
    discrepancy 3: anyone can paste a marker); with no bot logins configured nothing counts and
    the comment is posted. Raises what the GitHub port raises.
    """
    existing = github.find_comment_with(
        installation_id=installation_id,
        repository=repository,
        number=number,
        needle=Marker(kind, marker_id).render(),
    )
    if existing is not None and bot_logins:
        text = github.get_comment(
            installation_id=installation_id, repository=repository, comment_id=existing
        )
        bots = {login.lower() for login in bot_logins}
        if text is not None and text.author_login.lower() in bots:
            return existing
    return github.create_comment(
        installation_id=installation_id,
        repository=repository,
        number=number,
        body=mark(body, kind=kind, id=marker_id),
    )
