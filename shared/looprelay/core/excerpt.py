"""The UNTRUSTED payload excerpt a prompt carries.

Everything in a GitHub payload that a person typed is untrusted: a commenter can write text that
argues with the agent's instructions. The excerpt keeps that text as *data*:

- **Allow-list.** Only the fields below, read from the slim :class:`Envelope`, never the raw
  payload: event, action, repository, acting login, issue number/title/state, PR number/title/
  state/draft/merged/author and head/base ref and repository, comment or review author/state/
  body (a review comment's file and line too), label, and a CI check's name/conclusion/branch/
  sha/PR numbers; a turn's joined comments (a review's inline comments) the same way, under
  ``comments``, each capped at :data:`TEXT_MAX_CHARS` and all at :data:`JOINED_BUDGET_CHARS`.
  No issue or PR body, no ``sender``/``user`` objects, no URLs. ``None`` fields are left out.
- **Caps.** Free text (issue title, PR title, comment body, in that order) is cut per field at
  :data:`TEXT_MAX_CHARS` and at :data:`TEXT_BUDGET_CHARS` across all of it, each cut ending in
  :data:`TRUNCATION_NOTE` and named in ``truncated`` (which also names the envelope's own cuts).
  Other strings are names the envelope already capped at 256 characters.
- **Encoding.** ``json.dumps`` with ASCII escaping and backticks written ``\\u0060``: every
  payload string stays one JSON string on one line of printable ASCII, so it cannot add a field,
  start a line, or contain a backtick; JSON escaping can make it up to 6 times longer.
- **Fence.** :func:`wrap_untrusted` puts it in a ```` ```json ```` fence between begin/end lines
  carrying a per-render boundary the caller draws at random (the core uses no randomness).

Deliberately not inherited from the predecessor: the per-field budget is no longer halved
until the whole JSON fits; the caps are stated once and the remainder is bounded by the envelope.
"""

from __future__ import annotations

import json
import re
from typing import Final

from looprelay.core.envelope import Envelope

TEXT_MAX_CHARS: Final = 3_500
TEXT_BUDGET_CHARS: Final = 4_000
JOINED_BUDGET_CHARS: Final = 16_000
"""The budget of a turn's joined comments' bodies, beside the event's own."""
TRUNCATION_NOTE: Final = " … [truncated by looprelay]"
FREE_TEXT_FIELDS: Final = ("issue.title", "pull_request.title", "comment.body")
_REPORTED_CUTS: Final = (*FREE_TEXT_FIELDS, "label")
UNTRUSTED_BEGIN: Final = "BEGIN UNTRUSTED GITHUB DATA"
UNTRUSTED_END: Final = "END UNTRUSTED GITHUB DATA"
_BOUNDARY = re.compile(r"[A-Za-z0-9]{16,64}")

_Json = dict[str, object]


def render_excerpt(envelope: Envelope) -> str:
    """Return the allow-listed, capped, JSON-encoded excerpt of one event.

    Expects a projected envelope. The result is indented JSON in which no payload text can
    start a line or hold a backtick, ready for :func:`wrap_untrusted`. Never raises.
    """
    texts, cut = _capped_texts(envelope)
    excerpt: _Json = {
        "event": envelope.event,
        "action": envelope.action,
        "repository": envelope.repository.full_name if envelope.repository else None,
        "actor": envelope.sender.login if envelope.sender else None,
        "issue": _issue(envelope, texts),
        "pull_request": _pull_request(envelope, texts),
        "comment": _comment(envelope, texts),
        "comments": _joined(envelope, cut) or None,
        "label": envelope.label,
        "check": _check(envelope),
        "truncated": cut or None,
    }
    encoded = json.dumps(_present(excerpt), indent=2, ensure_ascii=True)
    # Backticks occur only inside JSON strings, never inside an escape; \u0060 decodes the same.
    return encoded.replace("`", "\\u0060")


