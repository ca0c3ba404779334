"""Store operations per routed comment, counted at the adapters, against the design's minimum.

An in-process ``looprelay.app.local.LocalStack`` is built with its store factories wrapped by
``storecount.install`` (no production code changes). Each delivery goes through the real ingress
(signed), its task is taken from the embedded queue and handed to the real worker, and the
counters' difference is that event's cost. After each routed comment, the runner side of its
dispatch (a long poll that leases it, then the result) goes through the real runner API and is
counted on its own. Backends: SQLite always; Firestore when the emulator is found (started here
like ``tests/firestore_emulator.py`` does, or ``FIRESTORE_EMULATOR_HOST``). See bench/README.md
for the minimum and how it is derived.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from loadrig import AUTO_EXECUTE_LABEL, free_port  # noqa: E402
from loadrun import FIXTURE  # noqa: E402
from storecount import OpCounts, install  # noqa: E402

from looprelay.app.adapters import open_runner_registry  # noqa: E402
from looprelay.app.ingress_http import webhook_handler  # noqa: E402
from looprelay.app.messages import Request  # noqa: E402
from looprelay.app.runner_http import RunnerHttp  # noqa: E402
from looprelay.app.worker_http import worker_handler  # noqa: E402
from looprelay.config.model import Config  # noqa: E402
from looprelay.core.model import RunnerRecord  # noqa: E402
from looprelay.core.signature import sign_body  # noqa: E402
from looprelay.core.tasknames import task_name_prefix  # noqa: E402
from looprelay.datadir import WEBHOOK_SECRET_FILE, WORKER_TOKEN_FILE, read_secret  # noqa: E402
from looprelay.service.runners import mint_registration_token  # noqa: E402
from looprelay.wire.runner_api import runner_bearer  # noqa: E402

REPEATS = 20
BOT = "looprelay"
# The minimum per event kind (port reads/writes, SQLite commits, Firestore documents), as
# derived in bench/README.md.
MINIMUM: dict[str, dict[str, Any]] = {
    "routed comment": {"port": (1, 3), "sqlite commits": 3, "doc reads": 1, "doc writes": 5},
    "runner: lease + result": {
        "port": (1, 2),
        "sqlite commits": 2,
        "doc reads": 1,
        "doc writes": 3,
    },
    "duplicate": {"port": (1, 0), "sqlite commits": 0, "doc reads": 1, "doc writes": 0},
    "bot comment (ignored)": {"port": (0, 1), "sqlite commits": 1, "doc reads": 0, "doc writes": 2},
}


@dataclass
class Harness:
    """The stack under count, and how to feed it."""

    stack: Any
    counts: OpCounts
    secret: bytes
    worker_token: str
    runner_auth: str = ""

    def deliver(self, payload: dict[str, Any], delivery_id: str) -> str:
        """Ingress then worker for one delivery; returns the worker's JSON status."""
        body = json.dumps(payload).encode()
        headers = {
            "content-type": "application/json",
            "x-github-event": "issue_comment",
            "x-github-delivery": delivery_id,
            "x-hub-signature-256": sign_body(body, self.secret),
        }
        acked = webhook_handler(self.stack.ingress)(Request("POST", "/webhook", headers, body))
        assert acked.status == 202, acked.body
        return self.work(self.task_body(delivery_id))

    def task_body(self, delivery_id: str) -> bytes:
        """The queued task of ``delivery_id`` (the queue's dispatchers are stopped)."""
        prefix = task_name_prefix(delivery_id)
        [task] = [
            t for t in self.stack.queue.list_tasks(limit=100_000) if t.name.startswith(prefix)
        ]
        body: bytes = task.body
        return body

    def work(self, body: bytes) -> str:
        auth = {"authorization": f"Bearer {self.worker_token}", "content-type": "application/json"}
        answer = worker_handler(self.stack.worker)(Request("POST", "/worker", auth, body))
        assert answer.status == 200, answer.body
        return str(json.loads(answer.body).get("outcome"))

    def runner(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"authorization": self.runner_auth, "content-type": "application/json"}
        request = Request("POST", f"/runner/v1/{path}", headers, json.dumps(body).encode())
        answer = RunnerHttp(self.stack.runner_api).handle(request)
        assert answer.status in (200, 201, 204), (path, answer.status, answer.body)
        return json.loads(answer.body) if answer.body else {}


