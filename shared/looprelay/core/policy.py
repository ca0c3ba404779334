"""Who may drive looprelay: loop prevention, the App's own bot, authorized actors, and which
words of a comment are its author's own (quotes and code are not).

Order: an event is dropped first if it is looprelay's own doing (a comment or
review body carrying the marker of :mod:`looprelay.core.markers`, or the App's bot as sender or
author), then judged by its actor.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

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
    The comment or review body is checked for the marker, in full: a marker the
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
    """What an event's actor may do."""

    ALLOWED = "allowed"
    """A listed actor: anything, commands and cleanup included."""
    DENIED = "denied"
    """Drop the event (``unauthorized-actor``)."""
    ID_MISMATCH = "id-mismatch"
    """A listed login carrying another user id than the one pinned to it (a released username
    taken by someone else): drop the event, and log it."""
    CLOSE_ONLY = "close-only"
    """With ``routing.closeEndsSession: anyone``, an unlisted actor closed the issue or PR: end
    its session, never clean anything up."""
    NO_ACTOR_CI = "no-actor-ci"
    """A CI event: routed, but it can issue no command."""

    @property
    def routes(self) -> bool:
        """Whether the event goes on to routing."""
        return self not in (Authorization.DENIED, Authorization.ID_MISMATCH)


class CloseEndsSession(StrEnum):
    """``routing.closeEndsSession``: whose close of an issue or PR ends its session."""

    AUTHORIZED = "authorized"
    ANYONE = "anyone"


class Listing(StrEnum):
    """Where an actor stands in ``routing.authorizedUsers``."""

    LISTED = "listed"
    UNLISTED = "unlisted"
    ID_MISMATCH = "id-mismatch"
    """Listed by login, but carrying another user id than the login is pinned to (or none)."""


@dataclass(frozen=True)
class UserPin:
    """A login (lower case) pinned to the numeric id of the one GitHub account it means."""

    login: str
    user_id: int


_NO_PINS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True)
class AuthorizedUsers:
    """``routing.authorizedUsers``, authorizing by immutable user id. Empty = nobody.

    GitHub frees the login of a renamed or deleted account for anyone to take, while a user id
    never moves to another account. So every listed login is pinned to one id: by the config
    (``pins``), or, for a login listed alone (``logins``), by the first event seen with it (the
    caller keeps those pins and passes them in as ``pinned``).
    """

    logins: frozenset[str] = frozenset()
    """Lower-case logins listed without an id."""
    ids: frozenset[int] = frozenset()
    """User ids listed alone or with a login."""
    pins: Mapping[str, int] = field(default_factory=dict)
    """Lower-case login -> user id, as the config gives them."""

    @classmethod
    def from_config(cls, entries: Iterable[str | int | UserPin]) -> AuthorizedUsers:
        """Build the list from config entries: logins, user ids (ints or digit strings), or
        logins pinned to an id.

        Expects the configured list. Raises ``ValueError`` for an entry that is neither a
        GitHub login nor a positive id (a boolean, ``@octocat``, ``0``, a name with spaces),
        and for a login pinned to two different ids.
        """
        if isinstance(entries, str):
            raise ValueError(
                "routing.authorizedUsers must be a list of logins or ids, not a string"
            )
        parsed = [_user_entry(entry) for entry in entries]
        pins: dict[str, int] = {}
        for pin in (entry for entry in parsed if isinstance(entry, UserPin)):
            if pins.setdefault(pin.login, pin.user_id) != pin.user_id:
                raise ValueError(
                    f"routing.authorizedUsers pins {pin.login} to two user ids, "
                    f"{pins[pin.login]} and {pin.user_id}; keep the right one"
                )
        logins = {entry for entry in parsed if isinstance(entry, str)} - pins.keys()
        ids = {entry for entry in parsed if isinstance(entry, int)} | set(pins.values())
        return cls(logins=frozenset(logins), ids=frozenset(ids), pins=pins)

    def pinned_id(self, login: str, *, pinned: Mapping[str, int] = _NO_PINS) -> int | None:
        """Return the user id ``login`` (lower case) must carry, or None while it has none.

        The config's pin wins; a login listed alone has the id in ``pinned`` (the first one
        seen with it). Never raises.
        """
        if login in self.pins:
            return self.pins[login]
        return pinned.get(login) if login in self.logins else None

    def listing(self, actor: Actor | None, *, pinned: Mapping[str, int] = _NO_PINS) -> Listing:
        """Tell where ``actor`` stands: listed by id, or by a login whose pin its id matches.

        Expects the actor of an event or None, and the first-sight pins of logins listed
        alone. A listed login with no pin yet counts by login (the caller pins it); one whose
        id differs from its pin, or that carries no id while pinned, is ``ID_MISMATCH``.
        Logins compare case-insensitively, ASCII only. Never raises.
        """
        if actor is None:
            return Listing.UNLISTED
        if actor.id is not None and actor.id in self.ids:
            return Listing.LISTED
        # Logins are ASCII; lower() of a look-alike such as the Kelvin sign would otherwise
        # fold onto a listed login.
        login = actor.login.lower() if actor.login.isascii() else ""
        if login not in self.logins and login not in self.pins:
            return Listing.UNLISTED
        expected = self.pinned_id(login, pinned=pinned)
        return Listing.LISTED if expected in (None, actor.id) else Listing.ID_MISMATCH

    def allows(self, actor: Actor | None, *, pinned: Mapping[str, int] = _NO_PINS) -> bool:
        """Tell whether ``actor`` is listed (see :meth:`listing`). Never raises."""
        return self.listing(actor, pinned=pinned) is Listing.LISTED


