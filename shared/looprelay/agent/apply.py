"""Applying one dispatch the agent holds: exactly what it names, at most once.

No HTTP here: a dispatch comes in, an :class:`ApplyResult` goes out, and the local ledger keeps
the two together so a restart reports instead of re-applying.

Scenario (tmux), for ``spawn`` and ``deliver`` alike:
  - the session's pane is live         -> paste the prompt into it (``delivered``);
  - it is dead or missing              -> (re)spawn it, ``--resume <id>`` for a deliver or a
    ``resume: true`` spawn (``spawned``, ``resumed``), then paste the prompt as its boot prompt
    (never in argv, which any local user can read in ``/proc``);
  - the resumed harness dies within ``resume_probe_seconds`` -> spawn fresh with a new id;
  - the harness exits before its boot prompt, or within ``spawn_probe_seconds`` after it ->
    ``failed``/``harness-failed`` with its exit status and last screen lines, never ``spawned``,
    and a short note for the work item with its last line;
  - the stored id is not a UUID        -> never passed on; fresh id, reason ``resume-failed``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, asdict, dataclass, field, fields, replace
from functools import partial
from pathlib import Path

from looprelay.agent import harness, harnesses
from looprelay.agent.ledger import Ledger, LedgerEntry, LocalSession, ResultRecord
from looprelay.agent.prepare import Note, SessionPreparer
from looprelay.agent.process import run_headless
from looprelay.agent.sandbox import Sandbox
from looprelay.agent.tmux import SESSION_NAME, TmuxTerminal
from looprelay.agent.workspaces import Checkout
from looprelay.core.replies import SPAWN_FAILED, failure_note
from looprelay.core.status import HARNESS_FAILED
from looprelay.errors import RunnerError
from looprelay.wire.runner_api import DISPATCH_KINDS, MAX_DETAIL_CHARS, Dispatch

SPAWNED, DELIVERED, DONE, FAILED = "spawned", "delivered", "done", "failed"
RUNNER_KINDS = ("tmux", "process")
SAID_LINES = 5
"""How many of a dead harness's last screen lines its note on the work item starts from."""
RETRYABLE_REASONS = frozenset({"tmux-failed", "session-missing"})
"""Failures after which nothing reached the harness, so the dispatch may be offered again."""


@dataclass(frozen=True)
class ApplyResult:
    """The outcome of one dispatch, as reported to the server.

    ``status`` is ``spawned``, ``delivered``, ``done`` or ``failed``; ``reason`` is
    machine-readable and, on success, empty unless the session id had to be replaced
    (``resume-failed``, ``invalid-session-id``); ``session_id`` is the one actually in use;
    ``reply`` is what a headless turn leaves on the work item (its answer, or a short note that
    it failed), empty when there is nothing to post.
    """

    status: str
    reason: str = ""
    retryable: bool = False
    detail: str = ""
    session_id: str = ""
    tmux_target: str = ""
    resumed: bool = False
    reply: str = ""
    events: tuple[Mapping[str, object], ...] = ()
    """Notes for the event log (``workspace.prepared``, ``workspace.trusted``, ...)."""

    def to_record(self) -> dict[str, object]:
        """Return the result as the JSON object the ledger stores."""
        return asdict(self)

    @classmethod
    def from_record(cls, record: ResultRecord) -> ApplyResult:
        """Rebuild a result the ledger stored (the inverse of :meth:`to_record`)."""
        known = {f.name: record[f.name] for f in fields(cls) if f.name in record}
        known["events"] = tuple(known.get("events", ()))
        return cls(**known)