def _comment(number: int, comment_id: int, text: str, login: str = "Codertocat") -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
    payload["issue"]["number"] = number
    payload["issue"]["labels"].append({"name": AUTO_EXECUTE_LABEL})
    payload["comment"].update(id=comment_id, body=text)
    payload["comment"]["user"] = dict(payload["comment"]["user"], login=login)
    payload["sender"] = dict(payload["sender"], login=login)
    return payload


def _config(firestore_prefix: str | None) -> Config:
    data: dict[str, Any] = {
        "routing": {"authorizedUsers": ["codertocat"], "botLogins": [BOT]},
        "server": {"port": 0},
    }
    if firestore_prefix is not None:
        data["store"] = {
            "backend": "firestore",
            "firestore": {"project": "demo-looprelay", "collectionPrefix": firestore_prefix},
        }
    return Config.model_validate(data)


@contextlib.contextmanager
def _stack(tmp: Path, config: Config) -> Iterator[Harness]:
    from looprelay.app.local import LocalStack

    counts = OpCounts()
    uninstall = install(counts)
    try:
        stack = LocalStack(config, data_dir=tmp / "data", environ=os.environ)
    finally:
        uninstall()
    try:
        # Serve (so stop() can shut the server down) but keep the queue from dispatching:
        # each task is handed to the worker here, between two snapshots of the counters.
        stack.start()
        stack.queue.stop()
        secret = read_secret(tmp / "data" / WEBHOOK_SECRET_FILE).encode()
        token = read_secret(tmp / "data" / WORKER_TOKEN_FILE)
        yield Harness(stack, counts, secret, token)
    finally:
        stack.stop()


def _register_runner(h: Harness, config: Config, tmp: Path) -> None:
    registry = open_runner_registry(config, data_dir=tmp / "data")
    token = mint_registration_token(registry, now=datetime.now(UTC), ttl=timedelta(hours=1))
    # Each repeat starts one more session, and the server leases a spawn only into a free slot.
    answer = h.runner("register", {"token": token, "name": "ops", "capacity": REPEATS})
    h.runner_auth = runner_bearer(answer["runner_id"], answer["secret"])
    heartbeat = {"capacity": REPEATS, "repositories": ["codertocat/hello-world"], "sessions": 0}
    h.runner("heartbeat", heartbeat)


def _apply_next(h: Harness) -> None:
    """The runner side: lease the next dispatch (no wait) and report it applied."""
    leased = h.runner("poll", {"wait_seconds": 0})["dispatch"]
    status = "spawned" if leased["kind"] == "spawn" else "delivered"
    result = {"dispatch_id": leased["dispatch_id"], "status": status}
    result |= {"session_id": str(uuid.uuid4()), "tmux_target": leased["session_name"]}
    h.runner("results", result)


def _measure(h: Harness, label: str, action: Any, rows: dict[str, list[dict[str, int]]]) -> Any:
    before = h.counts.snapshot()
    value = action()
    rows.setdefault(label, []).append(OpCounts.minus(h.counts.snapshot(), before))
    return value


def run_backend(tmp: Path, config: Config) -> dict[str, dict[str, float]]:
    """Count each event kind ``REPEATS`` times on one backend; returns mean counts per kind."""
    rows: dict[str, list[dict[str, int]]] = {}
    with _stack(tmp, config) as h:
        _register_runner(h, config, tmp)
        ids = iter(range(50_000_000, 60_000_000))
        for number in range(1, REPEATS + 1):
            start = _comment(number, next(ids), "the-loop start")
            outcome = _measure(
                h, "start comment (spawn)", lambda s=start: h.deliver(s, uuid.uuid4().hex), rows
            )
            assert outcome == "dispatched", outcome
            _measure(h, "runner: spawn lease+result", lambda: _apply_next(h), rows)
            comment = _comment(number, next(ids), "please also handle the edge case")
            delivery = uuid.uuid4().hex
            outcome = _measure(
                h, "routed comment", lambda c=comment, d=delivery: h.deliver(c, d), rows
            )
            assert outcome == "dispatched", outcome
            _measure(h, "runner: lease + result", lambda: _apply_next(h), rows)
            body = h.task_body(delivery)
            again = _measure(h, "duplicate", lambda b=body: h.work(b), rows)
            assert again == "dispatched", again
            bot = _comment(number, next(ids), "I am the bot", login=f"{BOT}[bot]")
            outcome = _measure(
                h, "bot comment (ignored)", lambda b=bot: h.deliver(b, uuid.uuid4().hex), rows
            )
            assert outcome == "ignored", outcome
    return {label: _mean(samples) for label, samples in rows.items()}


