"""The predecessor's webhook receiver (the-loop) for ``bench/ingress.py``: install and launch.

``ensure_installed`` puts the published package into its own venv, ``bench/.peer``, on first use
(``python -m venv`` + ``pip install``), and a stamp file makes later calls free. ``prepare`` writes
the minimal CLI config the receiver needs into a throw-away folder and returns the command,
environment and working directory that start it. ``bench/ingress.py`` owns the process itself.

What the receiver does, read from ``the_loop/webhook/{daemon,server}.py`` of 20.10.2:

- a stdlib ``ThreadingHTTPServer`` speaking HTTP/1.0, so every request costs a new connection;
- ``GET /healthz`` answers 200 once the socket is bound;
- a POST to ``webhooks.ghWebhook.path`` reads the body, checks ``X-Hub-Signature-256`` against
  the secret in the env var ``secretEnv`` names (none set means no check at all), parses the
  JSON, logs one INFO line to stderr, appends one ``webhook.received`` line to
  ``<folder>/.the-loop/logs/events.jsonl`` (plain append, no fsync) and answers 202;
- with ``routing.enabled: false`` nothing else happens: the delivery is not queued anywhere, so
  its ack promises nothing durable;
- its SIGTERM/SIGINT handler calls ``httpd.shutdown()`` on the thread running
  ``serve_forever()``, which waits for itself forever: only SIGKILL stops it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "the-loopy-one"
VERSION = "20.10.2"
REQUIREMENT = f"{PACKAGE}=={VERSION}"
VENV = Path(__file__).resolve().parent / ".peer"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / "installed.txt"
INSTALL_LOG = VENV / "install.log"
SECRET_ENV = "THE_LOOP_GH_WEBHOOK_SECRET"  # noqa: S105 - the variable's name, not a secret
CONFIG_ENV = "THE_LOOP_CLI_CONFIG"  # the receiver reads it first; unset it so ours wins
WEBHOOK_PATH = "/gh-webhook"
# server.py answers every accepted delivery with `_send(202, "accepted")`; confirmed by a POST.
ACK_STATUS = 202
INSTALL_SECONDS = 600.0
_CONFIG = """\
webhooks:
  ghWebhook:
    enabled: true
    host: 127.0.0.1
    port: {port}
    path: {path}
    secretEnv: {secret_env}
routing:
  enabled: false
"""


class PeerError(Exception):
    """The predecessor could not be installed or configured."""


@dataclass(frozen=True)
class Launch:
    """How to start the receiver: argv, environment and working directory."""

    cmd: list[str]
    env: dict[str, str]
    cwd: Path


def _stamp_text() -> str:
    return f"{REQUIREMENT} python{sys.version_info.major}.{sys.version_info.minor}\n"


def ensure_installed() -> str:
    """Make ``bench/.peer`` hold the predecessor; return its installed version.

    Expects ``pip`` to reach a package index (its own configuration decides which). Does nothing
    when the stamp file matches; otherwise (re)creates the venv with ``--clear`` and installs,
    allowing INSTALL_SECONDS, and writes the stamp only after success. Raises PeerError, naming
    the log, when venv creation or pip fails or times out."""
    if not (STAMP.is_file() and STAMP.read_text(encoding="utf-8") == _stamp_text()):
        print(f"  installing {REQUIREMENT} into {VENV} (once)", file=sys.stderr)
        _run([sys.executable, "-m", "venv", "--clear", str(VENV)], log=None)
        _run([str(PYTHON), "-m", "pip", "install", "--quiet", REQUIREMENT], log=INSTALL_LOG)
        STAMP.write_text(_stamp_text(), encoding="utf-8")
    probe = f"import importlib.metadata as m; print(m.version({PACKAGE!r}))"
    done = subprocess.run(
        [str(PYTHON), "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise PeerError(
            f"{PACKAGE} is not importable in {VENV}; delete it and rerun:\n{done.stderr}"
        )
    return done.stdout.strip()


def _run(cmd: list[str], *, log: Path | None) -> None:
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=INSTALL_SECONDS, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise PeerError(f"{cmd[0]} {cmd[1:3]} took over {INSTALL_SECONDS:.0f}s") from exc
    if log is not None:
        log.write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        where = f"; full output in {log}" if log else ""
        raise PeerError(
            f"{' '.join(cmd)} failed ({done.returncode}){where}:\n{done.stderr[-2000:]}"
        )


def prepare(folder: Path, *, port: int, secret: str) -> Launch:
    """Write ``folder/.the-loop/cli-config.yaml`` for a receiver on 127.0.0.1:``port``.

    Expects ``folder`` to be fresh (the receiver keeps its pidfile lock and event log there) and
    ``ensure_installed`` to have run. The secret only travels in the returned environment.
    Raises nothing of its own; OSError if ``folder`` cannot be written."""
    config = folder / ".the-loop" / "cli-config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    text = _CONFIG.format(port=port, path=WEBHOOK_PATH, secret_env=SECRET_ENV)
    config.write_text(text, encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key != CONFIG_ENV}
    env[SECRET_ENV] = secret
    cmd = [str(PYTHON), "-m", "the_loop.daemon_entry", "gh-webhook"]
    return Launch(cmd, env, folder)
