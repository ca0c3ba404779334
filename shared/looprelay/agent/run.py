"""The runner agent's lifecycle: heartbeat, poll, apply, report, drain.

Scenario: the agent starts, heartbeats, and runs ``capacity`` workers. A free worker
long-polls, one at a time (the poll turn: an agent holds one poll open whatever its capacity,
and the next free worker polls as soon as a dispatch comes back). A dispatch it gets is applied
through the ledger (at most once, even across a crash) while a renewer keeps its lease; the
result is reported, and a report that cannot get through is retried until the server answers.
The server unreachable: back off with jitter, keep trying. First SIGTERM (``drain``): take
nothing new, finish what is in hand, report, exit. Second (``stop``): exit now; a lease left
behind lapses and the ledger reports it on the next start.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from looprelay.agent.apply import Applier, ApplyResult
from looprelay.agent.client import BadRequest, LeaseLost, RunnerClient, SecondAgent
from looprelay.agent.hosted import Hosted, look
from looprelay.agent.statedir import StateLock
from looprelay.core.replies import MAX_REPLY_CHARS, cut_to
from looprelay.errors import ConfigError, RunnerError, Transient, Unauthorized
from looprelay.wire.runner_api import MAX_AGENT_EVENTS, MAX_HELD_SESSIONS, Dispatch

log = logging.getLogger("looprelay.agent")

_DONE_VERBS = {
    "spawn": "spawned",
    "deliver": "pasted the event into",
    "terminate": "stopped",
    "cleanup": "cleaned up",
}
"""How the agent's log names what each dispatch kind did."""

MAX_BACKOFF_SECONDS = 30.0
POLL_TURN_CHECK_SECONDS = 0.2
"""How often a worker waiting for the poll turn looks whether the agent drains or stops."""
BACKOFF_JITTER = (0.5, 1.5)
"""Each backoff wait is its nominal value times a factor drawn from this range."""


