"""``looprelay runners`` (operator view) and ``looprelay runner`` (this machine)."""

from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar, get_args

import click

from looprelay.cli.common import data_path, load, log_options, state_options, table
from looprelay.config.model import MAX_POLL_WAIT_SECONDS, HarnessName
from looprelay.logs import LogFormat

F = TypeVar("F", bound=Callable[..., Any])
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration_seconds(text: str) -> int:
    match = _DURATION.match(text.strip())
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration like 30m, 1h or 2d")
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise click.BadParameter(f"{text!r} would expire at once; give a duration like 30m")
    return seconds


@click.group("runners")
def runners_group() -> None:
    """Operator view of runner agents: tokens, list, revoke, rotate.

    On the machine that runs sessions, see `looprelay runner -h` (register, run, status,
    rotate, remove)."""


@runners_group.command("token")
@state_options
@click.option("--ttl", default=None, help="Lifetime, e.g. 30m, 1h [default: runners config].")
def runners_token(config_path: Path | None, data_dir: Path | None, ttl: str | None) -> None:
    """Mint a single-use registration token; prints only the token."""
    from datetime import UTC, datetime, timedelta

    from looprelay.app.adapters import open_runner_registry
    from looprelay.service.runners import mint_registration_token

    config = load(config_path)
    seconds = _duration_seconds(ttl) if ttl else config.runners.registration_token_ttl_seconds
    registry = open_runner_registry(config, data_dir=data_path(data_dir))
    token = mint_registration_token(registry, now=datetime.now(UTC), ttl=timedelta(seconds=seconds))
    click.echo(token)


@runners_group.command("openapi")
def runners_openapi() -> None:
    """Print the runner API's OpenAPI document (also in schema/runner-api.openapi.json)."""
    from looprelay.wire.openapi import runner_api_document_text

    click.echo(runner_api_document_text(), nl=False)


@runners_group.command("list")
@state_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def runners_list(config_path: Path | None, data_dir: Path | None, as_json: bool) -> None:
    """List registered runners (never their secrets): not-started, live, lost (silent longer
    than runners.lostAfterSeconds) or revoked, as `looprelay status` says, and the harnesses
    each runs (sessions, as its last heartbeat said)."""
    from datetime import UTC, datetime, timedelta

    from looprelay.app.adapters import open_runner_registry
    from looprelay.core.scheduling import runner_state

    config = load(config_path)
    registry = open_runner_registry(config, data_dir=data_path(data_dir))
    now, lost_after = datetime.now(UTC), timedelta(seconds=config.runners.lost_after_seconds)
    rows = []
    for runner in registry.list_runners():
        data = runner.model_dump(mode="json", exclude={"secret_hash"})
        data["status"] = runner_state(runner, now=now, lost_after=lost_after)
        if as_json:
            click.echo(json.dumps(data))
        rows.append(
            {
                **data,
                "labels": ",".join(f"{k}={v}" for k, v in sorted(runner.labels.items())),
                "harnesses": ",".join(runner.harnesses) or "any",
            }
        )
    if not as_json:
        table(
            rows,
            (
                "runner_id",
                "name",
                "status",
                "hostname",
                "capacity",
                "sessions",
                "version",
                "harnesses",
                "labels",
                "last_seen_at",
            ),
            now=now,
        )


@runners_group.command("revoke")
@state_options
@click.argument("runner_id")
def runners_revoke(config_path: Path | None, data_dir: Path | None, runner_id: str) -> None:
    """Revoke a runner: its next call is refused and told to register again."""
    from datetime import UTC, datetime

    from looprelay.app.adapters import open_runner_registry

    registry = open_runner_registry(load(config_path), data_dir=data_path(data_dir))
    if not registry.revoke_runner(runner_id, at=datetime.now(UTC)):
        raise click.ClickException(f"{runner_id} is unknown or already revoked")
    click.echo(f"{runner_id}: revoked")


