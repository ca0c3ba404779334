"""Work items: which issues and pull requests an event is about, and how a PR links to issues.

A work item is ``github:owner/repo#N``; the host is written only off github.com
(``github:ghe.example.com/owner/repo#N``), as in the-loop. Owner, repository and host are
kept in lower case: GitHub resolves them case-insensitively, so ``Fixes octo/Repo#3`` and an
event from ``Octo/repo`` must name the same work item (the-loop compared them as written).

A pull request links to issues from three sources, in this order: its head branch
``issue-<n>`` (same repository only), closing keywords in its body, and links recorded by earlier
events. A link once recorded is never dropped: :func:`merge_links` only adds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from enum import StrEnum

from looprelay.core.envelope import Envelope

PROVIDER = "github"
DEFAULT_HOST = "github.com"
ISSUE_EVENTS = frozenset({"issues", "issue_comment"})
PULL_REQUEST_EVENTS = frozenset(
    {
        "pull_request",
        "pull_request_review",
        "pull_request_review_comment",
        "pull_request_review_thread",
    }
)
CI_EVENTS = frozenset({"check_run", "check_suite", "workflow_run", "status"})
MAX_FOUND_LINKS = 10
"""Links taken from one PR's branch and body; more would fan one event out to many sessions."""

# GitHub's shapes: a login is at most 39 letters, digits and hyphens; a repository name at most
# 100 of letters, digits, '.', '_' and '-'. ASCII only: `\d` would accept other scripts' digits.
_OWNER = r"[A-Za-z0-9][A-Za-z0-9-]{0,38}"
_REPO = r"[A-Za-z0-9._-]{1,100}"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(?::[0-9]{1,5})?"
_NUMBER = r"[1-9][0-9]{0,9}"
_REF = re.compile(
    rf"{PROVIDER}:(?:(?P<host>{_HOST})/)?(?P<owner>{_OWNER})/(?P<repo>{_REPO})#(?P<number>{_NUMBER})",
    re.ASCII,
)
_REPOSITORY = re.compile(rf"(?P<owner>{_OWNER})/(?P<repo>{_REPO})", re.ASCII)
# B3's branch rule `issue[-/](\d+)`, but "issue" must start a word: `tissue-3` names no issue.
_BRANCH = re.compile(rf"(?<![A-Za-z0-9])issue[-/](?P<number>{_NUMBER})(?![0-9])", re.I | re.A)
# GitHub's closing keywords ("Linking a pull request to an issue"), optional colon, then `#N`,
# `GH-N`, `owner/repo#N` or an issue URL. Possessive spacing keeps long blank runs linear.
_CLOSING = re.compile(
    r"(?<![A-Za-z0-9_])(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)(?:[ \t]*+:[ \t]*+|[ \t]++)"
    rf"(?:#(?P<num>{_NUMBER})|GH-(?P<gh>{_NUMBER})"
    rf"|(?P<owner>{_OWNER})/(?P<repo>{_REPO})#(?P<xnum>{_NUMBER})"
    rf"|https?://(?P<host>{_HOST})/(?P<uowner>{_OWNER})/(?P<urepo>{_REPO})/issues/(?P<unum>{_NUMBER}))"
    r"(?![A-Za-z0-9_])",
    re.IGNORECASE | re.ASCII,
)


@dataclass(frozen=True, order=True)
class WorkItemRef:
    """One issue or pull request: ``github:[host/]owner/repo#number``, kept in lower case."""

    owner: str
    repo: str
    number: int
    host: str = DEFAULT_HOST

    def __post_init__(self) -> None:
        text = f"{PROVIDER}:{self.host}/{self.owner}/{self.repo}#{self.number}"
        if not _REF.fullmatch(text) or self.repo in {".", ".."}:
            raise ValueError(f"{text[:200]!r} is not a GitHub issue or pull request reference")
        for name in ("owner", "repo", "host"):
            object.__setattr__(self, name, getattr(self, name).lower())

    @property
    def repository(self) -> str:
        """``owner/repo``."""
        return f"{self.owner}/{self.repo}"

    def format(self) -> str:
        """Return the canonical text form, the inverse of :func:`parse_ref`."""
        host = "" if self.host == DEFAULT_HOST else f"{self.host}/"
        return f"{PROVIDER}:{host}{self.repository}#{self.number}"

    def __str__(self) -> str:
        return self.format()

    def web_url(self) -> str:
        """The page of the issue or pull request on GitHub (``/issues/N`` also opens a pull
        request: GitHub redirects)."""
        return f"https://{self.host}/{self.repository}/issues/{self.number}"

    def same_repository(self, other: WorkItemRef) -> bool:
        """Tell whether ``other`` lives in the same repository on the same host."""
        return (self.host, self.owner, self.repo) == (other.host, other.owner, other.repo)