def _mean(samples: list[dict[str, int]]) -> dict[str, float]:
    keys = {key for sample in samples for key in sample}
    return {key: sum(s.get(key, 0) for s in samples) / len(samples) for key in sorted(keys)}


# -- idle runners: reads per waiting runner-second -------------------------------------------

IDLE_RUNNERS = (1, 50, 200)
IDLE_WINDOW_SECONDS = 30.0
"""Longer than a poll's wait (25 s), so each runner's next poll is counted too; as long as
the default heartbeat period, so each runner sends one heartbeat in it."""
IDLE_REPOSITORY = "octo/idle"
IDLE_VERSION = "0.0.0-bench"
AGENT_POLLS = 2
"""Polls a default agent holds: ``looprelay runner start --capacity`` (2)."""
AGENT_HEARTBEAT_SECONDS = 30.0
"""A default agent's heartbeat period (``runners.heartbeatSeconds``)."""
WARM_SECONDS = 3.0
"""After the first heartbeats are answered and the polls sent: every first look is done."""


@dataclass(frozen=True)
class Agent:
    """What each idle runner does: ``polls`` long polls held at once, and a heartbeat every
    ``heartbeat_seconds`` (0: none), as ``agent/run.py`` sends them."""

    polls: int = AGENT_POLLS
    heartbeat_seconds: float = AGENT_HEARTBEAT_SECONDS

    def status(self) -> dict[str, Any]:
        """A heartbeat's body, as ``agent/start.py``'s ``describe`` makes it (no capacity)."""
        return {
            "version": IDLE_VERSION,
            "repositories": [IDLE_REPOSITORY],
            "workspace": False,
            "sessions": 0,
        }


def _idle_config(prefix: str) -> Config:
    firestore = {"project": "demo-looprelay", "collectionPrefix": prefix}
    return Config.model_validate({"store": {"backend": "firestore", "firestore": firestore}})


def _idle_runners(
    config: Config, count: int, agent: Agent, repository: str = IDLE_REPOSITORY
) -> list[tuple[str, str]]:
    """Register ``count`` runners of capacity ``agent.polls`` serving ``repository``, as
    their agents last reported it; their ids and bearer credentials, oldest first."""
    from looprelay.ports import RunnerStatus
    from looprelay.service.runner_secrets import hash_credential, new_runner_id, new_runner_secret

    registry = open_runner_registry(config, data_dir=None)
    now = datetime.now(UTC)
    bearers = []
    for n in range(count):
        runner_id, secret = new_runner_id(), new_runner_secret()
        record = RunnerRecord(
            runner_id=runner_id,
            name=f"idle-{n}",
            secret_hash=hash_credential(secret),
            registered_at=now,
            last_seen_at=now,
            version=IDLE_VERSION,
            capacity=agent.polls,
        )
        registry.add_runner(record)
        status = RunnerStatus(
            version=IDLE_VERSION, capacity=agent.polls, repositories=(repository,)
        )
        registry.record_heartbeat(runner_id, at=now, status=status)
        bearers.append((runner_id, runner_bearer(runner_id, secret)))
    return bearers


def _build_counted(config: Config, counts: OpCounts) -> tuple[Any, list[Any]]:
    """``app.cloud.build_runner_api`` with its stores counted; also its listeners (the
    dispatch feed and the runner directory or the runner changes feed, where this tree has
    them), whose reads are not RPCs of the counted clients."""
    from looprelay.app import adapters
    from looprelay.app.cloud import build_runner_api

    listeners: list[Any] = []
    restore: list[tuple[str, Any]] = []
    for name in ("open_dispatch_feed", "open_runner_directory", "open_runner_changes"):
        opener = getattr(adapters, name, None)  # absent from trees before each
        if opener is None:
            continue

        def kept(*args: Any, _opener: Any = opener, **kwargs: Any) -> Any:
            listeners.append(_opener(*args, **kwargs))
            return listeners[-1]

        restore.append((name, opener))
        setattr(adapters, name, kept)
    uninstall = install(counts)
    try:
        built = build_runner_api(config, os.environ)
        # Trees since the listeners open in the serving process return them unstarted,
        # beside the API; earlier trees return the API, listening already.
        if hasattr(built, "listeners"):
            built.start()
            built = built.api
        return built, listeners
    finally:
        uninstall()
        for name, opener in restore:
            setattr(adapters, name, opener)


