"""tmux on the agent's own socket: the one module that runs tmux.

Each call is one ``tmux -L <socket> -f <config> ...`` client, run with a deadline
(``command_timeout_seconds``): a tmux server that stops answering (stopped, wedged) makes the
call fail with ``tmux-timeout`` instead of stalling the work item for good. libtmux, used
before, has no timeout per command, and the agent needs nothing else from it.

Targets are exact: a session as ``=name`` (tmux would otherwise match a prefix of another name),
a pane by its ``%id``. An argument ending in ``;`` is escaped (tmux splits its own argv there,
even after ``--``) and ``-c`` is format-escaped (tmux expands ``#{...}`` in it).
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import termios
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from looprelay.agent.children import Overran, run_child
from looprelay.core.attach import attach_command
from looprelay.core.status import HARNESS_FAILED
from looprelay.errors import ConfigError, RunnerError

SESSION_NAME = re.compile(r"loop-[A-Za-z0-9_-]+")
"""The only session names the agent touches (never signal anything else)."""
POLL_SECONDS = 0.05
KILL_WAIT_SECONDS = 2.0  # how long a SIGKILLed harness may take to be reaped
COMMAND_TIMEOUT_SECONDS = 10.0
"""Longest one tmux command may take; a local server answers in milliseconds."""
READY_WAIT_SECONDS = 30.0
"""Longest a paste waits for a just-started harness to take its terminal raw and draw (see
paste). Every spawn's boot prompt is such a paste: Claude is ready in about a second, much later
on a loaded machine; the wait ends as soon as it is."""
SETTLED_SECONDS = 0.4
"""How long a first screen must stay unchanged before the first paste goes in."""
SCREEN_POLL_SECONDS = 0.1
"""How often a pane's screen is captured while waiting for it to settle."""
SUBMIT_WATCH_SECONDS = 1.5
"""How long a first submit waits for the screen to change before it sends Enter again."""
SUBMIT_PROBE_CHARS = 40
"""How much of a paste's first line is looked for on screen to see it leave the input box."""
LAST_LINES = 15
"""How many of a dead harness's last screen lines a failure carries as its detail."""

_SOCKET_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_ABSENT = re.compile(
    r"no server running|no current target|can't find (session|pane|window)"
    r"|error connecting to .*\((No such file or directory|Connection refused)\)"
)
_EXITED = "looprelay-pane-dead"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
"""Environment names passed on to sessions; others (rare, odd) cannot be listed to tmux."""
_TMUX_OWN = frozenset({"TMUX", "TMUX_PANE"})
"""Set by tmux itself in each pane: never copied from the agent (it may run inside tmux)."""
_PANE_DEAD = re.compile(r"Pane is dead( \(.*\))?$")
"""tmux's own line under a dead pane (remain-on-exit), not the harness's."""
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Pane:
    """A session's harness pane as tmux listed it."""

    pane_id: str
    dead: bool
    pid: int
    tty: str
    exit_status: int | None = None
    """The harness's exit status once the pane is dead (``#{pane_dead_status}``); None while
    it runs, and when a signal ended it (tmux 3.3a says nothing then)."""
    dead_at: float | None = None
    """When the pane died (``#{pane_dead_time}``, seconds since the epoch); None while it runs."""