@runners_group.command("rotate")
@state_options
@click.argument("runner_id")
def runners_rotate(config_path: Path | None, data_dir: Path | None, runner_id: str) -> None:
    """Give a runner a new secret; prints it once. Put it in the runner's credentials file
    (the "secret" field of runner.json): until then the runner is refused. On the runner's
    own machine `looprelay runner rotate` does both, and its running agent goes on."""
    from looprelay.app.adapters import open_runner_registry
    from looprelay.service.runner_secrets import hash_credential, new_runner_secret

    registry = open_runner_registry(load(config_path), data_dir=data_path(data_dir))
    secret = new_runner_secret()
    if not registry.rotate_runner_secret(runner_id, secret_hash=hash_credential(secret)):
        raise click.ClickException(f"{runner_id} is unknown or revoked")
    click.echo(secret)


@click.group("runner")
def runner_group() -> None:
    """This machine as a runner agent: register, run, status, rotate, remove.

    The operator's view of every runner (tokens, list, revoke, rotate) is
    `looprelay runners -h`."""


def _warn_if_plain_http(server: str) -> None:
    """A runner's secret and every prompt travel in the clear over http to another machine:
    say so (loopback, the `up` default, is fine)."""
    import ipaddress
    from urllib.parse import urlsplit

    parsed = urlsplit(server)
    if parsed.scheme != "http" or not parsed.hostname:
        return
    try:
        loopback = ipaddress.ip_address(parsed.hostname).is_loopback
    except ValueError:
        loopback = parsed.hostname == "localhost"
    if not loopback:
        click.echo(
            f"warning: {server} is plain http to another machine: the runner's secret and "
            "every prompt cross the network unencrypted; use https (a tunnel or a proxy)",
            err=True,
        )


def _credentials_option(help_text: str) -> Callable[[F], F]:
    """``--credentials``: the runner's credentials file, ``~/.config/looprelay/runner.json``
    unless given."""
    return click.option(
        "--credentials",
        "credentials_path",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help=f"{help_text} [default: ~/.config/looprelay/runner.json].",
    )