def parse_ref(text: str) -> WorkItemRef:
    """Parse ``github:owner/repo#N`` or ``github:host/owner/repo#N`` into a :class:`WorkItemRef`.

    Expects the text form written by :meth:`WorkItemRef.format`; an explicit ``github.com``
    host is accepted and dropped. Raises ``ValueError`` naming the text and the expected shape.
    """
    match = _REF.fullmatch(text)
    if match is None or match["repo"] in {".", ".."}:
        raise ValueError(
            f"{text[:200]!r} is not a work-item ref; expected github:owner/repo#N "
            "(or github:host/owner/repo#N off github.com), N a positive issue number"
        )
    return WorkItemRef(
        match["owner"], match["repo"], int(match["number"]), match["host"] or DEFAULT_HOST
    )


def repository_ref(repository: str, number: int, *, host: str = DEFAULT_HOST) -> WorkItemRef | None:
    """Return the ref of issue or PR ``number`` in ``owner/repo``, or None if either is malformed.

    Expects a repository ``full_name`` from a payload; never raises for a malformed one.
    """
    match = _REPOSITORY.fullmatch(repository)
    if match is None or match["repo"] in {".", ".."} or not 0 < number < 10**10:
        return None
    return WorkItemRef(match["owner"], match["repo"], number, host)


class LinkSource(StrEnum):
    """Why a pull request is linked to an issue."""

    BRANCH = "branch"
    KEYWORD = "keyword"
    RECORDED = "recorded"


@dataclass(frozen=True)
class Link:
    """An issue a pull request is linked to, with every source that names it."""

    ref: WorkItemRef
    sources: frozenset[LinkSource]
    cross_repository: bool = False

    @property
    def weak(self) -> bool:
        """Named by the branch name alone, so possibly invented (verify before spawning)."""
        return self.sources == {LinkSource.BRANCH}


@dataclass(frozen=True)
class WorkItems:
    """What an event names: its own issue or PR(s), and the issues a PR is linked to."""

    own: tuple[WorkItemRef, ...] = ()
    linked: tuple[Link, ...] = ()

    @property
    def linked_refs(self) -> tuple[WorkItemRef, ...]:
        """The linked issues' refs, in priority order."""
        return tuple(link.ref for link in self.linked)

    @property
    def refs(self) -> tuple[WorkItemRef, ...]:
        """Every ref, linked issues first and the event's own last."""
        return self.linked_refs + self.own


def branch_issue(head_ref: str | None) -> int | None:
    """Return ``n`` when a head branch names ``issue-<n>`` (or ``issue/<n>``), else None.

    Expects a branch name (``issue-15-login``, ``feature/ISSUE-15``). Never raises.
    """
    match = _BRANCH.search(head_ref or "")
    return int(match["number"]) if match else None


def closing_references(
    body: str, *, repository: str, host: str = DEFAULT_HOST
) -> tuple[WorkItemRef, ...]:
    """Return the issues a PR body closes with a keyword, in order of appearance, without repeats.

    Expects the PR body and the PR's ``owner/repo``. ``#N`` and ``GH-N`` name an issue in that
    repository; ``owner/repo#N`` and an issue URL on ``host`` name one in the repository written
    (a URL on another host names nothing). Never raises.
    """
    found: dict[WorkItemRef, None] = {}
    for match in _CLOSING.finditer(body):
        ref = _closing_ref(match, repository=repository, host=host)
        if ref is not None:
            found.setdefault(ref)
    return tuple(found)


