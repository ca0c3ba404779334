"""Who may drive looprelay: loop prevention, the App's own bot, authorized actors, and which
words of a comment are its author's own (quotes and code are not).

Order (SPEC §2, B12): an event is dropped first if it is looprelay's own doing (a comment or
review body carrying the marker of :mod:`looprelay.core.markers`, or the App's bot as sender or
author), then judged by its actor.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum

from looprelay.core.envelope import Actor, Envelope
from looprelay.core.markers import is_marked
from looprelay.core.workitems import CI_EVENTS

COMMENT_EVENTS = frozenset({"issue_comment", "pull_request_review_comment", "pull_request_review"})
LIFECYCLE_EVENTS = frozenset({"issues", "pull_request"})
BOT_SUFFIX = "[bot]"

HIDDEN = "\x00"
"""Stands in for text that is not read, so words on either side of it never join up."""
_LINE_END = re.compile(r"\r\n|\r|\n")  # CommonMark's line endings, not str.splitlines()'
# Fences count at any indent (a list item indents them): reading less is the safe side.
_FENCE = re.compile(r"[ \t]*(?P<fence>`{3,}|~{3,})(?P<info>.*)")
_QUOTE = re.compile(r"[ \t]*(?:(?:[-*+]|[0-9]{1,9}[.)])[ \t]+)*>")  # also "- > quoted"
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_TICKS = re.compile(r"`+")
_LOGIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}(?:\[bot\])?", re.ASCII)
_USER_ID = re.compile(r"[0-9]{1,20}", re.ASCII)


def strip_quotes_and_code(body: str) -> str:
    """Return the words a comment's author says in their own voice, now.

    Quoted lines (``> ...``) are someone else's words, and fenced or inline code is an example:
    both are replaced by :data:`HIDDEN`, so a quoted or shown command is not the actor's command.
    A line right under a quote without a blank line counts as the author's (it is what they
    typed). Expects Markdown of any length; linear time. An unclosed fence hides the rest, as
    CommonMark renders it. Never raises.
    """
    lines: list[str] = []
    fence = ""
    for line in _LINE_END.split(body):
        if fence:
            fence = "" if _closes(line, fence) else fence
            lines.append(HIDDEN)
        elif (match := _FENCE.match(line)) and not (
            match["fence"][0] == "`" and "`" in match["info"]
        ):
            fence = match["fence"]
            lines.append(HIDDEN)
        else:
            lines.append(HIDDEN if _QUOTE.match(line) else line)
    blocks = _BLANK_LINE.split("\n".join(lines))  # a code span never crosses a blank line
    return "\n\n".join(_hide_code_spans(block) for block in blocks)


def _closes(line: str, fence: str) -> bool:
    run = line.strip(" \t")
    return len(run) >= len(fence) and run == fence[0] * len(run)


def _hide_code_spans(text: str) -> str:
    # CommonMark: a backtick run opens a span closed by the next run of the same length; a run
    # with no partner is literal. next_same[i] finds that partner in one backward pass.
    runs = [(m.start(), m.end()) for m in _TICKS.finditer(text)]
    next_same: list[int | None] = [None] * len(runs)
    last: dict[int, int] = {}
    for i in range(len(runs) - 1, -1, -1):
        length = runs[i][1] - runs[i][0]
        next_same[i], last[length] = last.get(length), i
    parts, pos, i = [], 0, 0
    while i < len(runs):
        j = next_same[i]
        if j is None:
            i += 1
            continue
        parts += [text[pos : runs[i][0]], HIDDEN]
        pos, i = runs[j][1], j + 1
    return "".join([*parts, text[pos:]])


class DropReason(StrEnum):
    """Why an event is dropped before anything else looks at it."""

    SELF_MARKED = "self-marked"
    OWN_BOT = "own-bot"


def drop_reason(envelope: Envelope, *, bot_logins: Collection[str]) -> DropReason | None:
    """Return why ``envelope`` must be dropped as looprelay's own doing, or None to carry on.

    Expects the App's bot login(s) (``looprelay[bot]``; a bare slug also matches its
    ``[bot]`` login), compared case-insensitively with the sender and any comment author.
    The comment or review body is checked for the marker (B7), in full: a marker the
    envelope's cap cut off still counts (``Comment.marked``). Issue and PR descriptions are
    not checked, as they never carry commands. Never raises.
    """
    comment = envelope.comment
    if comment is not None and (comment.marked or is_marked(comment.body)):
        return DropReason.SELF_MARKED
    bots = _bot_names(bot_logins)
    author = envelope.comment.author if envelope.comment else None
    if any(
        actor is not None and actor.login.lower() in bots for actor in (envelope.sender, author)
    ):
        return DropReason.OWN_BOT
    return None


def _bot_names(logins: Iterable[str]) -> frozenset[str]:
    logins = [logins] if isinstance(logins, str) else logins  # one login, not its characters
    names = {login.strip().lower() for login in logins if login.strip()}
    return frozenset(
        names | {f"{name}{BOT_SUFFIX}" for name in names if not name.endswith(BOT_SUFFIX)}
    )


class Authorization(StrEnum):
    """What an event's actor may do (SPEC §2 "Authorized actors")."""

    ALLOWED = "allowed"
    """A listed actor: anything, commands and cleanup included."""
    DENIED = "denied"
    """Drop the event (B8: ``unauthorized-actor``)."""
    CLOSE_ONLY = "close-only"
    """An unlisted actor closed the issue or PR: end its session, never clean anything up."""
    NO_ACTOR_CI = "no-actor-ci"
    """A CI event: routed, but it can issue no command."""

    @property
    def routes(self) -> bool:
        """Whether the event goes on to routing."""
        return self is not Authorization.DENIED


