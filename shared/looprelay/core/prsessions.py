"""Session per pull request: the shared vocabulary, its resolution and the endpoint choice.

``routing.sessionPerPr`` is the operator's default; the phase-selection checklist lets
a work item freeze its own answer. Both speak the three names below, which
is why this module owns them and :mod:`looprelay.core.checklist` imports them.
The tmux session name of an endpoint lives here too, because an endpoint is what gets a session.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final, Literal

SessionPerPr = Literal["never", "cross-repository", "always"]
Endpoint = Literal["work-item", "pull-request"]

SESSION_PER_PR_NEVER: Final = "never"
SESSION_PER_PR_CROSS_REPOSITORY: Final = "cross-repository"
SESSION_PER_PR_ALWAYS: Final = "always"
SESSION_PER_PR_MODES: Final[tuple[SessionPerPr, ...]] = ("never", "cross-repository", "always")
DEFAULT_SESSION_PER_PR: Final[SessionPerPr] = "cross-repository"
_BY_NAME: Final[dict[str, SessionPerPr]] = {mode: mode for mode in SESSION_PER_PR_MODES}
_WARNING_VALUE_CAP = 80

REASON_NO_PULL_REQUEST: Final = "no-pull-request"
REASON_PULL_REQUEST_IS_WORK_ITEM: Final = "pull-request-is-the-work-item"
REASON_NEVER: Final = "session-per-pr-never"
REASON_SAME_REPOSITORY: Final = "same-repository"
REASON_NO_SEPARATE_CHECKOUT: Final = "no-separate-checkout"
REASON_OWN_SESSION: Final = "own-session"
REASON_NOT_TAKEN: Final = "pr-session-not-taken"
"""The pull request's own session waited past ``routing.prSessionWaitSeconds`` for a runner."""

TMUX_SESSION_PREFIX: Final = "loop-"
TMUX_NAME_MAX_CHARS: Final = 64
_HASH_CHARS = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")
# provider:owner/repo#N with plain names: the rewrite loses nothing, so no hash is needed.
_PLAIN_REF = re.compile(r"[a-z]+:[A-Za-z0-9_]+/[A-Za-z0-9_]+#[0-9]+")


@dataclass(frozen=True)
class EndpointChoice:
    """Which session receives a PR event, and why.

    ``declined`` is true when the PR qualified for its own session but the runner cannot give it
    a checkout of its own; the caller records ``session.pr_session_declined``.
    """

    endpoint: Endpoint
    ref: str
    reason: str
    declined: bool = False


def resolve_session_per_pr(raw: object) -> tuple[SessionPerPr, str | None]:
    """Resolve the operator's ``routing.sessionPerPr`` value to one of the three modes.

    Expects the raw configured value: a mode name (trimmed, lower-cased, so ``" ALWAYS "`` is
    ``always``; the predecessor warned on case, C13 scenario 26), a legacy boolean (``True`` →
    ``cross-repository``, ``False`` → ``never``) or None (absent → the default, silently).
    Anything else resolves to ``cross-repository`` (never the widest mode) with a warning
    naming the value and the valid set. Never raises.
    """
    if raw is None:
        return DEFAULT_SESSION_PER_PR, None
    if isinstance(raw, bool):
        return ("cross-repository" if raw else "never"), None
    if isinstance(raw, str) and raw.strip().lower() in _BY_NAME:
        return _BY_NAME[raw.strip().lower()], None
    return DEFAULT_SESSION_PER_PR, (
        f"routing.sessionPerPr: {_capped_repr(raw)} is not one of "
        f"{', '.join(SESSION_PER_PR_MODES)} (or true/false); using {DEFAULT_SESSION_PER_PR}"
    )


def effective_session_per_pr(
    frozen_choice: object, *, operator_default: SessionPerPr
) -> SessionPerPr:
    """Return the mode that routes one work item's PR events.

    Expects the work item's frozen choice as read from its stored record (None when it never
    answered) and the operator's resolved default. A frozen choice that is exactly one of the
    three modes wins for this work item only; anything else, such as a hand-edited
    ``"sometimes"``, ``""`` or ``3``, is ignored and the default applies.
    Never raises.
    """
    if isinstance(frozen_choice, str) and frozen_choice in _BY_NAME:
        return _BY_NAME[frozen_choice]
    return operator_default