def _labels(values: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key or not val:
            raise click.BadParameter(f"{value!r} is not k=v", param_hint="--label")
        labels[key] = val
    return labels


@runner_group.command("register")
@click.option("--server", required=True, help="Base URL of looprelay (e.g. http://127.0.0.1:8484).")
@click.option("--token", required=True, help="Registration token from `looprelay runners token`.")
@click.option("--name", required=True, help="A name for this runner, shown to operators.")
@click.option("--label", "labels", multiple=True, help="k=v label; repeat for several.")
@click.option(
    "--capacity",
    type=int,
    default=2,
    show_default=True,
    help="Harnesses this runner runs at once: one per tmux session, one per headless turn "
    "in flight (a headless session holds none between turns).",
)
@_credentials_option("Where to write the credentials")
@click.option(
    "--replace",
    is_flag=True,
    help="Overwrite existing credentials (the runner they name stays registered until "
    "`looprelay runners revoke`).",
)
def runner_register(
    server: str,
    token: str,
    name: str,
    labels: tuple[str, ...],
    capacity: int,
    credentials_path: Path | None,
    replace: bool,
) -> None:
    """Register this machine with a registration token; writes its credentials (0600)."""
    from importlib.metadata import version

    from looprelay.agent.credentials import default_credentials_path, write_credentials
    from looprelay.agent.register import register

    path = credentials_path or default_credentials_path()
    if path.exists() and not replace:
        # Checked before the token is spent: it is single use.
        raise click.ClickException(
            f"{path} already holds a runner's credentials; pass --replace to overwrite them, "
            "or --credentials to write another file"
        )
    _warn_if_plain_http(server)
    credentials = register(
        server=server,
        token=token,
        name=name,
        labels=_labels(labels),
        version=version("looprelay"),
        capacity=capacity,
    )
    write_credentials(path, credentials)
    click.echo(f"registered {credentials.name} as {credentials.runner_id}; credentials in {path}")


@runner_group.command("run")
@_credentials_option("Credentials from `runner register`")
@click.option(
    "--checkout",
    "checkouts",
    multiple=True,
    help="owner/repo=/absolute/path of your git checkout; sessions get worktrees of it. Repeat.",
)
@click.option(
    "--workspace",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Root for clones and worktrees; serves any repository and pull-request sessions.",
)
@click.option(
    "--strategy",
    type=click.Choice(["worktree", "clone"]),
    default="worktree",
    show_default=True,
    help="Workspace layout: one clone per repository plus a worktree per work item, or a "
    "full clone per work item.",
)
@click.option(
    "--clone-protocol",
    type=click.Choice(["https", "ssh"]),
    default="https",
    show_default=True,
    help="How workspace clones reach the repository (your git config and keys apply).",
)
@click.option("--git-host", default="github.com", show_default=True, help="Host to clone from.")
@click.option(
    "--git-timeout",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds any one git command may take.",
)
@click.option(
    "--keep-checkout-on-close",
    is_flag=True,
    help="Keep a work item's worktree or clone when its issue or PR closes.",
)
@click.option(
    "--harness",
    "harness_names",
    multiple=True,
    type=click.Choice(get_args(HarnessName)),
    help="A coding agent this runner serves; repeat for more [default: every one on PATH]. "
    "Work bound to another harness is left to other runners.",
)
@click.option(
    "--harness-arg",
    "harness_args",
    multiple=True,
    help="HARNESS=ARG, one extra argv element for that harness, in order; repeat "
    "(e.g. claude=--model=opus, claude=--permission-mode=acceptEdits).",
)
@click.option(
    "--tmux-socket",
    default=None,
    help="Private tmux socket (tmux -L NAME) [default: looprelay-<runner id>].",
)
@click.option(
    "--capacity",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Dispatches applied at once (different work items run in parallel).",
)
@click.option(
    "--state",
    "state_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Ledger and status [default: ~/.local/state/looprelay-runner/<runner id>].",
)
@click.option(
    "--poll-wait",
    type=click.FloatRange(0, MAX_POLL_WAIT_SECONDS),
    default=300.0,
    show_default=True,
    help="Seconds one long poll may wait; the server holds it at most its runners.pollWaitSeconds.",
)
@click.option(
    "--keep-session-on-terminate/--kill-session-on-terminate",
    default=True,
    show_default=True,
    help="After `stop`, keep the tmux session (the pane shows how the harness ended) or kill it.",
)
@click.option(
    "--sandbox",
    type=click.Choice(["always", "untrusted", "never"]),
    default="untrusted",
    show_default=True,
    help="Run sessions in bubblewrap (tree and harness config writable, the rest of $HOME, "
    "runner.json and the state hidden): every session, fork pull requests' sessions "
    "(refused when bwrap does not work here), or none.",
)
@log_options
def runner_run(
    credentials_path: Path | None,
    checkouts: tuple[str, ...],
    workspace: Path | None,
    strategy: str,
    clone_protocol: str,
    git_host: str,
    git_timeout: float,
    keep_checkout_on_close: bool,
    harness_names: tuple[str, ...],
    harness_args: tuple[str, ...],
    tmux_socket: str | None,
    capacity: int,
    state_dir: Path | None,
    poll_wait: float,
    keep_session_on_terminate: bool,
    sandbox: str,
    log_level: str,
    log_format: LogFormat,
) -> None:
    """Run the agent in the foreground; first SIGTERM drains, a second stops at once."""
    from looprelay.agent.credentials import default_credentials_path, read_credentials
    from looprelay.agent.harness_options import parse_harness_args
    from looprelay.agent.start import RunnerOptions, build_agent
    from looprelay.logs import configure_logging

    if not checkouts and workspace is None:
        # Without a tree to work in, every session would be refused once claimed.
        raise click.UsageError(
            "give --checkout owner/repo=/path/to/checkout (repeat for more) or --workspace DIR: "
            "without either this runner has nowhere to run a session"
        )
    configure_logging(log_level, log_format=log_format)
    agent = build_agent(
        RunnerOptions(
            credentials_path=credentials_path or default_credentials_path(),
            state_dir=state_dir,
            checkout_pairs=checkouts,
            workspace=workspace.resolve() if workspace else None,
            strategy=strategy,
            clone_protocol=clone_protocol,
            git_host=git_host,
            git_timeout_seconds=git_timeout,
            keep_checkout_on_close=keep_checkout_on_close,
            tmux_socket=tmux_socket,
            capacity=capacity,
            poll_wait_seconds=poll_wait,
            keep_session_on_terminate=keep_session_on_terminate,
            harness_args=parse_harness_args(harness_args),
            harnesses=harness_names,
            sandbox=sandbox,
        )
    )

    _warn_if_plain_http(read_credentials(credentials_path or default_credentials_path()).server)

    def _signal(signum: int, frame: FrameType | None) -> None:
        # First signal drains (finish and report what is in hand), the second stops now.
        (agent.stop if agent.drain.is_set() else agent.drain).set()

    signal.signal(signal.SIGINT, _signal)
    signal.signal(signal.SIGTERM, _signal)
    click.echo("runner agent up; serving:", err=True)
    for line in agent.serving:
        click.echo(f"  {line}", err=True)
    sys.exit(agent.run())


@runner_group.command("status")
@_credentials_option("The runner's credentials, which name its state")
@click.option(
    "--state",
    "state_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The agent's state directory [default: ~/.local/state/looprelay-runner/<runner id>].",
)
@click.option(
    "--tmux-socket", default=None, help="The agent's tmux socket [default: looprelay-<runner id>]."
)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def runner_status(
    credentials_path: Path | None, state_dir: Path | None, tmux_socket: str | None, as_json: bool
) -> None:
    """Show what the local agent holds and how to attach to its sessions."""
    from looprelay.agent.credentials import default_credentials_path, read_credentials
    from looprelay.agent.ledger import Ledger
    from looprelay.agent.start import LEDGER_FILE, STATUS_FILE, default_tmux_socket
    from looprelay.agent.statedir import default_state_dir
    from looprelay.core.attach import attach_command

    if state_dir is None or tmux_socket is None:
        runner_id = read_credentials(credentials_path or default_credentials_path()).runner_id
        state_dir = state_dir or default_state_dir(runner_id)
        tmux_socket = tmux_socket or default_tmux_socket(runner_id)
    status_file = state_dir / STATUS_FILE
    if not status_file.exists():
        raise click.ClickException(f"no agent state in {state_dir}; is `runner run` started?")
    status = json.loads(status_file.read_text())
    sessions = Ledger(state_dir / LEDGER_FILE).all_sessions()
    hosted = status.get("hosted") or {}  # as the agent's last heartbeat saw them
    status["sessions"] = [
        {
            "session": s.session_name,
            "work_item": s.work_item,
            "endpoint": s.endpoint,
            "state": hosted.get(s.session_name, "unknown"),
            "checkout": s.checkout,
            "attach": attach_command(socket=tmux_socket, session=s.session_name)
            if s.runner_kind == "tmux"
            else None,
        }
        for s in sessions
    ]
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    counts = ", ".join(f"{name} {count}" for name, count in sorted(status["counts"].items()))
    click.echo(f"agent: {status['note']}; {counts or 'nothing applied yet'}")
    held = [{"dispatch_id": d, "holding": what} for d, what in status["holding"].items()]
    if held:
        click.echo("")
        table(held, ("dispatch_id", "holding"))
    click.echo("")
    if not status["sessions"]:
        click.echo("no sessions")
    table(status["sessions"], ("endpoint", "work_item", "session", "state", "checkout", "attach"))


@runner_group.command("rotate")
@_credentials_option("The runner's credentials, rewritten with the new secret")
def runner_rotate(credentials_path: Path | None) -> None:
    """Give this runner a new secret and write it to its credentials file (0600).

    A running agent picks the new secret up at its next refused call: no restart."""
    from looprelay.agent.client import RunnerClient
    from looprelay.agent.credentials import (
        credentials_lock,
        default_credentials_path,
        read_credentials,
        write_credentials,
    )
    from looprelay.errors import Transient, Unauthorized

    path = credentials_path or default_credentials_path()
    credentials = read_credentials(path)
    # Held until the file has the new secret: an agent refused meanwhile waits for it.
    with credentials_lock(path, exclusive=True):
        try:
            secret = RunnerClient(credentials).rotate()
        except Transient as exc:
            raise click.ClickException(
                f"cannot rotate at {credentials.server} ({exc}); the secret is unchanged, "
                "try again when the server answers"
            ) from None
        except Unauthorized:
            raise click.ClickException(
                _refused(credentials.runner_id, credentials.server)
            ) from None
        try:
            write_credentials(path, credentials.model_copy(update={"secret": secret}))
        except OSError as exc:
            raise click.ClickException(
                f"{credentials.server} retired the old secret but {path} could not be written "
                f"({exc.strerror}); fix that, then ask an operator for another secret with "
                f"`looprelay runners rotate {credentials.runner_id}`"
            ) from None
    click.echo(
        f"rotated the secret of {credentials.name} ({credentials.runner_id}); new one in {path}"
    )


@runner_group.command("remove")
@_credentials_option("The runner's credentials, deleted once it is deregistered")
@click.option(
    "--local-only",
    is_flag=True,
    help="Delete the credentials file without telling the server (it is gone for good); the "
    "runner stays registered until an operator runs `looprelay runners revoke`.",
)
def runner_remove(credentials_path: Path | None, local_only: bool) -> None:
    """Deregister this runner at its server, then delete its credentials file.

    A running agent is refused at its next call and stops; its sessions and state directory
    are left as they are."""
    from looprelay.agent.client import RunnerClient
    from looprelay.agent.credentials import (
        credentials_lock,
        default_credentials_path,
        lock_path,
        read_credentials,
    )
    from looprelay.errors import ConfigError, Transient, Unauthorized

    path = credentials_path or default_credentials_path()
    if local_only:
        if not path.exists():
            raise click.ClickException(f"{path} does not exist; nothing to remove")
        try:
            credentials = read_credentials(path)
            who = f"{credentials.name} ({credentials.runner_id})"
            after = (
                f"; it stays registered until `looprelay runners revoke {credentials.runner_id}`"
            )
        except ConfigError:
            who, after = "a runner", ""
        _delete(path, lock_path(path))
        click.echo(f"deleted {path}, the credentials of {who}{after}")
        return
    credentials = read_credentials(path)
    with credentials_lock(path, exclusive=True):
        try:
            RunnerClient(credentials).deregister()
        except Transient as exc:
            raise click.ClickException(
                f"cannot deregister at {credentials.server} ({exc}); nothing was changed: try "
                "again when the server answers, or pass --local-only to delete the credentials "
                f"anyway (then an operator runs `looprelay runners revoke {credentials.runner_id}`)"
            ) from None
        except Unauthorized:
            raise click.ClickException(
                _refused(credentials.runner_id, credentials.server)
                + "; pass --local-only to delete them"
            ) from None
        _delete(path)
    _delete(lock_path(path))
    click.echo(
        f"deregistered {credentials.name} ({credentials.runner_id}) at {credentials.server}; "
        f"deleted {path}"
    )


def _refused(runner_id: str, server: str) -> str:
    return (
        f"{server} no longer accepts the credentials of {runner_id} (revoked, unknown there, "
        "or its secret replaced by an operator's `looprelay runners rotate`)"
    )


def _delete(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