def wrap_untrusted(excerpt: str, *, boundary: str) -> str:
    """Wrap an excerpt in a fenced block between lines only this render can write.

    Expects the output of :func:`render_excerpt` and a boundary of 16-64 ASCII letters and
    digits, freshly random per render (for example ``secrets.token_hex(16)``). The excerpt holds
    no backtick, so it cannot close the fence, and no copy of the boundary, so it cannot forge
    the end line. Raises ``ValueError`` for a malformed boundary, an excerpt containing a
    backtick, or one containing the boundary (draw another).
    """
    if not _BOUNDARY.fullmatch(boundary):
        raise ValueError("the boundary must be 16-64 ASCII letters and digits, random per render")
    if "`" in excerpt:
        raise ValueError("the excerpt holds a backtick; pass render_excerpt's output unchanged")
    if boundary in excerpt:
        raise ValueError("the excerpt contains the boundary; draw another boundary")
    lines = (
        f"{UNTRUSTED_BEGIN} {boundary}",
        "```json",
        excerpt,
        "```",
        f"{UNTRUSTED_END} {boundary}",
    )
    return "\n".join(lines) + "\n"


def _capped_texts(envelope: Envelope) -> tuple[dict[str, str], list[str]]:
    sources = {
        "issue.title": envelope.issue.title if envelope.issue else None,
        "pull_request.title": envelope.pull_request.title if envelope.pull_request else None,
        "comment.body": envelope.comment.body if envelope.comment else None,
    }
    budget = TEXT_BUDGET_CHARS
    texts: dict[str, str] = {}
    cut = {name for name in envelope.truncated if name in _REPORTED_CUTS}
    for name in FREE_TEXT_FIELDS:
        text = sources[name]
        if text is None:
            continue
        keep = min(len(text), TEXT_MAX_CHARS, budget)
        budget -= keep
        if keep < len(text):
            cut.add(name)
        texts[name] = text[:keep] + (TRUNCATION_NOTE if name in cut else "")
    return texts, sorted(cut)


def _issue(envelope: Envelope, texts: dict[str, str]) -> _Json | None:
    issue = envelope.issue
    if issue is None:
        return None
    return {
        "number": issue.number,
        "title": texts["issue.title"],
        "state": issue.state,
        "is_pull_request": issue.is_pull_request,
    }


def _pull_request(envelope: Envelope, texts: dict[str, str]) -> _Json | None:
    pr = envelope.pull_request
    if pr is None:
        return None
    return {
        "number": pr.number,
        "title": texts["pull_request.title"],
        "state": pr.state,
        "draft": pr.draft,
        "merged": pr.merged,
        "author": pr.author.login if pr.author else None,
        "head_ref": pr.head_ref,
        "head_repository": pr.head_repo,
        "base_ref": pr.base_ref,
        "base_repository": pr.base_repo,
    }


def _comment(envelope: Envelope, texts: dict[str, str]) -> _Json | None:
    comment = envelope.comment
    if comment is None:
        return None
    # The anchors (author, state, place) come before the body, so a long body never pushes
    # them off.
    return {
        "author": comment.author.login if comment.author else None,
        "review_state": comment.review_state,
        "path": comment.path,
        "line": comment.line,
        "body": texts["comment.body"],
    }


def _joined(envelope: Envelope, cut: list[str]) -> list[_Json]:
    """The joined parts' comments, in the turn's order, their bodies capped; a cut one adds
    ``comments.body`` to ``cut``."""
    budget = JOINED_BUDGET_CHARS
    found: list[_Json] = []
    for part in envelope.joined:
        comment = part.comment
        if comment is None:
            continue
        keep = min(len(comment.body), TEXT_MAX_CHARS, budget)
        budget -= keep
        shortened = keep < len(comment.body) or "comment.body" in part.truncated
        if shortened and "comments.body" not in cut:
            cut.append("comments.body")
        found.append(
            {
                "author": comment.author.login if comment.author else None,
                "path": comment.path,
                "line": comment.line,
                "body": comment.body[:keep] + (TRUNCATION_NOTE if shortened else ""),
            }
        )
    return found


def _check(envelope: Envelope) -> _Json | None:
    check = envelope.check
    if check is None:
        return None
    return {
        "name": check.name,
        "conclusion": check.conclusion,
        "head_branch": check.head_branch,
        "head_sha": check.head_sha,
        "pull_requests": list(check.pull_requests) or None,
    }


def _present(fields: _Json) -> _Json:
    return {key: _present_value(value) for key, value in fields.items() if value is not None}


def _present_value(value: object) -> object:
    if isinstance(value, dict):
        return _present(value)
    if isinstance(value, list):
        return [_present_value(item) for item in value]
    return value
