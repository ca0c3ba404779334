"""Bubblewrap around a session's harness: what an untrusted session (a fork's pull request) can
reach on the runner machine.

Inside, the session sees an empty root with, read-only, the system (``/usr``, ``/etc`` and the
``/bin``, ``/sbin``, ``/lib*`` links or directories) and what the harness binary needs to start
(its directory, or the ``node_modules`` an npm CLI was installed into, and its interpreter);
read-write, its tree and the harness's own config (Claude: ``${CLAUDE_CONFIG_DIR:-~/.claude}``
and its ``.claude.json``); a fresh ``/proc`` (its own processes only), a minimal ``/dev``, and an
empty ``/tmp`` and ``$HOME`` (tmpfs, gone when it exits). Everything else is absent: the rest of
``$HOME`` (``runner.json``, the state directory and its ledger, ssh keys, git credentials), other
trees and shared clones, ``/run`` and every tmux socket. The runner's credentials file and state
directory are also covered where a visible mount would show them. The network stays (the
harness needs its API). ``--die-with-parent``, a new session (no TIOCSTI into the runner's
terminal), and new PID, IPC, UTS and cgroup namespaces.

Argv building is pure (:func:`sandbox_argv`); :class:`Sandbox` reads the machine (symlinks,
``.git`` files) and :func:`sandbox_available` runs bwrap once to see that it works here (user
namespaces can be off).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from looprelay.agent import harnesses
from looprelay.agent.children import Overran, run_child
from looprelay.errors import RunnerError

SANDBOX_MODES = ("always", "untrusted", "never")
"""``runner run --sandbox``: every session, fork pull requests' sessions (the default), none."""
BWRAP = "bwrap"
PROBE_TIMEOUT_SECONDS = 10.0
"""Longest the start-up probe may take; bwrap answers in milliseconds."""
PRIVATE_TMP = "/tmp"  # noqa: S108 - the sandbox's own /tmp: an empty tmpfs, gone when it exits
SYSTEM_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
NAMESPACES = (
    *("--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc"),
    *("--unshare-uts", "--unshare-cgroup-try"),
)
UNSET_ENV = ("SSH_AUTH_SOCK", "GH_TOKEN", "GITHUB_TOKEN", "GIT_ASKPASS", "SSH_ASKPASS")
"""Ways out to the operator's credentials that an environment carries; ``LOOPRELAY_*`` too."""


@dataclass(frozen=True)
class Layout:
    """What one sandbox shows, as absolute resolved paths.

    ``system`` holds each system path with its symlink target (None: a directory to bind
    read-only); ``writable`` and ``readable`` are bound at the same place after ``home`` is
    emptied; ``hidden`` are paths (with whether each is a directory) covered when a mount would
    show them.
    """

    system: tuple[tuple[str, str | None], ...]
    home: Path
    tree: Path
    writable: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    hidden: tuple[tuple[Path, bool], ...] = ()
    unset: tuple[str, ...] = UNSET_ENV


def sandbox_argv(argv: Sequence[str], *, bwrap: str, layout: Layout) -> list[str]:
    """Return ``argv`` run by ``bwrap`` inside ``layout``, in the tree. Pure; never raises.

    Order matters to bwrap: the system, then the empty ``/tmp`` and ``$HOME``, then what is
    bound back over them, then covers for hidden paths a mount would show.
    """
    out = [bwrap, *NAMESPACES]
    for path, target in layout.system:
        out += ["--symlink", target, path] if target is not None else ["--ro-bind", path, path]
    out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", PRIVATE_TMP, "--tmpfs", str(layout.home)]
    for shown_path in layout.readable:
        out += ["--ro-bind", str(shown_path), str(shown_path)]
    for own in layout.writable:
        out += ["--bind", str(own), str(own)]
    out += ["--bind", str(layout.tree), str(layout.tree)]
    shown = [Path(p) for p, target in layout.system if target is None]
    shown += [*layout.readable, *layout.writable, layout.tree]
    for secret, is_dir in layout.hidden:
        if _inside_any(secret, shown) and not _inside(layout.tree, secret):
            out += ["--tmpfs", str(secret)] if is_dir else ["--ro-bind", os.devnull, str(secret)]
    for name in layout.unset:
        out += ["--unsetenv", name]
    out += ["--setenv", "TMPDIR", PRIVATE_TMP, "--chdir", str(layout.tree), "--", *argv]
    return out


@dataclass(frozen=True)
class Probe:
    """Whether bwrap runs here: its absolute path, or why not."""

    bwrap: str | None
    reason: str = ""