def _closing_ref(match: re.Match[str], *, repository: str, host: str) -> WorkItemRef | None:
    if match["num"] or match["gh"]:
        return repository_ref(repository, int(match["num"] or match["gh"]), host=host)
    if match["xnum"]:
        return repository_ref(f"{match['owner']}/{match['repo']}", int(match["xnum"]), host=host)
    if match["host"].lower() != host.lower():
        return None
    return repository_ref(f"{match['uowner']}/{match['urepo']}", int(match["unum"]), host=host)


def work_items(
    envelope: Envelope,
    *,
    recorded: AbstractSet[WorkItemRef] = frozenset(),
    host: str = DEFAULT_HOST,
) -> WorkItems:
    """Return the work items ``envelope`` names.

    Issue events name the issue (or, on a PR conversation, the PR); PR events name the PR and
    its linked issues; CI events name ``check.pull_requests``; anything else names nothing.
    ``recorded`` holds the issues earlier events linked to this event's PR(s); ``host`` is the
    GitHub host the App serves. A malformed repository name names nothing; raises
    ``ValueError`` only for a malformed ``host`` (configuration).
    """
    repository = envelope.repository.full_name if envelope.repository else ""
    numbers = _own_numbers(envelope)
    own = tuple(
        ref for n in numbers if (ref := repository_ref(repository, n, host=host)) is not None
    )
    if not own or (envelope.event in ISSUE_EVENTS and not _on_pull_request(envelope)):
        return WorkItems(own=own)
    found = _found_links(envelope, own=own[0], host=host) if len(own) == 1 else ()
    return WorkItems(own=own, linked=_links(found, recorded, own=own))


def merge_links(
    recorded: AbstractSet[WorkItemRef], links: Iterable[Link]
) -> frozenset[WorkItemRef]:
    """Return the recorded links plus the new ones: a PR once linked stays linked.

    Expects the set recorded so far and the links an event found. Never raises.
    """
    return frozenset(recorded) | {link.ref for link in links}


def _on_pull_request(envelope: Envelope) -> bool:
    return envelope.issue is not None and envelope.issue.is_pull_request


def _own_numbers(envelope: Envelope) -> tuple[int, ...]:
    if envelope.event in ISSUE_EVENTS and envelope.issue is not None:
        return (envelope.issue.number,)
    if envelope.event in PULL_REQUEST_EVENTS and envelope.pull_request is not None:
        return (envelope.pull_request.number,)
    if envelope.event in CI_EVENTS and envelope.check is not None:
        return tuple(dict.fromkeys(envelope.check.pull_requests))
    return ()


def _found_links(
    envelope: Envelope, *, own: WorkItemRef, host: str
) -> tuple[tuple[WorkItemRef, LinkSource], ...]:
    pr = envelope.pull_request
    if envelope.event not in PULL_REQUEST_EVENTS or pr is None:
        return ()
    found: list[tuple[WorkItemRef, LinkSource]] = []
    number = branch_issue(pr.head_ref)
    # A fork's branch name says nothing about this repository's issues; an unknown head
    # repository (a deleted fork) is treated as a fork.
    if number is not None and (pr.head_repo or "").lower() == own.repository:
        found.append((WorkItemRef(own.owner, own.repo, number, own.host), LinkSource.BRANCH))
    refs = closing_references(pr.body, repository=own.repository, host=host)
    found.extend((ref, LinkSource.KEYWORD) for ref in refs)
    return tuple(found)


def _links(
    found: Iterable[tuple[WorkItemRef, LinkSource]],
    recorded: AbstractSet[WorkItemRef],
    *,
    own: tuple[WorkItemRef, ...],
) -> tuple[Link, ...]:
    sources: dict[WorkItemRef, set[LinkSource]] = {}
    for ref, source in found:
        if ref not in own and (ref in sources or len(sources) < MAX_FOUND_LINKS):
            sources.setdefault(ref, set()).add(source)
    for ref in sorted(recorded):
        if ref not in own:
            sources.setdefault(ref, set()).add(LinkSource.RECORDED)
    base = own[0]
    return tuple(
        Link(ref, frozenset(kinds), cross_repository=not ref.same_repository(base))
        for ref, kinds in sources.items()
    )