class TmuxTerminal:
    """The agent's tmux server, on the private socket ``socket_name`` (never the default one).

    The server is started with ``config_file`` (``/dev/null`` by default, so an operator's
    ``~/.tmux.conf`` cannot change window numbering or exit behaviour). A paste waits up to
    ``ready_wait_seconds`` for a harness that is still starting.
    """

    def __init__(
        self,
        socket_name: str,
        *,
        config_file: str = os.devnull,
        ready_wait_seconds: float = READY_WAIT_SECONDS,
        command_timeout_seconds: float = COMMAND_TIMEOUT_SECONDS,
    ) -> None:
        if not _SOCKET_NAME.fullmatch(socket_name):
            raise ConfigError(
                f"tmux socket name {socket_name[:80]!r} must be 1-64 letters, digits, '_.-'"
            )
        self.socket_name = socket_name
        self._ready_wait_seconds = ready_wait_seconds
        self._client = ["tmux", "-L", socket_name, "-f", config_file]
        self._timeout = command_timeout_seconds
        self._drawn_panes: set[tuple[str, int]] = set()
        self._screens: dict[tuple[str, int], tuple[str, float, float]] = {}
        """A pane's last screen, when it was captured, and since when it has not changed."""
        """Panes (id, process) whose harness has drawn its screen: a later paste into one
        needs no screen capture to know it is ready."""

    def has_session(self, name: str) -> bool:
        """Tell whether session ``name`` exists. Raises ``RunnerError`` ``tmux-failed``."""
        return self._first_pane(name) is not None

    def pane_dead(self, name: str) -> bool | None:
        """Tell whether the harness pane of ``name`` is dead; None when there is no such session.

        Panes stay after their process exits because remain-on-exit is on (see :meth:`spawn`).
        Raises ``RunnerError`` ``tmux-failed`` when tmux cannot answer.
        """
        pane = self.pane(name)
        return None if pane is None else pane.dead

    def pane(self, name: str) -> Pane | None:
        """The harness pane of session ``name``; None when there is no such session. Raises
        ``RunnerError`` ``tmux-failed`` when tmux cannot answer."""
        return self._first_pane(name)

    def spawn(
        self,
        name: str,
        *,
        cwd: Path,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        unset: Collection[str] = (),
    ) -> None:
        """Start session ``name`` in ``cwd`` running ``argv`` directly (no shell), its
        environment the agent's plus ``env`` (the session's identity, ``agent.session_env``),
        less the variables ``unset`` names (``Harness.hosted_unset``).

        ``argv`` never holds a prompt (it is world-readable in ``/proc``): the caller pastes the
        boot prompt once the harness is up (:meth:`paste` waits for that).

        remain-on-exit is set globally in the same tmux invocation that may start the server, so
        even a harness that exits at once leaves a dead pane to read, and
        exit-empty off keeps the server up when a respawn kills its last session.

        The harness gets the agent's environment as it is now, not the one the tmux server
        was started with (by this agent's first spawn, maybe an earlier process): tmux copies
        the variables ``update-environment`` names from this tmux client, which inherits the
        agent's, into the new session, and clears those it names but the client lacks. So the
        option is set, in the same invocation, to every name the agent or the server's global
        environment has. Only names are on the command line (world-readable in ``/proc``),
        never values: ``env`` reaches the session the same way, through the client's own
        environment (readable by this user only). Raises ``RunnerError``: ``checkout-missing``
        when ``cwd`` is not a directory, ``tmux-failed`` when tmux refuses (for one, a session
        of that name exists).
        """
        _check_name(name)
        if not cwd.is_dir():
            raise RunnerError(f"{cwd} is not a directory", reason="checkout-missing")
        extra = dict(env or {})
        listed = self._env_names() | set(extra) | set(unset)
        names = " ".join(sorted(n for n in listed if _ENV_NAME.fullmatch(n)))
        # A server this call starts takes its client's environment as its global one: the
        # session's own variables (its token) must stay the session's, not every later one's.
        private = sorted(n for n in extra if n not in os.environ and _ENV_NAME.fullmatch(n))
        self._run(
            *("set-option", "-g", "update-environment", names, ";"),
            *(word for n in private for word in ("set-environment", "-g", "-u", n, ";")),
            *("set-option", "-g", "exit-empty", "off", ";"),
            *("set-option", "-gw", "remain-on-exit", "on", ";", "new-session", "-d"),
            *("-s", name, "-c", str(cwd).replace("#", "##"), "--"),
            *(_literal(arg) for arg in argv),
            env=_client_env(extra, unset) if extra or unset else None,
        )

    def _env_names(self) -> set[str]:
        """The variables a new session's environment is made of: the agent's and those of the
        server's global environment (to clear them when the agent has them no more)."""
        listed = self._query("show-environment", "-g") or []
        server = {line.lstrip("-").partition("=")[0] for line in listed}
        return (set(os.environ) | server) - _TMUX_OWN

    def paste(
        self,
        name: str,
        text: str,
        *,
        listed: Pane | None = None,
        confirm: bool = False,
        placeholder: str = "",
    ) -> None:
        """Paste ``text`` into the harness pane of ``name`` (``listed``, when the caller has
        just listed it) as one bracketed paste, then submit.

        A harness spawned a moment ago may not read its terminal yet: until its TUI takes the
        terminal raw (and asks for bracketed paste) a paste is echoed as typed lines or flushed
        away when it does. Claude also goes raw about half a second (seconds, under load)
        before it draws its first screen, and input that arrives in between lands in its input
        box without the Enter. So the paste waits, up to ``ready_wait_seconds``, for the pane's
        terminal to leave canonical mode and for a screen drawn on the pane to settle; a
        program that never does gets the paste after that.

        A pane seen drawn once is not captured again (each tmux call is a process started).

        ``load-buffer`` from a private temp file (0600, always unlinked) and ``paste-buffer -p
        -d`` (only into a live pane) in one tmux call, then ``send-keys Enter``. CR and CRLF
        become LF and control characters other than tab and LF are dropped, so a hostile text
        cannot close the bracket (``ESC [201~``) and type keys. Empty text does nothing. Raises
        ``RunnerError``: ``session-missing``, ``harness-failed`` (its pane died first),
        ``tmux-failed`` (nothing was pasted) or ``submit-failed`` (pasted, Enter not sent).
        """
        clean = _UNPRINTABLE.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
        if not clean:
            return
        pane = self._ready_pane(name, listed or self._first_pane(name))
        buffer = f"looprelay-{name}"  # both it and a pane id are safe in a tmux command string
        fd, path = tempfile.mkstemp(prefix="looprelay-paste-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(clean.encode("utf-8", "replace"))
            # tmux 3.3a's server crashes on a paste into a dead pane, taking every session with
            # it: the server itself checks the pane, in the same command, before it pastes.
            said = self._run(
                *("load-buffer", "-b", buffer, path, ";", "if-shell", "-F", "-t", pane.pane_id),
                "#{pane_dead}",
                f"delete-buffer -b {buffer} ; display-message -p {_EXITED}",
                f"paste-buffer -p -d -b {buffer} -t {pane.pane_id}",
            )
        finally:
            os.unlink(path)
        if _EXITED in said:
            raise _exited(name)
        try:
            self._submit(pane, clean, confirm=confirm, placeholder=placeholder)
        except RunnerError as exc:
            raise RunnerError(
                f"pasted into {name} but not submitted: {exc}", reason="submit-failed"
            ) from exc

    def _submit(self, pane: Pane, text: str, *, confirm: bool, placeholder: str) -> None:
        """Send Enter; with ``confirm`` (a harness that may drop it), until its screen shows
        the Enter was taken.

        Gemini CLI, for one, shows the pasted text in its input box and drops an Enter for
        seconds while it starts, and reads an Enter that reaches it within 40 ms of a paste as
        a newline (its guard against pasted commands), which a loaded machine makes likely
        whatever the gap sent. So, with ``confirm``, the screen is let settle and, when it
        shows the text's first line (the input box echoing it), or else ``placeholder``
        (what a harness shows for a long paste, as Claude's ``[Pasted text #1 +45 lines]``),
        Enter is sent again each ``SUBMIT_WATCH_SECONDS`` that line stays on the same rows,
        up to ``ready_wait_seconds``; a screen that shows no echo gets one Enter.
        """
        if not confirm:
            self._run("send-keys", "-t", pane.pane_id, "Enter")
            return
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        probe, screen = first[:SUBMIT_PROBE_CHARS], self._settled_screen(pane)
        rows, gone = _rows_with(screen, probe), False
        if not rows and placeholder:
            # A placeholder is gone once the paste is submitted (the transcript shows the text
            # itself); rows moving say nothing then: the screen may be redrawn above it.
            probe, rows, gone = placeholder, _rows_with(screen, placeholder), True
        deadline = time.monotonic() + self._ready_wait_seconds
        while True:
            self._run("send-keys", "-t", pane.pane_id, "Enter")
            if not rows or self._taken(pane, rows, probe, gone=gone):
                break
            if time.monotonic() >= deadline:
                break

    def _screen(self, pane: Pane) -> str:
        return "\n".join(self._query("capture-pane", "-p", "-t", pane.pane_id) or [])

    def _settled_screen(self, pane: Pane) -> str:
        """The pane's screen once two captures ``SCREEN_POLL_SECONDS`` apart agree (at most
        ``SUBMIT_WATCH_SECONDS``): what the paste drew, not a frame on the way to it."""
        deadline = time.monotonic() + SUBMIT_WATCH_SECONDS
        screen = self._screen(pane)
        while time.monotonic() < deadline:
            time.sleep(SCREEN_POLL_SECONDS)
            again = self._screen(pane)
            if again == screen:
                break
            screen = again
        return screen

    def _taken(self, pane: Pane, rows: tuple[int, ...], probe: str, *, gone: bool) -> bool:
        """Tell whether, within ``SUBMIT_WATCH_SECONDS``, the rows holding ``probe`` moved
        from ``rows`` (with ``gone``: no row holds it any more): the harness took the Enter
        and the text left its input box."""
        deadline = time.monotonic() + SUBMIT_WATCH_SECONDS
        while True:
            now = _rows_with(self._screen(pane), probe)
            if (not now) if gone else (now != rows):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(SCREEN_POLL_SECONDS)

    def kill(self, name: str) -> None:
        """Kill session ``name``; a missing one is fine. Raises ``RunnerError`` ``tmux-failed``."""
        _check_name(name)
        self._query("kill-session", "-t", f"={name}")

    def terminate_harness(self, name: str, grace_seconds: float) -> str:
        """End the harness in ``name`` and keep the session.

        SIGTERM the pane's process (only a positive pid), poll every ``POLL_SECONDS`` for
        ``grace_seconds``, then SIGKILL and wait up to ``KILL_WAIT_SECONDS``. Returns ``absent``,
        ``already-dead``, ``terminated`` or ``killed``. Raises ``RunnerError`` ``tmux-failed``
        or ``terminate-failed`` (the process outlived SIGKILL's wait).
        """
        pane = self._first_pane(name)
        if pane is None:
            return "absent"
        if pane.dead:
            return "already-dead"
        if pane.pid <= 0:
            raise RunnerError(f"tmux gave no pid for {name}", reason="tmux-failed")
        self._run("set-option", "-w", "-t", f"={name}:", "remain-on-exit", "on")
        _signal(pane.pid, signal.SIGTERM)
        if self.wait_dead(name, grace_seconds):
            return "terminated"
        _signal(pane.pid, signal.SIGKILL)
        if self.wait_dead(name, KILL_WAIT_SECONDS):
            return "killed"
        raise RunnerError(f"the harness in {name} survived SIGKILL", reason="terminate-failed")

    def attach_command(self, name: str, *, read_only: bool = False) -> str:
        """Return the shell command an operator runs to watch ``name``."""
        _check_name(name)
        return attach_command(socket=self.socket_name, session=name, read_only=read_only)

    def kill_server(self) -> None:
        """Stop this socket's tmux server and every session on it; none running is fine."""
        self._query("kill-server")

    def _first_pane(self, name: str) -> Pane | None:
        _check_name(name)
        lines = self._query(
            "list-panes",
            *("-s", "-t", f"={name}:"),
            "-F",
            "#{pane_id} #{pane_dead} #{pane_pid} #{pane_dead_status} #{pane_dead_time} #{pane_tty}",
        )
        if not lines:
            return None
        pane_id, dead, pid, status, died, tty = lines[0].split(" ", 5)
        return Pane(
            pane_id=pane_id,
            dead=dead == "1",
            pid=int(pid or 0),
            tty=tty,
            exit_status=int(status) if dead == "1" and status.lstrip("-").isdigit() else None,
            dead_at=float(died) if dead == "1" and died.isdigit() else None,
        )

    def exit_status(self, name: str, seconds: float = KILL_WAIT_SECONDS) -> int | None:
        """The exit status of ``name``'s dead harness, waited for up to ``seconds``: tmux
        marks a pane dead when its terminal closes and learns the status a moment later.
        None when a signal ended it or there is no such session. Raises ``RunnerError``
        ``tmux-failed``."""
        deadline = time.monotonic() + seconds
        while True:
            pane = self._first_pane(name)
            if pane is None or pane.exit_status is not None or time.monotonic() >= deadline:
                return None if pane is None else pane.exit_status
            time.sleep(POLL_SECONDS)

    def last_lines(self, name: str, count: int = LAST_LINES) -> str:
        """The last ``count`` non-blank lines the harness pane of ``name`` shows (a dead one
        too: remain-on-exit keeps it; tmux's "Pane is dead" line left out), control characters
        dropped; "" when there is no such
        session. Raises ``RunnerError`` ``tmux-failed`` when tmux cannot answer."""
        pane = self._first_pane(name)
        if pane is None:
            return ""
        lines = self._query("capture-pane", "-p", "-J", "-S", "-200", "-t", pane.pane_id) or []
        shown = [_UNPRINTABLE.sub("", line).rstrip() for line in lines]
        kept = [line for line in shown if line.strip() and not _PANE_DEAD.match(line)]
        return "\n".join(kept[-count:])

    def _ready_pane(self, name: str, pane: Pane | None) -> Pane:
        """Wait, up to ``ready_wait_seconds``, until ``pane``'s harness reads its terminal raw
        and has drawn (see :meth:`paste`); listed again while waiting, so a harness that exits
        meanwhile is noticed. Raises ``RunnerError`` ``session-missing`` or ``harness-failed``."""
        deadline = time.monotonic() + self._ready_wait_seconds
        while True:
            if pane is None:
                raise RunnerError(f"tmux session {name} is gone", reason="session-missing")
            if pane.dead:
                raise _exited(name)
            ready = not _canonical(pane.tty) and self._drawn(pane)
            if ready or time.monotonic() >= deadline:
                return pane
            time.sleep(POLL_SECONDS)
            pane = self._first_pane(name)

    def _drawn(self, pane: Pane) -> bool:
        """Tell whether the pane shows a screen that has stayed the same for
        ``SETTLED_SECONDS`` (its program drew it and now waits for input), or did once.

        Drawn alone is not enough: Claude may print a line of its own ("the fullscreen
        renderer didn't finish starting last time") before its TUI reads keys, and a paste
        submitted then stays in the input box without its Enter."""
        seen = (pane.pane_id, pane.pid)
        if seen in self._drawn_panes:
            return True
        now = time.monotonic()
        last = self._screens.get(seen)
        if last is not None and now - last[1] < SCREEN_POLL_SECONDS:
            return False
        lines = self._query("capture-pane", "-p", "-t", pane.pane_id) or []
        screen = "\n".join(lines)
        if not screen.strip():
            self._screens.pop(seen, None)
            return False
        if last is None or last[0] != screen:
            self._screens[seen] = (screen, now, now)
            return False
        self._screens[seen] = (screen, now, last[2])
        if now - last[2] < SETTLED_SECONDS:
            return False
        self._screens.pop(seen, None)
        self._drawn_panes.add(seen)
        return True

    def wait_dead(self, name: str, seconds: float) -> bool:
        """Tell whether ``name``'s pane dies (or its session goes) within ``seconds``.

        Polls every ``POLL_SECONDS``. Raises ``RunnerError`` ``tmux-failed``.
        """
        deadline = time.monotonic() + seconds
        while True:
            pane = self._first_pane(name)
            if pane is None or pane.dead:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)

    def _query(self, *args: str, env: Mapping[str, str] | None = None) -> list[str] | None:
        """Run a tmux command (its client in ``env``, else the agent's environment); None
        when its session (or the whole server) does not exist."""
        try:
            done = run_child(
                [*self._client, *args], cwd=None, timeout_seconds=self._timeout, env=env
            )
        except OSError as exc:
            raise RunnerError(f"tmux {args[0]} failed: {exc}", reason="tmux-failed") from exc
        except Overran as exc:
            raise RunnerError(
                f"tmux {args[0]} got no answer from the server on socket {self.socket_name} "
                f"in {self._timeout:g} s; check it with `tmux -L {self.socket_name} ls`",
                reason="tmux-timeout",
            ) from exc
        if done.exit_code == 0:
            return done.stdout.splitlines()
        error = " ".join(done.stderr.split())[:300]
        if _ABSENT.search(error):
            return None
        raise RunnerError(f"tmux {args[0]} failed: {error}", reason="tmux-failed")

    def _run(self, *args: str, env: Mapping[str, str] | None = None) -> list[str]:
        lines = self._query(*args, env=env)
        if lines is None:
            raise RunnerError(f"tmux {args[0]}: no such session or server", reason="tmux-failed")
        return lines