@dataclass
class AgentState:
    """What ``looprelay runner status`` shows: held dispatches and the counters of each stage."""

    path: Path
    holding: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    note: str = "starting"
    hosted: dict[str, str] = field(default_factory=dict)
    """Session name -> its harness's state as the last heartbeat reported it."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def update(
        self,
        *,
        hold: Dispatch | None = None,
        release: str | None = None,
        count: str | None = None,
        note: str | None = None,
        hosted: dict[str, str] | None = None,
    ) -> None:
        """Change the state and write it to the status file (atomically)."""
        with self._lock:
            if hold is not None:
                self.holding[hold.dispatch_id] = f"{hold.kind} {hold.endpoint}"
            if release is not None:
                self.holding.pop(release, None)
            if count is not None:
                self.counts[count] = self.counts.get(count, 0) + 1
            if note is not None:
                self.note = note
            if hosted is not None:
                self.hosted = hosted
            snapshot = {
                "note": self.note,
                "holding": self.holding,
                "counts": self.counts,
                "hosted": self.hosted,
            }
            temporary = self.path.with_suffix(".tmp")
            temporary.write_text(json.dumps(snapshot, indent=2))
            temporary.replace(self.path)


@dataclass
class Agent:
    """One runner agent; :meth:`run` blocks until it is told to stop."""

    client: RunnerClient
    applier: Applier
    state: AgentState
    describe: Callable[[], dict[str, Any]]
    tmux_socket: str | None = None
    capacity: int = 2
    poll_wait_seconds: float = 25.0
    heartbeat_seconds: float = 30.0
    lease_renew_seconds: float = 20.0
    drain: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    locks: list[StateLock] = field(default_factory=list)
    """Its state (and workspace) directories, held until it stops."""
    serving: list[str] = field(default_factory=list)
    agent_id: str = ""
    """This process's id, new at each start, named on every heartbeat and poll ("": none)."""
    replaces: tuple[str, ...] = ()
    """The ids of the agents that held this state directory before (a restart), oldest
    first: the first heartbeat names each in turn until the server accepts one."""
    identity: StateLock | None = None
    """The state directory's lock, which records this agent's id once the server accepted
    it (None: nothing to record, as in tests)."""
    _in_hand: dict[str, str] = field(default_factory=dict, init=False)
    """Dispatch id -> the session it is being applied to (changed and read under _truth)."""
    _truth: threading.Lock = field(default_factory=threading.Lock, init=False)
    """Held while a heartbeat reads what the runner hosts and sends it, and while a result
    goes out: a heartbeat never tells the server of a world older than a result it has."""
    hostname: str = ""
    """This machine's name, for the status page ("": not said)."""
    harnesses: tuple[str, ...] = ()
    """The harnesses whose binaries it found: the server gives it no work for others."""
    _released: list[dict[str, str]] = field(default_factory=list, init=False)
    """Sessions stopped because they moved away, to be reported on the next heartbeat."""
    _told_exited: set[tuple[str, datetime | None]] = field(default_factory=set, init=False)
    """Harness exits (session, when) a heartbeat the server answered named: not named again
    (the server keeps what it was told, and a heartbeat that names none reads less)."""
    _poll_turn: threading.Lock = field(default_factory=threading.Lock, init=False)
    """Held by the one worker whose poll is open: idle, an agent keeps one request open at
    the server, not one per worker (the runner API's instances are counted by open polls)."""
    _plain_heartbeats: bool = field(default=False, init=False)
    """The server refused the failover and identity fields (it is older): heartbeats and
    polls go without them."""

    def run(self) -> int:
        """Run until drained or stopped; returns the exit code (1: credentials refused, or
        another live agent serves this runner)."""
        self.state.update(note="starting")  # `runner status` reads it from the first second
        log.info("runner agent started", extra={"runner_id": self.client.runner_id})
        for line in self.serving:
            log.info("serving %s", line)
        self._greet()
        threads = [threading.Thread(target=self._heartbeat_loop, daemon=True, name="heartbeat")]
        threads += [
            threading.Thread(target=self._work_loop, daemon=True, name=f"worker-{i}")
            for i in range(self.capacity)
        ]
        for thread in threads:
            thread.start()
        while not (self.drain.is_set() or self.stop.is_set()):
            self.stop.wait(0.2)
        # Draining: polls in flight are abandoned (a dispatch they still get is handed back);
        # what is being applied is finished and reported, unless a second signal stops us.
        self.state.update(note="draining")
        if not self.stop.is_set():
            log.info("draining, %d held; send again to stop now", len(self.state.holding))
        while self.state.holding and not self.stop.is_set():
            self.stop.wait(0.2)
        self.stop.set()
        self.state.update(note="stopped")
        for lock in self.locks:
            lock.release()
        log.info("runner agent stopped", extra={"runner_id": self.client.runner_id})
        return 1 if self.state.counts.get("refused") else 0

    def _greet(self) -> None:
        """Send this process's first heartbeat, flagged ``restarted``, before any worker polls.

        The server then offers again at once the leases this runner's previous process held
        (it was killed, or stopped hard), instead of after they lapse; a lease this process
        took itself must not be among them, hence before the first poll. Retries with the
        poll's backoff (doubling from 1 s to ``MAX_BACKOFF_SECONDS``, jittered) until answered,
        drained, stopped or refused. Refused as a second agent, it names the next agent its
        state directory recorded before giving up; accepted, it records its own id there.
        """
        backoff = 1.0
        while not (self.drain.is_set() or self.stop.is_set()):
            try:
                self._beat(restarted=True)
            except SecondAgent as exc:
                if len(self.replaces) < 2:
                    self._refused(exc)
                    return
                # The agent named was killed before the server heard of it: the one before.
                self.replaces = self.replaces[1:]
                continue
            except Transient as exc:
                log.warning("first heartbeat failed, retrying in about %.0fs: %s", backoff, exc)
                self.stop.wait(backoff * random.uniform(*BACKOFF_JITTER))  # noqa: S311 - jitter only
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
            except Unauthorized as exc:
                self._refused(exc)
                return
            else:
                self._accepted()
                return

    def _accepted(self) -> None:
        """The server knows this agent now: record it as the one the next start replaces."""
        self.replaces = ()
        if self.identity is None:
            return
        try:
            self.identity.confirm_agent_id(self.agent_id)
        except ConfigError as exc:
            # The next start then names the agents before this one too; the server takes it
            # once this one has been silent for runners.lostAfterSeconds.
            log.warning("could not record this agent's id: %s", exc)

    def _heartbeat_loop(self) -> None:
        while not self.stop.wait(self.heartbeat_seconds):
            try:
                self._beat()
            except Transient as exc:
                log.warning("heartbeat failed: %s", exc)
            except Unauthorized as exc:
                self._refused(exc)
                return

    def _beat(self, *, restarted: bool = False, follow_up: bool = True) -> None:
        """One heartbeat: what the agent is and hosts, each hosted session with its
        harness's state; sessions the answer says moved to another runner are stopped, and
        reported at once on one more heartbeat.

        A server older than these fields refuses them (400): from then on heartbeats go
        without them, so the runner stays live there. Raises ``Transient`` or
        ``Unauthorized`` as the client does.
        """
        with self._truth:
            in_hand = set(self._in_hand.values())
            hints = self._send_heartbeat(restarted=restarted, in_hand=in_hand)
        self.heartbeat_seconds = float(hints.get("heartbeat_seconds", self.heartbeat_seconds))
        if hints.get("released_leases"):
            log.info(
                "the server offers again the %s lease(s) this runner's previous process held",
                hints["released_leases"],
            )
        # A session being applied here as the heartbeat went out may be one this runner is
        # taking over: until its result is in, the server records it on the runner it left.
        # The next heartbeat, sent after the result, asks again.
        moved = [m for m in hints.get("moved") or [] if m.get("session_name") not in in_hand]
        if self._let_go(moved) and follow_up:
            self._beat(follow_up=False)

    def _send_heartbeat(self, *, restarted: bool, in_hand: set[str]) -> dict[str, Any]:
        status = dict(self.describe())
        hosted = look(
            self.applier.terminal,
            self.applier.ledger.all_sessions()[:MAX_HELD_SESSIONS],
            in_hand=in_hand,
        )
        self.state.update(hosted={h.session.session_name: h.shown() for h in hosted})
        # What runs, not what the ledger remembers: the server's `runners list` shows it.
        status["sessions"] = sum(1 for h in hosted if h.harness == "running")
        released, self._released = self._released, []
        # An exit is named by its session and moment: a respawn that dies later is news.
        exited = {(h.session.session_name, h.exited_at) for h in hosted if h.harness == "exited"}
        told = [h for h in hosted if (h.session.session_name, h.exited_at) not in self._told_exited]
        if not self._plain_heartbeats:
            status |= self._failover_fields(restarted=restarted, released=released, held=told)
        try:
            answer = self.client.heartbeat(status)
            self._told_exited = exited
            return answer
        except BadRequest as exc:
            if self._plain_heartbeats:
                raise
            log.warning(
                "the server refused this agent's failover report (%s); heartbeats go without "
                "it, so leases of a restart lapse on their own and moved sessions are not "
                "stopped here",
                exc,
            )
            self._plain_heartbeats = True
            return self.client.heartbeat(dict(self.describe()))
        except Transient:
            self._released = released + self._released  # said on the next one instead
            raise

    def _failover_fields(
        self, *, restarted: bool, released: list[dict[str, str]], held: list[Hosted]
    ) -> dict[str, object]:
        """What a heartbeat adds for failover, this agent's identity (its host and harnesses
        too) and what it hosts (every session, even none: ``held_all``), each other field
        only when it has something to say; a server older than these refuses them all."""
        fields: dict[str, object] = {"restarted": True} if restarted else {}
        if self.agent_id:
            fields["agent_id"] = self.agent_id
        if self.replaces:
            fields["replaces"] = self.replaces[0]
        if self.hostname:
            fields["hostname"] = self.hostname
        if self.harnesses:
            fields["harnesses"] = list(self.harnesses)
        fields["held"] = [hosted.to_wire() for hosted in held]
        fields["held_all"] = True
        if released:
            fields["released"] = released
        return fields

    def _let_go(self, moved: list[dict[str, str]]) -> bool:
        """Stop each session the server says moved to another runner; whether any was."""
        for entry in moved:
            local = self.applier.ledger.session(entry.get("session_name", ""))
            if local is None:
                continue
            try:
                outcome = self.applier.let_go(local)
            except RunnerError as exc:
                log.warning(
                    "%s moved to runner %s, but stopping it here failed (tried again on the "
                    "next heartbeat): %s",
                    local.endpoint,
                    entry.get("runner_id"),
                    exc,
                )
                continue
            log.warning(
                "%s moved to runner %s while this runner was away; stopped here: %s",
                local.endpoint,
                entry.get("runner_id"),
                outcome,
            )
            self._released.append(
                {
                    "work_item": local.work_item,
                    "endpoint": local.endpoint,
                    "session_name": local.session_name,
                    "outcome": outcome[:300],
                }
            )
        return bool(self._released)

    def _work_loop(self) -> None:
        while not (self.drain.is_set() or self.stop.is_set()):
            if not self._poll_turn.acquire(timeout=POLL_TURN_CHECK_SECONDS):
                continue  # another worker is polling; look at drain and stop again
            try:
                dispatch = self._poll()
            finally:
                self._poll_turn.release()
            if dispatch is not None and self.drain.is_set():
                self._hand_back(dispatch)
            elif dispatch is not None:
                self._handle(dispatch)

    def _poll(self) -> Dispatch | None:
        """One long poll, retried with backoff while the server is unreachable (the turn is
        kept meanwhile, so the agent backs off as one); None when it timed out empty, or the
        agent drains, stops or was refused."""
        backoff = 1.0
        while not (self.drain.is_set() or self.stop.is_set()):
            agent_id = "" if self._plain_heartbeats else self.agent_id
            try:
                dispatch = self.client.poll(self.poll_wait_seconds, agent_id=agent_id)
            except Transient as exc:
                if isinstance(exc, BadRequest) and agent_id:
                    # A server older than the agent id refuses it: poll as before, unnamed.
                    log.warning("the server refused this agent's id on a poll (%s)", exc)
                    self._plain_heartbeats = True
                    continue
                # Server down: wait with jitter so many agents do not return in step.
                log.warning("poll failed, retrying in about %.0fs: %s", backoff, exc)
                self.stop.wait(backoff * random.uniform(*BACKOFF_JITTER))  # noqa: S311 - jitter only
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                continue
            except Unauthorized as exc:
                self._refused(exc)
                return None
            if backoff > 1.0:
                log.info("reconnected to the server; polling again")
            return dispatch
        return None

    def _handle(self, dispatch: Dispatch) -> None:
        log.info(
            "leased %s for %s (%s)",
            dispatch.kind,
            dispatch.endpoint,
            dispatch.dispatch_id,
            extra={"work_item": dispatch.work_item},
        )
        self.state.update(hold=dispatch, count="leased", note="applying")
        with self._truth:
            self._in_hand[dispatch.dispatch_id] = dispatch.session_name
        done = threading.Event()
        renewer = threading.Thread(target=self._renew_loop, args=(dispatch, done), daemon=True)
        renewer.start()
        try:
            result = self.applier.apply(dispatch)
        finally:
            done.set()
        self._log_result(dispatch, result)
        self._report(dispatch, result)
        with self._truth:
            self._in_hand.pop(dispatch.dispatch_id, None)
            # Whatever becomes of its harness now is news, even an exit like the last told.
            self._told_exited = {t for t in self._told_exited if t[0] != dispatch.session_name}
        self.state.update(release=dispatch.dispatch_id, count=result.status, note="polling")

    def _log_result(self, dispatch: Dispatch, result: ApplyResult) -> None:
        """One line a person reads: what was done to which session, or why it failed."""
        extra = {"work_item": dispatch.work_item}
        if result.status == "failed":
            detail = " ".join(result.detail.split())[:200]
            log.warning(
                "%s for %s failed: %s%s",
                dispatch.kind,
                dispatch.endpoint,
                result.reason or "unknown",
                f" ({detail})" if detail else "",
                extra=extra,
            )
            return
        session = result.tmux_target or dispatch.session_name
        done = _DONE_VERBS.get(dispatch.kind, f"applied {dispatch.kind} to")
        respawned = dispatch.kind == "deliver" and result.status == "spawned"
        if respawned:  # its harness was gone: the event is the new one's boot prompt
            done = "respawned"
        line = f"{done} session {session} for {dispatch.endpoint}"
        if result.tmux_target and self.tmux_socket and (dispatch.kind == "spawn" or respawned):
            line += f"; attach: tmux -L {self.tmux_socket} attach -t {result.tmux_target}"
        log.info(line, extra=extra)

    def _hand_back(self, dispatch: Dispatch) -> None:
        """A dispatch that arrived after the drain began goes back untouched."""
        self._report(
            dispatch,
            ApplyResult(
                status="failed",
                reason="draining",
                retryable=True,
                detail="the agent is draining; not applied",
            ),
        )

    def _renew_loop(self, dispatch: Dispatch, done: threading.Event) -> None:
        while not done.wait(self.lease_renew_seconds):
            try:
                self.client.renew(dispatch.dispatch_id)
            except (Transient, LeaseLost) as exc:
                log.warning("lease renewal of %s failed: %s", dispatch.dispatch_id, exc)

    def _report(self, dispatch: Dispatch, result: ApplyResult) -> None:
        """Report until the server answers; its own stop event is not the agent's, so a
        final report still goes out while draining (bounded by the second signal)."""
        body = {
            "status": result.status,
            "reason": result.reason,
            "retryable": result.retryable,
            "detail": result.detail[:2000],
            "session_id": result.session_id or None,
            "tmux_target": result.tmux_target or None,
            "resumed": result.resumed,
            "tmux_socket": self.tmux_socket,
        }
        if result.reply:
            # Sent only when there is one, so a server that predates replies still takes it.
            body["reply"] = cut_to(result.reply, MAX_REPLY_CHARS)
        if result.events:
            body["events"] = list(result.events[:MAX_AGENT_EVENTS])
        delay = 1.0
        while True:
            try:
                with self._truth:
                    self.client.report(dispatch.dispatch_id, body)
                return
            except LeaseLost as exc:
                log.warning("result of %s not counted: %s", dispatch.dispatch_id, exc)
                return
            except Unauthorized as exc:
                self._refused(exc)
                return
            except Transient as exc:
                log.warning("report failed, retrying: %s", exc)
                if self.stop.wait(delay):
                    return
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)

    def _refused(self, exc: Exception) -> None:
        if isinstance(exc, SecondAgent):
            log.error("stopping: another agent serves this runner: %s", exc)
        else:
            log.error("the server refused this runner: %s", exc)
        self.state.update(count="refused", note=f"refused: {exc}")
        self.stop.set()
