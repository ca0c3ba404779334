"""Posting looprelay's own comments at most once, even when a delivery or result is retried."""

from __future__ import annotations

from collections.abc import Collection

from looprelay.core.markers import Marker, mark
from looprelay.errors import Transient
from looprelay.ports import GitHub

POST_ROUNDS = 3
"""Look-then-post rounds: a post whose fate is unknown (a 502, a timeout) is looked for before
it is posted again."""


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
    the comment is posted. A post that fails with ``Transient`` may still have been stored, so
    the marker is looked for again before posting again, ``POST_ROUNDS`` times in all. Raises
    what the GitHub port raises (``Transient`` once the rounds are spent).
    """
    for round_ in range(1, POST_ROUNDS + 1):
        existing = _ours(
            github,
            installation_id=installation_id,
            repository=repository,
            number=number,
            needle=Marker(kind, marker_id).render(),
            bot_logins=bot_logins,
        )
        if existing is not None:
            return existing
        try:
            return github.create_comment(
                installation_id=installation_id,
                repository=repository,
                number=number,
                body=mark(body, kind=kind, id=marker_id),
            )
        except Transient:
            if round_ == POST_ROUNDS:
                raise
    raise AssertionError("unreachable: the last round returns or raises")


def _ours(
    github: GitHub,
    *,
    installation_id: int | None,
    repository: str,
    number: int,
    needle: str,
    bot_logins: Collection[str],
) -> int | None:
    """The id of a comment by one of ``bot_logins`` on ``number`` that holds ``needle``."""
    existing = github.find_comment_with(
        installation_id=installation_id, repository=repository, number=number, needle=needle
    )
    if existing is None or not bot_logins:
        return None
    text = github.get_comment(
        installation_id=installation_id, repository=repository, comment_id=existing
    )
    bots = {login.lower() for login in bot_logins}
    return existing if text is not None and text.author_login.lower() in bots else None