def _check_name(name: str) -> None:
    if not SESSION_NAME.fullmatch(name):
        raise RunnerError(
            f"{name[:80]!r} is not a loop session name (loop-[A-Za-z0-9_-]+)",
            reason="invalid-session-name",
        )


def _exited(name: str) -> RunnerError:
    return RunnerError(
        f"the harness in {name} exited before it could be given the prompt; nothing was "
        f"pasted (its pane shows why)",
        reason=HARNESS_FAILED,
    )


def _client_env(extra: Mapping[str, str], unset: Collection[str]) -> dict[str, str]:
    """The tmux client's environment for a spawn: the agent's plus ``extra``, without ``unset``
    (a name ``update-environment`` lists that the client lacks is cleared in the session)."""
    return {k: v for k, v in (os.environ | dict(extra)).items() if k not in unset}


def _literal(arg: str) -> str:
    # tmux reads a trailing ';' as a command separator and a trailing '\;' as a literal ';'.
    return arg[:-1] + "\\;" if arg.endswith(";") else arg


def _canonical(tty: str) -> bool:
    """Tell whether terminal ``tty`` is in canonical (line) mode; False when it cannot be read."""
    try:
        fd = os.open(tty, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return bool(termios.tcgetattr(fd)[3] & termios.ICANON)
    except termios.error:
        return False
    finally:
        os.close(fd)


def _signal(pid: int, signum: signal.Signals) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return
    except PermissionError as exc:
        raise RunnerError(f"cannot signal pid {pid}: {exc}", reason="terminate-failed") from exc


def _rows_with(screen: str, probe: str) -> tuple[int, ...]:
    """The rows of ``screen`` that hold ``probe`` (none for an empty probe)."""
    if not probe:
        return ()
    return tuple(n for n, line in enumerate(screen.splitlines()) if probe in line)