@dataclass
class Applier:
    """Applies dispatches through ``terminal`` (tmux) or a headless process, in the working
    trees ``preparer`` gives each session.

    ``harness_args`` are the runner's own extra argv per harness (``runner run --harness-arg``;
    a dispatch never carries any); ``kill_grace_seconds``
    is the SIGTERM-to-SIGKILL grace of terminate; ``headless_timeout_seconds`` bounds one headless
    turn; ``resume_probe_seconds`` is how long a resumed harness must stay up before its id is
    trusted; ``spawn_probe_seconds`` how long every (re)spawned harness must stay up after its
    boot prompt to be reported running; ``new_uuid`` makes fresh session ids; ``sandbox`` says
    which sessions run in bubblewrap (none by default; ``runner run`` sandboxes fork pull
    requests' sessions); ``session_env`` gives each harness started its session's identity
    (none for a fork's head: an untrusted tree does not speak as the App).
    """

    terminal: TmuxTerminal
    ledger: Ledger
    preparer: SessionPreparer
    _: KW_ONLY
    kill_grace_seconds: float = 5.0
    keep_session_on_terminate: bool = True
    headless_timeout_seconds: float = 1_800.0
    resume_probe_seconds: float = 3.0
    spawn_probe_seconds: float = 1.0
    new_uuid: Callable[[], uuid.UUID] = uuid.uuid4
    sandbox: Sandbox = field(default_factory=Sandbox)
    session_env: Callable[[Dispatch], Mapping[str, str]] = lambda _d: {}
    """The variables a harness it starts speaks for its session with (``agent.session_env``)."""

    @property
    def harness_args(self) -> Mapping[str, Sequence[str]]:
        """The runner's own extra argv per harness."""
        return self.preparer.harness_args

    def apply(self, dispatch: Dispatch) -> ApplyResult:
        """Apply ``dispatch`` once and return its result; a seen dispatch returns its old result.

        One stuck half-way by a crash is reported ``failed``/``interrupted``, never redone. Every
        ``RunnerError`` becomes a ``failed`` result; anything else propagates (a bug) and leaves
        the claim, so the dispatch reports ``interrupted`` if offered again. Blocks for at most
        the terminate grace, the resume probe or the headless timeout the dispatch needs.
        """
        prior = self.ledger.claim(dispatch.dispatch_id)
        if prior is not None:
            return self._replay(prior)
        try:
            result = self._apply(dispatch)
        except HarnessFailed as exc:
            note = failure_note(dispatch.harness, exc.said, what=SPAWN_FAILED)
            result = replace(_failed(exc.reason, str(exc)), reply=note)
        except RunnerError as exc:
            result = _failed(exc.reason, str(exc))
        self.ledger.record_result(dispatch.dispatch_id, result.to_record())
        return result

    def _replay(self, prior: LedgerEntry) -> ApplyResult:
        if prior.result is not None:
            return ApplyResult.from_record(prior.result)
        result = _failed("interrupted", "the agent stopped while applying it; not applied again")
        self.ledger.record_result(prior.dispatch_id, result.to_record())
        return result

    def _apply(self, d: Dispatch) -> ApplyResult:
        _check(d)
        if d.kind in ("pause", "resume"):
            return ApplyResult(DONE, detail=f"{d.kind}: nothing to do on the runner")
        if d.kind == "cleanup":
            return self._cleanup(d)
        if d.kind == "terminate":
            return self._terminate(d)
        self.sandbox.check(untrusted=untrusted(d))  # before any tree is made for it
        if d.runner_kind == "process":
            return self._headless(d)
        if d.kind == "spawn":
            return self._host(d, stored_id=d.session_id, resume=d.resume)
        local = self.ledger.session(d.session_name)
        return self._host(d, stored_id=local.session_id if local else d.session_id, resume=True)

    def _host(self, d: Dispatch, *, stored_id: str, resume: bool) -> ApplyResult:
        name, pane = d.session_name, self.terminal.pane(d.session_name)
        state = None if pane is None else pane.dead
        if state is False:  # scenario 36: a live occupant gets the paste
            kind = harnesses.get(d.harness)
            self.terminal.paste(
                name,
                d.prompt,
                listed=pane,
                confirm=kind.confirm_submit,
                placeholder=kind.paste_placeholder,
            )
            local = self.ledger.session(name)
            sid = local.session_id if local else stored_id
            return ApplyResult(DELIVERED, session_id=sid, tmux_target=name, detail="pasted")
        argv_for = partial(
            harness.interactive_argv,
            binary=self.preparer.binary(d.harness),
            harness=d.harness,
            extra=self.harness_args.get(d.harness, ()),
        )
        prepared = self.preparer.prepare(d, trust=True)
        notes, cwd = list(prepared.notes), prepared.checkout.path
        fresh = str(self.new_uuid())
        session_id, reason = harness.usable_session_id(stored_id, resume=resume, fresh=fresh)
        resumed = resume and not reason
        if not resumed:
            session_id, swapped = self.preparer.usable_fresh_id(d, session_id, fresh)
            if swapped:
                reason = swapped
                notes.append(Note("session.id_replaced", {"was": stored_id, "now": session_id}))
        argv = self._contain(d, argv_for(session_id=session_id, resume=resumed), cwd, notes)
        # Known before the harness starts, so a spawn that fails still leaves its tree to cleanup.
        self._remember(d, session_id, prepared.checkout)
        if state is True:
            self.terminal.kill(name)
        env, kind = self._identity(d), harnesses.get(d.harness)
        self.terminal.spawn(name, cwd=cwd, argv=argv, env=env, unset=kind.hosted_unset)
        if resumed and self.terminal.wait_dead(name, self.resume_probe_seconds):
            session_id, reason, resumed = fresh, "resume-failed", False
            self.terminal.kill(name)
            again = self._contain(d, argv_for(session_id=fresh, resume=False), cwd, [])
            self.terminal.spawn(name, cwd=cwd, argv=again, env=env, unset=kind.hosted_unset)
        self._remember(d, session_id, prepared.checkout)
        # A fresh harness knows nothing of the work item: a deliver's event alone is not enough.
        boot = d.prompt if resumed or not d.boot_prompt else d.boot_prompt
        self._boot(name, boot, kind)
        detail = f"spawned in {cwd}" + ("; started fresh" if reason else "")
        return ApplyResult(
            SPAWNED,
            reason=reason,
            detail=detail,
            session_id=session_id,
            tmux_target=name,
            resumed=resumed,
            events=tuple(note.to_record() for note in notes),
        )

    def _boot(self, name: str, prompt: str, kind: harnesses.Harness) -> None:
        """Paste the boot prompt into the harness just started in ``name`` (the paste waits
        until it reads its terminal), then probe it for ``spawn_probe_seconds``: a harness that
        exits before or just after is never reported as running.

        Raises ``HarnessFailed``, its detail the exit status and the pane's last lines (the
        harness's own words: not onboarded, a bad flag), and ``RunnerError`` as paste does.
        """
        try:
            self.terminal.paste(
                name, prompt, confirm=kind.confirm_submit, placeholder=kind.paste_placeholder
            )
        except RunnerError as exc:
            if exc.reason != HARNESS_FAILED:
                raise
            raise self._exited(name, "before it could be given the prompt") from exc
        if self.terminal.wait_dead(name, self.spawn_probe_seconds):
            raise self._exited(name, "right after it was given the prompt")

    def _exited(self, name: str, when: str) -> HarnessFailed:
        code = self.terminal.exit_status(name)
        status = "" if code is None else f" (status {code})"
        last = self.terminal.last_lines(name)
        shown = f"; its last lines:\n{last}" if last else "; its pane showed nothing"
        # The last few lines, read from their start: Claude puts its reason first ("Unable to
        # connect to Anthropic services") and its advice after.
        said = " · ".join(last.splitlines()[-SAID_LINES:]) if last else f"exited{status} {when}"
        return HarnessFailed(f"the harness in {name} exited{status} {when}{shown}", said=said)

    def _terminate(self, d: Dispatch) -> ApplyResult:
        if d.runner_kind == "process":
            return ApplyResult(DONE, detail="no process runs between headless turns")
        outcome = self.terminal.terminate_harness(d.session_name, self.kill_grace_seconds)
        keep = self.keep_session_on_terminate
        if not keep:
            self.terminal.kill(d.session_name)
        detail = f"harness {outcome}; tmux session {'kept' if keep else 'killed'}"
        return ApplyResult(DONE, detail=detail, tmux_target=d.session_name if keep else "")

    def let_go(self, session: LocalSession) -> str:
        """Stop hosting ``session``, which the server says now lives on another runner: end
        its harness and tmux session and forget it; its checkout stays (it may hold work not
        yet pushed). Returns what happened, for the server's event log.

        Blocks for at most the terminate grace and tmux's deadlines. Raises ``RunnerError``
        (``tmux-failed``, ``tmux-timeout``, ``terminate-failed``) and keeps the session then,
        so a later heartbeat tries again.
        """
        outcome = "no process runs between headless turns"
        if session.runner_kind == "tmux":
            ended = self.terminal.terminate_harness(session.session_name, self.kill_grace_seconds)
            self.terminal.kill(session.session_name)
            outcome = f"harness {ended}; tmux session killed"
        self.ledger.forget(session.session_name)
        return f"{outcome}; checkout kept at {session.checkout}"

    def _cleanup(self, d: Dispatch) -> ApplyResult:
        sessions = self.ledger.sessions_for(d.work_item)
        names = sorted({s.session_name for s in sessions} | {d.session_name})
        for name in names:
            self.terminal.kill(name)
        workspaces = self.preparer.workspaces
        keep = d.closing and workspaces.keep_on_close
        # Only trees the agent made; Workspaces.remove refuses anything outside its roots.
        removed = [
            s.checkout
            for s in sessions
            if s.created_checkout and not keep and workspaces.remove(Path(s.checkout))
        ]
        for session in sessions:
            self.ledger.forget(session.session_name)
        kept = "kept on close" if keep else f"removed {len(removed)}"
        notes = [Note("workspace.cleaned", {"checkout": path}) for path in removed]
        return ApplyResult(
            DONE,
            detail=f"killed {len(names)} tmux session(s); checkouts {kept}",
            events=tuple(note.to_record() for note in notes),
        )

    def _headless(self, d: Dispatch) -> ApplyResult:
        binary = self.preparer.binary(d.harness)
        prepared = self.preparer.prepare(d, trust=False)  # no trust dialog without a TUI
        checkout, notes = prepared.checkout, list(prepared.notes)
        local, fresh = self.ledger.session(d.session_name), str(self.new_uuid())
        session_id, resume, reason = harness.headless_session(
            d.harness,
            known=local.session_id if local else None,
            offered=d.session_id,
            resume=d.resume,
            fresh=fresh,
        )
        if session_id is not None and not resume:
            session_id, swapped = self.preparer.usable_fresh_id(d, session_id, fresh)
            reason = reason or swapped
        argv = harness.headless_argv(
            binary=binary,
            harness=d.harness,
            session_id=session_id,
            resume=resume,
            extra=self.harness_args.get(d.harness, ()),
        )
        argv = self._contain(d, argv, checkout.path, notes)
        events = tuple(note.to_record() for note in notes)
        if local is None:  # the tree is ours even if this turn fails; no id to resume yet
            self._remember(d, "", checkout)
        run = run_headless(
            argv,
            cwd=checkout.path,
            prompt=d.prompt,
            timeout_seconds=self.headless_timeout_seconds,
            env=self._identity(d),
        )
        turn = harnesses.get(d.harness).parse_turn(
            exit_code=run.exit_code, stdout=run.stdout_tail, stderr=run.stderr_tail
        )
        if not turn.ok:
            # The harness's own message first: the event log keeps only the detail's start.
            detail = f"{d.harness}: {turn.error} (exit {run.exit_code})"
            if run.stderr_tail.strip():
                detail += f"; stderr: {run.stderr_tail[-400:]}"
            failed = _failed(HARNESS_FAILED, detail)
            return replace(failed, reply=failure_note(d.harness, turn.error), events=events)
        printed = turn.session_id if harness.is_session_id(turn.session_id) else ""
        used = session_id or printed
        if used:
            self._remember(d, used, checkout)
        detail = f"exit 0; {turn.subtype or 'result'}; answered in {len(turn.result)} characters"
        return ApplyResult(
            DONE,
            reason=reason,
            detail=detail,
            session_id=used,
            resumed=resume,
            reply=turn.result,
            events=events,
        )

    def _identity(self, d: Dispatch) -> Mapping[str, str]:
        """The session's identity for the harness about to start; none for a fork's head,
        whose content nobody vouched for beyond its approved sha."""
        return {} if untrusted(d) else self.session_env(d)

    def _contain(self, d: Dispatch, argv: list[str], tree: Path, notes: list[Note]) -> list[str]:
        """``argv`` inside the sandbox when this session runs in one (noted), else as it is."""
        fork = untrusted(d)
        if not self.sandbox.wraps(untrusted=fork):
            return argv
        wrapped = self.sandbox.wrap(argv, harness_name=d.harness, tree=tree, trusted=not fork)
        notes.append(Note("session.sandboxed", {"tree": str(tree), "mode": self.sandbox.mode}))
        return wrapped

    def _remember(self, d: Dispatch, session_id: str, checkout: Checkout) -> None:
        self.ledger.remember(
            LocalSession.from_dispatch(
                d, session_id=session_id, checkout=checkout.path, created_checkout=checkout.created
            )
        )


