"""Who may drive looprelay: the loop-prevention marker, the App's own bot, authorized actors,
and which words of a comment are its author's own (quotes and code are not).

Order (SPEC §2, B12): an event is dropped first if it is looprelay's own doing (a marked comment
or review body, or the App's bot as sender or author), then judged by its actor.

The marker means "written by looprelay" for loop prevention only. Anyone can paste it, and such a
comment is dropped too: dropping is the safe side. It is never evidence of authorship; trust in
a comment looprelay wrote comes from the comment id it recorded (fixes discrepancy 3).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum

from looprelay.core.envelope import Actor, Envelope
from looprelay.core.workitems import CI_EVENTS

MARKER_TAG = "looprelay:v1"
LEGACY_MARKER = "<!-- the-loop:agent-comment -->"
"""the-loop's marker (B7); sessions it set up may still write it, so it is dropped too."""
COMMENT_EVENTS = frozenset({"issue_comment", "pull_request_review_comment", "pull_request_review"})
LIFECYCLE_EVENTS = frozenset({"issues", "pull_request"})
BOT_SUFFIX = "[bot]"

_FIELD = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
_FIELD_RE = re.compile(_FIELD, re.ASCII)
_MARKER = re.compile(rf"<!-- {MARKER_TAG} kind=(?P<kind>{_FIELD}) id=(?P<id>{_FIELD}) -->", re.A)
# Detection is wider than what we write: any version, spacing or case still counts as ours.
_ANY_MARKER = re.compile(r"<!--\s*(?:looprelay:|the-loop:agent-comment)", re.IGNORECASE)
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


@dataclass(frozen=True)
class Marker:
    """The hidden line ending every comment looprelay writes: what wrote it, for which id."""

    kind: str
    id: str

    def __post_init__(self) -> None:
        for name, value in (("kind", self.kind), ("id", self.id)):
            if not _FIELD_RE.fullmatch(value):
                raise ValueError(
                    f"marker {name} {value[:80]!r} must be 1-128 letters, digits, '.', '_', ':' "
                    "or '-', starting with a letter or digit"
                )

    def render(self) -> str:
        """Return the marker as an HTML comment (invisible in rendered Markdown)."""
        return f"<!-- {MARKER_TAG} kind={self.kind} id={self.id} -->"


def mark(body: str, *, kind: str, id: str) -> str:
    """Append the loop-prevention marker for ``kind`` and ``id`` to a comment body.

    Expects the comment text and, as ``id``, a delivery or dispatch id. Idempotent: a body
    already ending with the same marker comes back unchanged. Raises ``ValueError`` when
    ``kind`` or ``id`` could not sit inside an HTML comment (see :class:`Marker`).
    """
    marker = Marker(kind=kind, id=id).render()
    text = body.rstrip()
    if text.endswith(marker):
        return text
    return f"{text}\n\n{marker}" if text else marker


def is_marked(body: str) -> bool:
    """Tell whether a body carries looprelay's marker (any version) or the-loop's.

    Expects any text, of any length. Never raises.
    """
    return _ANY_MARKER.search(body) is not None


def read_marker(body: str) -> Marker | None:
    """Return the last well-formed looprelay marker in a body, or None.

    Expects a comment body. What it returns says what the marker claims, not who wrote it.
    Never raises.
    """
    last = None
    for match in _MARKER.finditer(body):
        last = match
    return Marker(kind=last["kind"], id=last["id"]) if last else None


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
    The comment or review body is checked for the marker (B7); issue and PR descriptions are
    not, as they never carry commands. Never raises.
    """
    if envelope.comment is not None and is_marked(envelope.comment.body):
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