def idle_reads(count: int, window: float, agent: Agent) -> dict[str, float]:
    """Reads per idle runner-second of the cloud runner API (``app.cloud.build_runner_api``,
    whatever this tree's is) with ``count`` runners behaving as ``agent`` says, for
    ``window`` seconds, nothing to lease. Needs ``FIRESTORE_EMULATOR_HOST``."""
    import asyncio

    from looprelay.app.asgi import Blocking
    from looprelay.app.longpoll import runner_api_handler

    config = _idle_config(f"idle{uuid.uuid4().hex[:8]}_")
    bearers = [bearer for _, bearer in _idle_runners(config, count, agent)]
    counts = OpCounts()
    api, listeners = _build_counted(config, counts)
    handle = runner_api_handler(api, Blocking())
    sent: dict[str, int] = {"poll": 0, "heartbeat": 0}
    counting = False

    def listened() -> int:
        return sum(getattr(listener, "reads", 0) for listener in listeners)

    async def call(bearer: str, path: str, body: dict[str, Any], expected: int) -> None:
        headers = {"authorization": bearer, "content-type": "application/json"}
        if counting:
            sent[path] += 1
        request = Request("POST", f"/runner/v1/{path}", headers, json.dumps(body).encode())
        answer = await handle(request)
        if answer.status != expected:
            raise RuntimeError(f"an idle {path} got {answer.status}: {answer.body!r}")

    async def poll(bearer: str) -> None:
        while True:
            await call(bearer, "poll", {"wait_seconds": 25}, 204)

    async def beat(bearer: str, first: float) -> None:
        await asyncio.sleep(first - time.monotonic())
        while True:
            await call(bearer, "heartbeat", agent.status(), 200)
            await asyncio.sleep(agent.heartbeat_seconds)

    async def run() -> dict[str, float]:
        nonlocal counting
        # As an agent starts: one heartbeat flagged restarted, then its polls.
        restarted = agent.status() | {"restarted": True}
        if agent.heartbeat_seconds:
            await asyncio.gather(*(call(b, "heartbeat", restarted, 200) for b in bearers))
        tasks = [asyncio.ensure_future(poll(b)) for b in bearers for _ in range(agent.polls)]
        start = time.monotonic() + WARM_SECONDS
        if agent.heartbeat_seconds:
            # Heartbeats spread over the period, as agents started at different times send
            # them: each runner's first falls in the window once.
            period = agent.heartbeat_seconds
            tasks += [
                asyncio.ensure_future(beat(b, start + (n + 0.5) * period / count))
                for n, b in enumerate(bearers)
            ]
        await asyncio.sleep(start - time.monotonic())
        before, heard, counting = counts.snapshot(), listened(), True
        await asyncio.sleep(window)
        spent = OpCounts.minus(counts.snapshot(), before)
        listener, counting = listened() - heard, False
        for task in tasks:
            task.cancel()
        for failed in await asyncio.gather(*tasks, return_exceptions=True):
            if not isinstance(failed, asyncio.CancelledError | type(None)):
                raise failed
        return _idle_row(count, window, agent, spent=spent, listener=listener, sent=sent)

    try:
        return asyncio.run(run())
    finally:
        for listener in listeners:
            listener.close()


def _idle_row(
    count: int,
    window: float,
    agent: Agent,
    *,
    spent: dict[str, int],
    listener: int,
    sent: dict[str, int],
) -> dict[str, float]:
    reads = spent.get("doc.reads", 0) + listener
    return {
        "runners": count,
        "seconds": window,
        "polls each": agent.polls,
        "heartbeat seconds": agent.heartbeat_seconds,
        "reads": reads,
        "listener reads": listener,
        "writes": spent.get("doc.writes", 0),
        "reads per runner-second": reads / (count * window),
        "polls": sent["poll"],
        "heartbeats": sent["heartbeat"],
    }