class HarnessFailed(RunnerError):
    """A (re)spawned harness died before or right after its boot prompt; ``said`` is its last
    screen line (its own words), for the note on the work item."""

    def __init__(self, message: str, *, said: str) -> None:
        super().__init__(message, reason=HARNESS_FAILED)
        self.said = said


def untrusted(d: Dispatch) -> bool:
    """Tell whether ``d``'s session runs a fork's pull request head (untrusted, SPEC §3)."""
    return d.head is not None and d.head.fork


def _check(d: Dispatch) -> None:
    if d.kind not in DISPATCH_KINDS or d.runner_kind not in RUNNER_KINDS:
        raise RunnerError(
            f"cannot apply {d.kind!r} by {d.runner_kind!r}", reason="invalid-dispatch"
        )
    if not SESSION_NAME.fullmatch(d.session_name):
        raise RunnerError("the session name is not loop-[A-Za-z0-9_-]+", reason="invalid-dispatch")
    hosted = d.kind in ("spawn", "deliver") and d.runner_kind == "tmux"
    if hosted and d.harness not in harness.INTERACTIVE_HARNESSES:
        raise RunnerError(
            f"{d.harness[:40]} cannot be hosted in tmux; use runner kind 'process'",
            reason="harness-unsupported",
        )


def _failed(reason: str, detail: str) -> ApplyResult:
    retryable, detail = reason in RETRYABLE_REASONS, detail[:MAX_DETAIL_CHARS]
    return ApplyResult(FAILED, reason=reason, retryable=retryable, detail=detail)