def sandbox_available(
    bwrap: str = BWRAP, *, timeout_seconds: float = PROBE_TIMEOUT_SECONDS
) -> Probe:
    """Try ``bwrap`` with the sandbox's namespaces around ``true`` and say whether it works.

    Looks ``bwrap`` up on PATH; a missing binary, a failure (user namespaces off, no
    permission) or no answer in ``timeout_seconds`` is a :class:`Probe` without a path and
    with the reason. Never raises.
    """
    found = shutil.which(bwrap)
    if found is None:
        return Probe(None, f"{bwrap} is not on PATH (Debian: apt-get install bubblewrap)")
    argv = [found, *NAMESPACES, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        done = run_child(argv, cwd=None, timeout_seconds=timeout_seconds, stderr_limit=400)
    except OSError as exc:
        return Probe(None, f"{found} cannot be started: {exc.strerror}")
    except Overran:
        return Probe(None, f"{found} gave no answer in {timeout_seconds:g} s")
    if done.exit_code != 0:
        said = " ".join(done.stderr.split()) or f"exit {done.exit_code}"
        return Probe(None, f"{found} cannot make a sandbox here: {said}")
    return Probe(os.path.abspath(found))


@dataclass(frozen=True)
class Sandbox:
    """The runner's sandbox choice: ``mode`` (one of ``SANDBOX_MODES``) and ``probe``.

    ``hidden`` are the runner's own secrets (its credentials file, its state directory);
    ``environ`` locates the harness's config (tests).
    """

    mode: str = "never"
    probe: Probe = field(default_factory=lambda: Probe(None, "not probed"))
    hidden: tuple[Path, ...] = ()
    environ: Mapping[str, str] | None = None

    def wraps(self, *, untrusted: bool) -> bool:
        """Tell whether a session (``untrusted``: a fork's pull request) runs sandboxed."""
        return self.mode == "always" or (self.mode == "untrusted" and untrusted)

    def check(self, *, untrusted: bool) -> None:
        """Refuse a session that must be sandboxed where bwrap does not work.

        Raises ``RunnerError`` ``sandbox-unavailable`` naming the fix.
        """
        if self.wraps(untrusted=untrusted) and self.probe.bwrap is None:
            what = "a fork pull request's session" if untrusted else "every session"
            raise RunnerError(
                f"--sandbox {self.mode} runs {what} in bubblewrap, which does not work on this "
                f"runner ({self.probe.reason}); install bubblewrap (or allow user namespaces) "
                "and restart the runner",
                reason="sandbox-unavailable",
            )

    def wrap(
        self, argv: Sequence[str], *, harness_name: str, tree: Path, trusted: bool
    ) -> list[str]:
        """Return ``argv`` (a harness, its binary first) run inside the sandbox in ``tree``.

        Makes the harness's config directory when it is missing, so it can be bound. A
        trusted worktree also gets its git directories (its ``.git`` file names them; an
        untrusted tree's could name anything, so it never does). Raises ``RunnerError``
        ``sandbox-unavailable`` when bwrap does not work here or ``tree`` holds ``$HOME``.
        """
        bwrap = self.probe.bwrap
        if bwrap is None:
            raise RunnerError(
                f"bubblewrap does not work on this runner ({self.probe.reason})",
                reason="sandbox-unavailable",
            )
        env = os.environ if self.environ is None else self.environ
        home, where = Path(os.path.realpath(env.get("HOME") or Path.home())), tree.resolve()
        if _inside(home, where):
            raise RunnerError(
                f"{where} holds $HOME ({home}), which a sandbox never shows; give sessions "
                "trees outside it (--workspace)",
                reason="sandbox-unavailable",
            )
        binary = Path(os.path.realpath(argv[0]))
        layout = Layout(
            system=_system(),
            home=home,
            tree=where,
            writable=(*_harness_config(harness_name, env), *(_git_dirs(tree) if trusted else ())),
            readable=_runtime(binary, env),
            hidden=tuple((p.resolve(), p.is_dir()) for p in self.hidden if p.exists()),
            unset=(*UNSET_ENV, *sorted(n for n in env if n.startswith("LOOPRELAY_"))),
        )
        return sandbox_argv([str(binary), *argv[1:]], bwrap=bwrap, layout=layout)


def _system() -> tuple[tuple[str, str | None], ...]:
    found: list[tuple[str, str | None]] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            found.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            found.append((path, None))
    return tuple(found)


def _runtime(binary: Path, env: Mapping[str, str]) -> tuple[Path, ...]:
    """What ``binary`` (resolved) needs to start, beyond the system: its own directory; the
    ``node_modules`` it was installed into, where an npm CLI finds its platform binary and its
    dependencies (Codex, Copilot); and a script's interpreter (``#!/usr/bin/env node``, found
    on the environment's PATH), which may live under ``$HOME`` (nvm)."""
    package_root = next((p for p in binary.parents if p.name == "node_modules"), None)
    needed = [package_root or binary.parent]
    interpreter = _interpreter(binary, env)
    if interpreter is not None and not _inside_any(interpreter, [Path(p) for p in SYSTEM_PATHS]):
        needed.append(interpreter)
    return tuple(needed)


def _interpreter(binary: Path, env: Mapping[str, str]) -> Path | None:
    """The resolved interpreter a ``#!`` script names (``env``'s argument looked up on PATH)."""
    try:
        with binary.open("rb") as script:
            first = script.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        program = next((w for w in words[1:] if not w.startswith("-")), None)
        found = program and shutil.which(program, path=env.get("PATH", os.defpath))
        return Path(os.path.realpath(found)) if found else None
    return Path(os.path.realpath(words[0]))


def _harness_config(name: str, env: Mapping[str, str]) -> list[Path]:
    paths = harnesses.get(name).home_config(env)
    return [Path(os.path.realpath(p)) for p in paths if p.exists()]


def _git_dirs(tree: Path) -> list[Path]:
    """A worktree's own git directory and the clone's common one (from its ``.git`` file)."""
    dot_git = tree / ".git"
    if not dot_git.is_file():
        return []
    text = dot_git.read_text(encoding="utf-8", errors="replace").strip()
    if not text.startswith("gitdir:"):
        return []
    own = (tree / text.removeprefix("gitdir:").strip()).resolve()
    found = [own] if own.is_dir() else []
    common_file = own / "commondir"
    if common_file.is_file():
        common = (own / common_file.read_text(encoding="utf-8").strip()).resolve()
        if common.is_dir():
            found.insert(0, common)
    return found


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _inside_any(path: Path, parents: Sequence[Path]) -> bool:
    return any(_inside(path, parent) for parent in parents)