def _base_tree(commit: str, into: Path) -> Path:
    """``shared/`` of ``commit`` (the code before the change) extracted into ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(BENCH.parent), "archive", commit, "shared"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "shared"


def idle_table(before: str | None, window: float, agent: Agent) -> list[dict[str, Any]]:
    """Measure each of ``IDLE_RUNNERS`` with this tree and, if given, with commit ``before``
    (run in a child process with that tree's ``shared/`` first on the path)."""
    flags = ["--window", str(window), "--polls", str(agent.polls)]
    flags += ["--heartbeat-seconds", str(agent.heartbeat_seconds)]
    return _both_trees(
        before,
        IDLE_RUNNERS,
        lambda count: ["--idle-one", str(count), *flags],
        lambda count: idle_reads(count, window, agent),
    )


def _both_trees(
    before: str | None,
    counts: Sequence[int],
    child_args: Callable[[int], list[str]],
    here: Callable[[int], dict[str, Any]],
) -> list[dict[str, Any]]:
    """For each of ``counts``: a row measured on commit ``before`` (if given, in a child
    process started with ``child_args``, that tree's ``shared/`` first on the path), then a
    row measured on this tree with ``here``."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="looprelay-storeops-") as tmp:
        base = _base_tree(before, Path(tmp)) if before else None
        for count in counts:
            if base is not None:
                env = dict(os.environ, PYTHONPATH=str(base))
                child = [sys.executable, __file__, *child_args(count)]
                out = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
                rows.append({"code": before, **json.loads(out.stdout)})
            rows.append({"code": "this tree", **here(count)})
    return rows


def _print_idle(rows: list[dict[str, Any]]) -> None:
    head = f"{'code':<12} {'runners':>7} {'reads':>8} {'listener':>8} {'writes':>7}"
    print(f"{head} {'polls':>6} {'beats':>6} {'reads/runner-s':>15}")
    for row in rows:
        print(
            f"{str(row['code'])[:12]:<12} {row['runners']:>7} {row['reads']:>8}"
            f" {row['listener reads']:>8} {row['writes']:>7} {row['polls']:>6}"
            f" {row['heartbeats']:>6} {row['reads per runner-second']:>15.4f}"
        )
    first = rows[0]
    beats = (
        f"a heartbeat every {first['heartbeat seconds']:g} s"
        if first["heartbeat seconds"]
        else "no heartbeats"
    )
    print(
        f"over {first['seconds']:g} s: {first['polls each']} long polls per runner (25 s each,"
        f" as agents ask), {beats}; polls and beats: requests sent in the window"
    )


# -- reads per lease: a dispatch that follows its session, among many runners --------------

LEASE_RUNNERS = (1, 50, 200)
LEASE_REPEATS = 5
LEASE_REPOSITORY = "octo/leases"
LEASE_DEADLINE_SECONDS = 30.0
"""Longest a listener's push is waited for."""


def _lease_config(prefix: str) -> Config:
    """The cloud's store, liveness read on every look (``runnerListMaxAgeSeconds`` 0): each
    look pays what one pays whenever the cached liveness is older than its 5 s."""
    firestore = {"project": "demo-looprelay", "collectionPrefix": prefix}
    return Config.model_validate(
        {
            "store": {"backend": "firestore", "firestore": firestore},
            "runners": {"runnerListMaxAgeSeconds": 0},
        }
    )


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + LEASE_DEADLINE_SECONDS
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {LEASE_DEADLINE_SECONDS:g} s")
        time.sleep(0.05)


def lease_reads(count: int) -> dict[str, float]:
    """Document reads of the cloud runner API (``app.cloud.build_runner_api``, whatever this
    tree's is) among ``count`` runners, per look at a dispatch that follows its session to
    the oldest: by another runner, which may not take it, and by the session's own runner,
    which leases it; means over ``LEASE_REPEATS`` dispatches. Needs
    ``FIRESTORE_EMULATOR_HOST``."""
    from looprelay.app.adapters import open_work_item_store
    from looprelay.app.runner_http import RunnerHttp
    from tests.dispatches import make_dispatch, save_with_own_session

    config = _lease_config(f"lease{uuid.uuid4().hex[:8]}_")
    (owner, owner_bearer), *others = _idle_runners(config, count, Agent(), LEASE_REPOSITORY)
    counts = OpCounts()
    api, listeners = _build_counted(config, counts)
    http, items = RunnerHttp(api), open_work_item_store(config, data_dir=None)
    [feed] = [listener for listener in listeners if hasattr(listener, "open_dispatches")]
    directory = next((listener for listener in listeners if hasattr(listener, "find")), None)

    def reads_of(bearer: str, expected: int) -> int:
        headers = {"authorization": bearer, "content-type": "application/json"}
        request = Request("POST", "/runner/v1/poll", headers, b'{"wait_seconds": 0}')
        before = counts.snapshot().get("doc.reads", 0)
        answer = http.handle(request)
        if answer.status != expected:
            raise RuntimeError(f"a poll got {answer.status}, not {expected}: {answer.body!r}")
        return counts.snapshot().get("doc.reads", 0) - before

    looks, leases = [], []
    try:
        ids = [owner] + [runner_id for runner_id, _ in others[:1]]
        if directory is not None:  # trees with a runner directory: its push
            _until(lambda: all(directory.find(r) for r in ids), "push of the runners")
        else:  # a cache of runners: live, then filled by one poll of each
            _until(lambda: all(x.live() for x in listeners if hasattr(x, "live")), "live")
            for bearer in [owner_bearer] + [b for _, b in others[:1]]:
                reads_of(bearer, 204)
        for number in range(1, LEASE_REPEATS + 1):
            now = datetime.now(UTC)
            dispatch = make_dispatch(
                repository=LEASE_REPOSITORY,
                number=number,
                created_at=now,
                kind="deliver",
                runner_id=owner,
            )
            save_with_own_session(
                items,
                repository=LEASE_REPOSITORY,
                number=number,
                dispatches=[dispatch],
                now=now,
                session_status="live",
                session_runner=owner,
            )
            _until(
                lambda d=dispatch: any(
                    o.dispatch_id == d.dispatch_id and o.status == "pending"
                    for o in feed.open_dispatches() or ()
                ),
                "push of the dispatch",
            )
            if others:
                looks.append(reads_of(others[0][1], 204))
            leases.append(reads_of(owner_bearer, 200))
    finally:
        for listener in listeners:
            listener.close()
    return {
        "runners": count,
        "look by another runner": sum(looks) / len(looks) if looks else -1.0,
        "lease by its runner": sum(leases) / len(leases),
    }


def lease_table(before: str | None) -> list[dict[str, Any]]:
    """Measure each of ``LEASE_RUNNERS`` with this tree and, if given, with commit ``before``
    (as ``idle_table`` does)."""
    return _both_trees(
        before, LEASE_RUNNERS, lambda count: ["--lease-one", str(count)], lease_reads
    )


def _print_leases(rows: list[dict[str, Any]]) -> None:
    print(f"{'code':<12} {'runners':>7} {'reads/look by another':>22} {'reads/lease':>12}")
    for row in rows:
        look = row["look by another runner"]
        print(
            f"{str(row['code'])[:12]:<12} {row['runners']:>7}"
            f" {'-' if look < 0 else f'{look:.1f}':>22} {row['lease by its runner']:>12.1f}"
        )
    print(
        f"means over {LEASE_REPEATS} dispatches, each following its session to the oldest"
        " runner; liveness read on every look (runnerListMaxAgeSeconds 0)"
    )


# -- the Firestore emulator -------------------------------------------------------------------


@contextlib.contextmanager
def _emulator() -> Iterator[str | None]:
    """``host:port`` of a Firestore emulator (started here if need be), or None if there is none."""
    running = os.environ.get("FIRESTORE_EMULATOR_HOST")
    if running:
        yield running
        return
    from tests.firestore_emulator import MAIN_CLASS, _find_jar

    jar, java = _find_jar(), shutil.which("java")
    if jar is None or java is None:
        yield None
        return
    host = f"127.0.0.1:{free_port()}"
    cmd = [java, "-Duser.language=en", "-cp", str(jar), MAIN_CLASS, "--host=127.0.0.1"]
    process = subprocess.Popen(
        [*cmd, f"--port={host.split(':')[1]}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_emulator(host, process)
        os.environ["FIRESTORE_EMULATOR_HOST"] = host
        yield host
    finally:
        os.environ.pop("FIRESTORE_EMULATOR_HOST", None)
        for sig, wait in ((signal.SIGINT, 10), (signal.SIGKILL, None)):
            if process.poll() is None:
                os.killpg(process.pid, sig)  # its own process group: the JVM it started
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(wait)


def _wait_emulator(host: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the Firestore emulator exited with {process.returncode}")
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection(host, timeout=2)
            conn.request("GET", "/")
            if conn.getresponse().status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError("the Firestore emulator did not start within 60 s")


# -- the table --------------------------------------------------------------------------------


def _row(backend: str, kind: str, c: dict[str, float]) -> str:
    port = f"{c.get('port.read', 0):.1f}/{c.get('port.write', 0):.1f}"
    minimum = MINIMUM.get(kind)
    if backend == "sqlite":
        sql = f"{c.get('sql.SELECT', 0):.1f}/{c.get('sql.commits', 0):.1f}"
        floor = (
            f"{minimum['port'][0]}/{minimum['port'][1]} | {minimum['sqlite commits']}"
            if minimum
            else "-"
        )
    else:
        sql = f"{c.get('doc.reads', 0):.1f}/{c.get('doc.writes', 0):.1f}"
        docs = f"{minimum['doc reads']}/{minimum['doc writes']}" if minimum else ""
        floor = f"{minimum['port'][0]}/{minimum['port'][1]} | {docs}" if minimum else "-"
    return f"{backend:<9} {kind:<26} {port:>11} {sql:>13}   {floor}"


def _runner_tables(args: argparse.Namespace, agent: Agent) -> int:
    """``--idle`` or ``--leases``: measure on the emulator and print the table (or JSON)."""
    with _emulator() as host:
        if host is None:
            print("the Firestore emulator is needed for --idle and --leases", file=sys.stderr)
            return 1
        rows = (
            idle_table(args.before, args.window, agent) if args.idle else lease_table(args.before)
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        (_print_idle if args.idle else _print_leases)(rows)
    return 0


def main() -> int:
    """Count per backend and print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--no-firestore", action="store_true", help="SQLite only")
    parser.add_argument(
        "--idle",
        action="store_true",
        help="reads per idle runner-second at 1, 50 and 200 runners instead (Firestore)",
    )
    parser.add_argument(
        "--before", help="with --idle or --leases: also measure this commit, same run"
    )
    parser.add_argument("--window", type=float, default=IDLE_WINDOW_SECONDS)
    parser.add_argument(
        "--polls",
        type=int,
        default=AGENT_POLLS,
        help="with --idle: long polls each runner holds (a default agent: 2)",
    )
    parser.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=AGENT_HEARTBEAT_SECONDS,
        help="with --idle: each runner's heartbeat period, 0 for none (a default agent: 30);"
        " --polls 1 --heartbeat-seconds 0 is the bare mode measured before",
    )
    parser.add_argument(
        "--leases",
        action="store_true",
        help="reads per look at a dispatch that follows its session, at 1, 50 and 200 runners"
        " instead (Firestore)",
    )
    parser.add_argument("--idle-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--lease-one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    agent = Agent(polls=args.polls, heartbeat_seconds=args.heartbeat_seconds)
    if args.idle_one:  # the child of --before: one measurement, as JSON
        print(json.dumps(idle_reads(args.idle_one, args.window, agent)))
        return 0
    if args.lease_one:
        print(json.dumps(lease_reads(args.lease_one)))
        return 0
    if args.idle or args.leases:
        return _runner_tables(args, agent)
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="looprelay-storeops-") as tmp:
        results["sqlite"] = run_backend(Path(tmp) / "sqlite", _config(None))
        if not args.no_firestore:
            with _emulator() as host:
                if host is None:
                    print("Firestore emulator not found: SQLite only", file=sys.stderr)
                else:
                    prefix = f"ops{uuid.uuid4().hex[:8]}_"
                    results["firestore"] = run_backend(Path(tmp) / "fs", _config(prefix))
    if args.json:
        print(json.dumps({"results": results, "minimum": MINIMUM}, indent=2))
        return 0
    head = f"{'backend':<9} {'event':<26} {'port r/w':>11} {'SQL sel/commit':>13}"
    print(f"{head}   minimum port r/w | commits")
    print(f"{'':<9} {'':<26} {'':>11} {'(docs r/w)':>13}   (Firestore: port r/w | docs r/w)")
    for backend, kinds in results.items():
        for kind, counts in kinds.items():
            print(_row(backend, kind, counts))
    print(
        f"means over {REPEATS} events each; port = calls on the Store, WorkItemStore and"
        " RunnerRegistry adapters"
    )
    for backend, kinds in results.items():
        calls = kinds.get("routed comment", {})
        named = ", ".join(
            f"{k.removeprefix('call.')} {v:g}" for k, v in calls.items() if k.startswith("call.")
        )
        print(f"{backend} routed comment calls: {named}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
