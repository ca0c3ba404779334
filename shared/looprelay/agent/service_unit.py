"""The runner agent as a per-user service: a systemd user unit (Linux) or a launchd agent
(macOS) that runs ``looprelay runner run`` with the operator's options, as the Actions
runner's ``svc.sh`` installs itself. Only text is made here; the caller writes it."""

from __future__ import annotations

import plistlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DRAIN_SECONDS = 120
"""How long a stop lets the agent drain (finish and report what it holds) before it is
killed: the agent drains on the first SIGTERM."""


@dataclass(frozen=True)
class ServiceFile:
    """What to write where, and how the operator drives it."""

    path: Path
    text: str
    start: str
    stop: str
    logs: str


def systemd_quote(argument: str) -> str:
    """``argument`` as one word of a systemd ``ExecStart=`` line (systemd.service "Command
    lines" and systemd.unit "Specifiers": ``%`` and ``$`` doubled, quoted when needed)."""
    text = argument.replace("%", "%%").replace("$", "$$")
    if text and not any(c in text for c in " \t\n\"'\\;"):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def systemd_unit(
    *, name: str, command: Sequence[str], path_env: str, directory: Path
) -> ServiceFile:
    """The user unit ``name``.service in ``directory`` running ``command`` with ``PATH`` set
    to ``path_env`` (a user service starts with systemd's own short PATH, where ``claude``
    and ``tmux`` are usually missing)."""
    text = "\n".join(
        [
            "[Unit]",
            "Description=looprelay runner agent",
            "Wants=network-online.target",
            "After=network-online.target",
            "",
            "[Service]",
            "Type=exec",
            f"ExecStart={' '.join(systemd_quote(part) for part in command)}",
            f"Environment={systemd_quote('PATH=' + path_env)}",
            "Restart=on-failure",
            "RestartSec=5",
            "KillMode=mixed",
            f"TimeoutStopSec={DRAIN_SECONDS}",
            "",
            "[Install]",
            "WantedBy=default.target",
            "",
        ]
    )
    return ServiceFile(
        path=directory / f"{name}.service",
        text=text,
        start=f"systemctl --user daemon-reload && systemctl --user enable --now {name}",
        stop=f"systemctl --user stop {name}",
        logs=f"journalctl --user -u {name} -f",
    )


def launchd_agent(
    *, name: str, command: Sequence[str], path_env: str, directory: Path, log_dir: Path
) -> ServiceFile:
    """The launchd agent ``dev.looprelay.<name>`` in ``directory`` running ``command``,
    restarted when it exits with a failure, its output in ``log_dir``."""
    label = f"dev.looprelay.{name}"
    log = log_dir / f"{name}.log"
    plist = {
        "Label": label,
        "ProgramArguments": list(command),
        "EnvironmentVariables": {"PATH": path_env},
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ExitTimeOut": DRAIN_SECONDS,
        "StandardOutPath": str(log),
        "StandardErrorPath": str(log),
    }
    path = directory / f"{label}.plist"
    return ServiceFile(
        path=path,
        text=plistlib.dumps(plist).decode(),
        start=f"launchctl bootstrap gui/$(id -u) {path}",
        stop=f"launchctl bootout gui/$(id -u)/{label}",
        logs=f"tail -f {log}",
    )