@dataclass(frozen=True)
class AuthorizedUsers:
    """``routing.authorizedUsers``: lower-case logins and numeric user ids. Empty = nobody."""

    logins: frozenset[str] = frozenset()
    ids: frozenset[int] = frozenset()

    @classmethod
    def from_config(cls, entries: Iterable[str | int]) -> AuthorizedUsers:
        """Build the list from config entries: logins, or user ids as ints or digit strings.

        Expects the configured list. Raises ``ValueError`` for an entry that is neither a
        GitHub login nor a positive id (a boolean, ``@octocat``, ``0``, a name with spaces).
        """
        if isinstance(entries, str):
            raise ValueError(
                "routing.authorizedUsers must be a list of logins or ids, not a string"
            )
        parsed = [_user_entry(entry) for entry in entries]
        logins = {entry for entry in parsed if isinstance(entry, str)}
        ids = {entry for entry in parsed if isinstance(entry, int)}
        return cls(logins=frozenset(logins), ids=frozenset(ids))

    def allows(self, actor: Actor | None) -> bool:
        """Tell whether ``actor`` is listed, by id or by login (case-insensitive, ASCII only).

        Expects the actor of an event or None. Never raises.
        """
        if actor is None:
            return False
        if actor.id is not None and actor.id in self.ids:
            return True
        # Logins are ASCII; lower() of a look-alike such as the Kelvin sign would otherwise
        # fold onto a listed login.
        return actor.login.isascii() and actor.login.lower() in self.logins


def _user_entry(entry: object) -> str | int:
    # A digit string is always an id, so an entry never means two accounts at once.
    value = entry.strip() if isinstance(entry, str) else entry
    if isinstance(value, str) and _USER_ID.fullmatch(value):
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and _LOGIN.fullmatch(value):
        return value.lower()
    raise ValueError(
        f"routing.authorizedUsers entry {str(entry)[:80]!r} is neither a GitHub login "
        "(letters, digits, '-'; no '@') nor a positive numeric user id; fix or remove it"
    )


def event_actor(envelope: Envelope) -> Actor | None:
    """Return who acted: the comment or review author for those events, none for CI, else the
    sender (B8).

    Expects an envelope. A comment event without an author has no actor. Never raises.
    """
    if envelope.event in CI_EVENTS:
        return None
    if envelope.event in COMMENT_EVENTS:
        return envelope.comment.author if envelope.comment else None
    return envelope.sender


def authorize(envelope: Envelope, *, users: AuthorizedUsers) -> Authorization:
    """Decide what the actor of ``envelope`` may do (SPEC §2, B8; logins compared
    case-insensitively, where the-loop compared them exactly).

    Expects the configured users. CI events carry no actor and pass as ``NO_ACTOR_CI``; a
    listed actor is ``ALLOWED``; an unlisted one (or none) closing an issue or PR is
    ``CLOSE_ONLY`` (a close may end a session, never clean up); everything else is ``DENIED``,
    which includes every event when the list is empty. Never raises.
    """
    if envelope.event in CI_EVENTS:
        return Authorization.NO_ACTOR_CI
    if users.allows(event_actor(envelope)):
        return Authorization.ALLOWED
    if envelope.event in LIFECYCLE_EVENTS and envelope.action == "closed":
        return Authorization.CLOSE_ONLY
    return Authorization.DENIED
