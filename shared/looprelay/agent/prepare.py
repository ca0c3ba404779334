"""What a session needs before its harness starts: its own working tree, the loop's skill, and
the harness's consent to run there (Claude's folder trust), each reported as a note for the
event log. What a harness needs comes from its module in ``agent/harnesses``; nothing here names
one.

The tree comes first and is required: without it there is nothing to work on, so a git failure
fails the dispatch (``workspace-failed``). The skill and the trust are best effort, as the
predecessor's were: a failure is reported (``skill.install_failed``,
``workspace.trust_failed``) and the spawn goes ahead, because a session that shows a dialog is
still one an operator can attach to and fix.

An untrusted tree (a fork's pull request, issue 21) is different: it is prepared by
``Workspaces`` on every spawn, never recalled from the ledger as is, so its agent config is made
the base's each time before a harness starts (``workspace.untrusted_config_restored`` says what
changed and where the pull request's versions are kept). Only then are the skill installed and
the folder trusted, and Claude's entry for that folder is told not to enable the project's MCP
servers by itself (``enableAllProjectMcpServers`` false, ``enabledMcpjsonServers`` empty),
headless turns included.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from looprelay.agent import harness, harnesses
from looprelay.agent.harnesses.base import Harness, is_session_id
from looprelay.agent.ledger import Ledger
from looprelay.agent.skill import install_skill
from looprelay.agent.workspaces import Checkout, Workspaces
from looprelay.core.workitems import parse_ref
from looprelay.errors import RunnerError
from looprelay.wire.runner_api import MAX_AGENT_EVENT_VALUE_CHARS, Dispatch


@dataclass(frozen=True)
class Note:
    """One event the agent saw while applying, reported with the result for the event log."""

    name: str
    data: Mapping[str, str]

    def to_record(self) -> dict[str, object]:
        """The note as the flat JSON object the ledger and the runner API carry."""
        return {
            "name": self.name,
            "data": {
                key: str(value)[:MAX_AGENT_EVENT_VALUE_CHARS] for key, value in self.data.items()
            },
        }


@dataclass(frozen=True)
class Preparation:
    """Where a session runs, and what preparing it did."""

    checkout: Checkout
    notes: tuple[Note, ...] = ()


@dataclass
class SessionPreparer:
    """Prepares sessions with ``workspaces``; ``environ`` locates the harness's own files
    (tests; default: this process's, which the harness inherits)."""

    workspaces: Workspaces
    ledger: Ledger
    harness_args: Mapping[str, Sequence[str]]
    environ: Mapping[str, str] | None = None
    served: frozenset[str] | None = None
    """The harnesses this runner runs (``runner run --harness``); None: any on ``PATH``."""

    def binary(self, harness_name: str) -> str:
        """Return the absolute path of ``harness_name``'s binary. Raises ``RunnerError``
        ``harness-missing`` when this runner does not serve it or it is not on ``PATH``."""
        if self.served is not None and harness_name not in self.served:
            raise RunnerError(
                f"this runner serves only {', '.join(sorted(self.served))} (--harness), "
                f"not {harness_name}",
                reason="harness-missing",
            )
        return harness.resolve_binary(harness_name)

    def prepare(self, d: Dispatch, *, trust: bool) -> Preparation:
        """Return ``d``'s session tree with the skill installed where its harness reads it
        and, with ``trust``, the folder trusted in the harness's files. Raises ``RunnerError``
        when the tree cannot be had or the harness is unknown."""
        found = harnesses.get(d.harness)
        checkout, notes = self._checkout(d)
        if found.skill_dir:
            notes += self._skill(checkout.path, found.skill_dir)
        if trust or not checkout.trusted:
            args = self.harness_args.get(d.harness, ())
            notes += self._trust(found, checkout.path, args, trust=trust, trusted=checkout.trusted)
        return Preparation(checkout, tuple(notes))

    def usable_fresh_id(self, d: Dispatch, session_id: str, fresh: str) -> tuple[str, str]:
        """Return the id a fresh spawn starts with, and a reason when it was swapped.

        Claude refuses an id it has a transcript for ("Session ID ... is already in use"), as
        after a store reset or with two deployments on one machine; such an id gets ``fresh``.
        """
        if not is_session_id(session_id):
            return session_id, ""
        try:
            taken = harnesses.get(d.harness).id_in_use(session_id, self._environ())
        except RunnerError:
            return session_id, ""  # unreadable state: let Claude say so itself
        return (fresh, "session-id-in-use") if taken else (session_id, "")

    def _checkout(self, d: Dispatch) -> tuple[Checkout, list[Note]]:
        number = pull_request_number(d)
        trusted = self.workspaces.trusted(pull_request=number, head=d.head)
        local = self.ledger.session(d.session_name)
        if trusted and local is not None and Path(local.checkout).is_dir():
            return Checkout(path=Path(local.checkout), created=local.created_checkout), []
        checkout = self.workspaces.prepare(
            repository=d.repository, session_name=d.session_name, pull_request=number, head=d.head
        )
        data = {
            "checkout": str(checkout.path),
            "strategy": checkout.strategy,
            "branch": checkout.branch,
            "commit": checkout.commit,
            "reused": str(checkout.reused).lower(),
            "trusted": str(checkout.trusted).lower(),
        }
        if checkout.kept:
            data["kept"] = checkout.kept
        notes = [Note("workspace.prepared", data)]
        restored = checkout.restored
        if restored is not None and restored.changed():
            restored_data = {
                "checkout": str(checkout.path),
                "replaced": ", ".join(restored.replaced),
                "removed": ", ".join(restored.removed),
                "added": ", ".join(restored.added),
                "kept_at": str(restored.kept_at),
            }
            notes.append(Note("workspace.untrusted_config_restored", restored_data))
        return checkout, notes

    def _environ(self) -> Mapping[str, str]:
        return os.environ if self.environ is None else self.environ

    def _skill(self, directory: Path, skills: tuple[str, ...]) -> list[Note]:
        try:
            written = install_skill(directory, skills)
        except RunnerError as exc:
            return [Note("skill.install_failed", {"cwd": str(directory), "error": str(exc)})]
        if not written:
            return []
        return [Note("skill.installed", {"cwd": str(directory), "files": str(len(written))})]

    def _trust(
        self,
        found: Harness,
        directory: Path,
        args: Sequence[str],
        *,
        trust: bool,
        trusted: bool,
    ) -> list[Note]:
        try:
            changed = found.prepare(
                directory, harness_args=args, environ=self._environ(), trust=trust, trusted=trusted
            )
        except RunnerError as exc:
            return [Note("workspace.trust_failed", {"cwd": str(directory), "error": str(exc)})]
        if not changed:
            return []
        return [Note("workspace.trusted", {"cwd": str(directory), "applied": ", ".join(changed)})]


def pull_request_number(d: Dispatch) -> int | None:
    """Return the PR number of a pull request's own session, None for a work item's session.

    Raises ``RunnerError`` ``invalid-dispatch`` for an endpoint that is not a ref.
    """
    if d.endpoint == d.work_item:
        return None
    try:
        return parse_ref(d.endpoint).number
    except ValueError as exc:
        raise RunnerError(str(exc), reason="invalid-dispatch") from exc