def _user_entry(entry: object) -> str | int | UserPin:
    if isinstance(entry, UserPin):
        login, user_id = entry.login.strip(), entry.user_id
        if _LOGIN.fullmatch(login) and not isinstance(user_id, bool) and user_id > 0:
            return UserPin(login.lower(), user_id)
        raise ValueError(
            f"routing.authorizedUsers entry {{login: {entry.login[:80]!r}, id: {user_id}}} "
            "needs a GitHub login (letters, digits, '-'; no '@') and a positive user id"
        )
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
    sender.

    Expects an envelope. A comment event without an author has no actor. Never raises.
    """
    if envelope.event in CI_EVENTS:
        return None
    if envelope.event in COMMENT_EVENTS:
        return envelope.comment.author if envelope.comment else None
    return envelope.sender


def pin_to_record(envelope: Envelope, *, users: AuthorizedUsers) -> UserPin | None:
    """Return the pin this event gives its actor's login if the login has none yet: the
    actor's login and user id, when the login is listed alone (first sight pins it).

    Expects the configured users. None for CI events, actors without an id, and logins the
    config pins or does not list. The caller keeps the first pin of each login and ignores
    later ones. Never raises.
    """
    if envelope.event in CI_EVENTS:
        return None
    actor = event_actor(envelope)
    if actor is None or actor.id is None or not actor.login.isascii():
        return None
    login = actor.login.lower()
    return UserPin(login, actor.id) if login in users.logins else None


def authorize(
    envelope: Envelope,
    *,
    users: AuthorizedUsers,
    pinned: Mapping[str, int] = _NO_PINS,
    close_ends_session: CloseEndsSession = CloseEndsSession.AUTHORIZED,
) -> Authorization:
    """Decide what the actor of ``envelope`` may do (logins compared
    case-insensitively, where the-loop compared them exactly).

    Expects the configured users, the first-sight pins of logins listed alone, and
    ``routing.closeEndsSession``. CI events carry no actor and pass as ``NO_ACTOR_CI``; a
    listed actor is ``ALLOWED``; with ``ANYONE``, an unlisted one (or none) closing an issue or
    PR is ``CLOSE_ONLY`` (a close may end a session, never clean up); a listed login with
    another user id is ``ID_MISMATCH``; everything else is ``DENIED``, which includes every
    event when the list is empty. Never raises.
    """
    if envelope.event in CI_EVENTS:
        return Authorization.NO_ACTOR_CI
    listing = users.listing(event_actor(envelope), pinned=pinned)
    if listing is Listing.LISTED:
        return Authorization.ALLOWED
    closing = envelope.event in LIFECYCLE_EVENTS and envelope.action == "closed"
    if closing and close_ends_session is CloseEndsSession.ANYONE:
        return Authorization.CLOSE_ONLY
    if listing is Listing.ID_MISMATCH:
        return Authorization.ID_MISMATCH
    return Authorization.DENIED