def is_cross_repository(
    *, work_item_repository: str, pr_head_repository: str | None, pr_base_repository: str | None
) -> bool:
    """Tell whether a PR lives, even in part, outside the work item's repository.

    Expects ``owner/repo`` names. True when the PR's head repository (a fork) or its base
    repository (the PR's own home, which the predecessor compared) differs from the work
    item's, compared case-insensitively as GitHub does. Unknown sides (a deleted fork's head is
    null in GitHub's payload) do not count as different. Never raises.
    """
    home = work_item_repository.casefold()
    sides = (pr_head_repository, pr_base_repository)
    return any(side is not None and side.casefold() != home for side in sides)


def choose_endpoint(
    *,
    mode: SessionPerPr,
    work_item_ref: str,
    work_item_repository: str,
    pr_ref: str | None,
    pr_head_repository: str | None = None,
    pr_base_repository: str | None = None,
    pr_is_work_item: bool = False,
    pr_is_fork: bool = False,
    pr_checkout_available: bool,
    pr_session_stuck: bool = False,
) -> EndpointChoice:
    """Choose the session one event is delivered to: the work item's or the PR's own.

    Expects the effective mode (see :func:`effective_session_per_pr`), the work item's ref and
    repository, and, for a PR event, the PR's ref and repositories; ``pr_is_fork`` says the
    recorded head is a fork's (an issue comment's payload names no head). ``pr_checkout_available``
    says whether the runner can give the PR a working tree of its own (a workspace root, not the
    work item's tree, on the PR's head branch; ``pr_session_stuck`` that the PR's own
    session was queued and no runner took it within the bound. Never raises.
    """

    # Scenario: no PR, or the PR is the work item → the work item's session.
    # `never` → the work item's session. `cross-repository` with a same-repository PR → the
    # work item's session. Otherwise the PR is a candidate: its own session when it can have
    # its own checkout, else the work item's session, declined.
    def stay(reason: str, *, declined: bool = False) -> EndpointChoice:
        return EndpointChoice("work-item", work_item_ref, reason, declined)

    if pr_ref is None:
        return stay(REASON_NO_PULL_REQUEST)
    if pr_is_work_item:
        return stay(REASON_PULL_REQUEST_IS_WORK_ITEM)
    if mode == "never":
        return stay(REASON_NEVER)
    crosses = pr_is_fork or is_cross_repository(
        work_item_repository=work_item_repository,
        pr_head_repository=pr_head_repository,
        pr_base_repository=pr_base_repository,
    )
    if mode == "cross-repository" and not crosses:
        return stay(REASON_SAME_REPOSITORY)
    if not pr_checkout_available or pr_session_stuck:
        reason = REASON_NOT_TAKEN if pr_checkout_available else REASON_NO_SEPARATE_CHECKOUT
        return stay(reason, declined=True)
    return EndpointChoice("pull-request", pr_ref, REASON_OWN_SESSION)


def session_slug(ref: str) -> str:
    """Return a deterministic slug of a ref that tmux treats as plain text.

    Expects a non-empty ref such as ``github:octo/repo#15``. Every run of characters outside
    ``[A-Za-z0-9_]`` (``.`` and ``:`` are tmux target separators; ``/``, ``#`` and ``-`` are
    rewritten too) becomes one ``-``, with none leading or trailing, so the slug never starts
    like a flag. A plain ``provider:owner/repo#N`` with alphanumeric names keeps just that
    (``github-octo-repo-15``). Any other ref, or one too long for :data:`TMUX_NAME_MAX_CHARS`,
    also ends in ``-`` + 8 hex digits of the ref's SHA-256, because then two refs can rewrite
    alike (``a.b`` and ``a-b``). Raises ``ValueError`` for an empty ref.
    """
    if not ref:
        raise ValueError("a session slug needs a non-empty work item or pull request ref")
    readable = _UNSAFE.sub("-", ref).strip("-")
    room = TMUX_NAME_MAX_CHARS - len(TMUX_SESSION_PREFIX)
    if _PLAIN_REF.fullmatch(ref) and len(readable) <= room:
        return readable
    digest = hashlib.sha256(ref.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    kept = readable[: room - _HASH_CHARS - 1].rstrip("-")
    return f"{kept}-{digest}" if kept else digest


def tmux_session_name(ref: str) -> str:
    """Return the tmux session name of an endpoint: ``loop-`` + :func:`session_slug`.

    Expects a non-empty ref. The name matches ``^loop-[A-Za-z0-9_-]+$`` and is at most
    :data:`TMUX_NAME_MAX_CHARS` long. Raises ``ValueError`` for an empty ref.
    """
    return TMUX_SESSION_PREFIX + session_slug(ref)


def _capped_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _WARNING_VALUE_CAP else text[: _WARNING_VALUE_CAP - 3] + "..."
