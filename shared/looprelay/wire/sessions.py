"""What a session's harness and its runner send and get for ``looprelay session``: the bodies of
the runner API's session endpoints (``session-token``, ``session-comment``, ``session-ask``) and
the environment a harness finds its identity in. ``wire.runner_api`` lists the endpoints.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from looprelay.wire.strict import StrictBody


class SessionTokenBody(StrictBody):
    """A runner asks for the token its harness will use to speak for a session."""

    dispatch_id: str = Field(
        min_length=1,
        max_length=100,
        description="A spawn or deliver dispatch this runner holds the lease of; the token "
        "is its session's, replacing the one before.",
    )


MAX_SESSION_COMMENT_CHARS = 200_000
"""The longest comment text a session may send; the server cuts it to GitHub's limit with a
note (JSON-escaped, it still fits ``MAX_BODY_BYTES``)."""
_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


class SessionCommentBody(StrictBody):
    """What a session's harness posts through ``looprelay session comment`` or ``ask``."""

    work_item: str = Field(min_length=1, max_length=300)
    endpoint: str = Field(
        min_length=1,
        max_length=300,
        description="The session: the work item's own, or a pull request's.",
    )
    body: str = Field(min_length=1, max_length=MAX_SESSION_COMMENT_CHARS)
    key: str = Field(
        pattern=_KEY_PATTERN,
        description="Random per command: a retry with the same key posts nothing twice.",
    )


class SessionToken(BaseModel):
    """A session's token, shown this once; the server keeps only its hash."""

    token: str
    work_item: str
    endpoint: str


class SessionPosted(BaseModel):
    """The comment a session posted, as the App, with the loop-prevention marker."""

    comment_id: int
    on: str
    """The work item or pull request it is on."""
    cut: bool = False
    """Whether the text was cut to GitHub's limit (a note at its end says how much)."""
    awaiting_input: bool = False


SESSION_ENV = {
    "api_url": "LOOPRELAY_API_URL",
    "token": "LOOPRELAY_SESSION_TOKEN",
    "work_item": "LOOPRELAY_WORK_ITEM",
    "endpoint": "LOOPRELAY_SESSION",
}
"""The variables a session's harness finds its identity in (``looprelay session`` reads them)."""
