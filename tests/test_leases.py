"""The runner work API over real HTTP: long poll, leases, results, order, affinity, targeting.

Built as ``looprelay.app.services.build_runner_api`` builds it, but from stores of each backend,
with progress going to the loopback fake GitHub and time coming from a clock the test moves.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
import requests

from looprelay.adapters.github.auth import TokenAuth
from looprelay.adapters.github.rest import GitHubRest
from looprelay.app.asgi import Blocking
from looprelay.app.longpoll import long_poll
from looprelay.config.model import RunnersConfig
from looprelay.core.model import DispatchRecord, RunnerRecord, SessionRecord, WorkItemRecord
from looprelay.core.prsessions import tmux_session_name
from looprelay.core.replies import (
    GITHUB_MAX_COMMENT_CHARS,
    MAX_FAILURE_NOTE_CHARS,
    MAX_REPLY_CHARS,
)
from looprelay.ports import DispatchFeed, WorkItemStore
from looprelay.service.lease_desk import (
    CLOUD_POLL_INTERVAL_SECONDS,
    MAX_DISPATCH_ATTEMPTS,
    LeaseDesk,
)
from looprelay.service.results import Progress
from looprelay.service.runner_cache import RunnerRecords
from looprelay.service.runners import RunnerApi, mint_registration_token
from looprelay.service.session_comments import SessionComments
from looprelay.service.waker import DispatchWaker, Opened
from looprelay.wire.runner_api import MAX_BODY_BYTES, PollBody, runner_bearer
from tests.app_server import AppServer
from tests.dispatches import make_dispatch, save_with_own_session
from tests.fake_github import APP_LOGIN, REPOSITORY, FakeGitHub
from tests.fake_harness import wait_until
from tests.rigs import SteppingClock, Stores

CONFIG = RunnersConfig()  # lease 60 s, lost after 120 s, long poll at most 25 s
GITHUB_TOKEN = "ghp_looprelay_test"
SHORT_WAIT = 0.2
HTTP_TIMEOUT = 30.0


@dataclass(frozen=True)
class Runner:
    runner_id: str
    secret: str
    name: str

    @property
    def auth(self) -> str:
        return runner_bearer(self.runner_id, self.secret)


@dataclass
class Desk:
    """The runner API under test, its stores, its clock, its waker and the fake GitHub."""

    url: str
    stores: Stores
    clock: SteppingClock
    waker: DispatchWaker
    github: FakeGitHub
    lease_desk: LeaseDesk | None = None

    def post(self, path: str, body: dict[str, Any], *, auth: str) -> requests.Response:
        return requests.post(
            f"{self.url}/runner/v1/{path}",
            json=body,
            headers={"Authorization": auth},
            timeout=HTTP_TIMEOUT,
        )

    def runner(
        self,
        name: str,
        *,
        repositories: tuple[str, ...] = (REPOSITORY,),
        workspace: bool = False,
        labels: dict[str, str] | None = None,
        capacity: int = 1,
    ) -> Runner:
        """Register a runner with a minted token and send its first heartbeat."""
        token = mint_registration_token(
            self.stores.registry, now=self.clock.now(), ttl=timedelta(hours=1)
        )
        answer = requests.post(
            f"{self.url}/runner/v1/register",
            json={"token": token, "name": name, "labels": labels or {}},
            timeout=HTTP_TIMEOUT,
        )
        assert answer.status_code == 201, answer.text
        runner = Runner(answer.json()["runner_id"], answer.json()["secret"], name)
        self.heartbeat(runner, repositories=repositories, workspace=workspace, capacity=capacity)
        return runner

    def heartbeat(
        self,
        runner: Runner,
        *,
        repositories: tuple[str, ...] = (REPOSITORY,),
        workspace: bool = False,
        capacity: int = 1,
        sessions: int = 0,
    ) -> None:
        body = {
            "capacity": capacity,
            "repositories": list(repositories),
            "workspace": workspace,
            "sessions": sessions,
        }
        assert self.post("heartbeat", body, auth=runner.auth).status_code == 200

    def poll(self, runner: Runner, wait: float = SHORT_WAIT) -> requests.Response:
        return self.post("poll", {"wait_seconds": wait}, auth=runner.auth)

    def polled_id(self, runner: Runner) -> str | None:
        """Poll once (short wait); the leased dispatch's id, or None on 204."""
        response = self.poll(runner)
        assert response.status_code in (200, 204), response.text
        return response.json()["dispatch"]["dispatch_id"] if response.status_code == 200 else None

    def report(self, runner: Runner, dispatch_id: str, **result: Any) -> requests.Response:
        return self.post("results", {"dispatch_id": dispatch_id, **result}, auth=runner.auth)

    def seed(
        self,
        number: int,
        *dispatches: DispatchRecord,
        session_status: str = "pending",
        session_runner: str | None = None,
    ) -> WorkItemRecord:
        """Save work item ``number`` (its own session in ``session_status``) with
        ``dispatches``, as the router would."""
        item = save_with_own_session(
            self.stores.work_items,
            repository=REPOSITORY,
            number=number,
            dispatches=dispatches,
            now=self.clock.now(),
            session_status=session_status,
            session_runner=session_runner,
        )
        assert item is not None
        return item

    def dispatch(self, number: int, seq: int = 1, **changes: Any) -> DispatchRecord:
        """A pending spawn for work item ``number`` with a comment to react on."""
        comment_id = self.github.add_comment(f"@looprelay go {seq}", number=number)
        return make_dispatch(
            repository=REPOSITORY,
            number=number,
            seq=seq,
            created_at=self.clock.now() + timedelta(milliseconds=seq),
            **{
                "prompt": f"work on {_ref(number)}",
                "comment_id": comment_id,
                "comment_kind": "issue",
                **changes,
            },
        )

    def stored(self, dispatch_id: str) -> DispatchRecord:
        record = self.stores.work_items.get_dispatch(dispatch_id)
        assert record is not None
        return record

    def session(self, number: int) -> SessionRecord:
        item = self.stores.work_items.get_work_item(_ref(number))
        assert item is not None
        return item.sessions[_ref(number)]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e.data for e in self.stores.events.list_events(name=name)]

    def reactions(self, comment_id: int) -> list[str]:
        return [content for login, content in self.github.comments[comment_id].reactions]

    def attach_comments(self, number: int) -> list[str]:
        return [c.body for c in self.github.on(number) if c.author == APP_LOGIN]

    def replies(self, number: int) -> list[str]:
        """Comments our bot posted on ``number`` as a headless turn's reply."""
        return [body for body in self.attach_comments(number) if "kind=reply " in body]


def _ref(number: int) -> str:
    return f"github:{REPOSITORY}#{number}"


def _lease_desk(
    stores: Stores,
    *,
    clock: SteppingClock,
    waker: DispatchWaker | None,
    github: FakeGitHub,
    monotonic: Callable[[], float] = time.monotonic,
    headless_replies: bool = True,
    feed: DispatchFeed | None = None,
    config: RunnersConfig = CONFIG,
    kind: type[LeaseDesk] = LeaseDesk,
    records: RunnerRecords | None = None,
) -> LeaseDesk:
    """The lease desk as ``looprelay.app.services.build_runner_api`` builds it, on ``stores``
    (as ``kind``, which may count what it does)."""
    github.tokens[GITHUB_TOKEN] = APP_LOGIN
    client = GitHubRest(api_url=github.url, auth=TokenAuth(GITHUB_TOKEN), max_attempts=1)
    progress = Progress(
        work_items=stores.work_items,
        store=stores.events,
        github=client,
        clock=clock,
        bot_logins=(APP_LOGIN,),
        headless_replies=headless_replies,
    )
    return kind(
        registry=stores.registry,
        work_items=stores.work_items,
        store=stores.events,
        clock=clock,
        config=config,
        progress=progress,
        waker=waker,
        feed=feed,
        monotonic=monotonic,
        expire_unserved=feed is None,
        records=records,
    )


def serve_desk(
    stores: Stores,
    github: FakeGitHub,
    *,
    headless_replies: bool = True,
    waker: DispatchWaker | None = None,
    feed: DispatchFeed | None = None,
    config: RunnersConfig = CONFIG,
    records: RunnerRecords | None = None,
    kind: type[LeaseDesk] = LeaseDesk,
) -> Iterator[Desk]:
    """Serve the runner API over real HTTP on ``stores``, progress going to ``github``;
    ``feed`` (ringing ``waker``) and ``records`` as the cloud wires them; the lease desk
    as ``kind``."""
    clock = SteppingClock()
    waker = waker or DispatchWaker()
    lease_desk = _lease_desk(
        stores,
        clock=clock,
        waker=waker,
        github=github,
        headless_replies=headless_replies,
        feed=feed,
        config=config,
        records=records,
        kind=kind,
    )
    runner_api = RunnerApi(
        registry=stores.registry,
        store=stores.events,
        clock=clock,
        config=config,
        desk=lease_desk,
        records=records,
        sessions=SessionComments(
            work_items=stores.work_items,
            store=stores.events,
            github=GitHubRest(api_url=github.url, auth=TokenAuth(GITHUB_TOKEN), max_attempts=1),
            clock=clock,
            bot_logins=(APP_LOGIN,),
        ),
    )
    server = AppServer(runner_api=runner_api, max_body_bytes=MAX_BODY_BYTES)
    server.start()
    yield Desk(server.url, stores, clock, waker, github, lease_desk)
    server.stop()


@pytest.fixture
def desk(stores: Stores, fake_github: FakeGitHub) -> Iterator[Desk]:
    yield from serve_desk(stores, fake_github)


@pytest.fixture
def quiet_desk(stores: Stores, fake_github: FakeGitHub) -> Iterator[Desk]:
    """The desk of an operator who turned headless replies off (``routing.headlessReplies``)."""
    yield from serve_desk(stores, fake_github, headless_replies=False)


class _PollOnSettle:
    """The work-item store, but each time a dispatch settles, ``then`` runs at once (before
    whoever settled it goes on) and what it leased is kept: a poll racing a result."""

    def __init__(self, inner: WorkItemStore) -> None:
        self._inner = inner
        self.then: Callable[[], DispatchRecord | None] = lambda: None
        self.leased: list[DispatchRecord | None] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def finish_dispatch(self, dispatch_id: str, **changes: Any) -> bool:
        settled = self._inner.finish_dispatch(dispatch_id, **changes)
        if settled:
            self.leased.append(self.then())
        return settled


@pytest.fixture
def settling(stores: Stores) -> _PollOnSettle:
    return _PollOnSettle(stores.work_items)


@pytest.fixture
def watched_desk(
    stores: Stores, fake_github: FakeGitHub, settling: _PollOnSettle
) -> Iterator[Desk]:
    """The runner API whose results settle dispatches through ``settling``; the test's own
    reads and seeds go to the stores themselves."""
    watched = Stores(stores.registry, cast(WorkItemStore, settling), stores.events)
    for served in serve_desk(watched, fake_github):
        yield Desk(served.url, stores, served.clock, served.waker, served.github)


def _poll_together(desk: Desk, runners: list[Runner]) -> list[tuple[Runner, requests.Response]]:
    """Let every runner poll at the same moment; each runner with its answer."""
    start = threading.Barrier(len(runners))

    def poll(runner: Runner) -> tuple[Runner, requests.Response]:
        start.wait(HTTP_TIMEOUT)
        return runner, desk.poll(runner)

    with ThreadPoolExecutor(len(runners)) as pool:
        return list(pool.map(poll, runners))


def long_polled(lease_desk: LeaseDesk, runner: RunnerRecord, wait: float) -> DispatchRecord | None:
    """What a long poll of ``runner`` for up to ``wait`` s leased, served as production serves
    it (``app.longpoll.long_poll`` on an event loop, looks on a pool thread); None on 204."""
    body = PollBody(wait_seconds=wait)
    response = asyncio.run(long_poll(lease_desk, runner, body, Blocking()))
    if response.status == 204:
        return None
    assert response.status == 200, response.body
    leased = lease_desk.work_items.get_dispatch(
        json.loads(response.body)["dispatch"]["dispatch_id"]
    )
    assert leased is not None
    return leased


def _ringing(number: int) -> DispatchRecord:
    return make_dispatch(repository=REPOSITORY, number=number, created_at=datetime.now(UTC))


def _one(opened: Opened) -> int:
    return 1


async def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HTTP_TIMEOUT
    while not check():
        assert time.monotonic() < deadline, "the wait never ended"
        await asyncio.sleep(0.005)


class TestDispatchWaker:
    def test_a_ring_after_the_generation_was_read_ends_the_wait_at_once(self) -> None:
        waker = DispatchWaker()
        seen = waker.generation()
        waker.notify()
        started = time.monotonic()
        asyncio.run(waker.wait_async(10.0, since=seen))
        assert time.monotonic() - started < 5.0
        assert waker.generation() == seen + 1

    def test_without_a_ring_the_wait_runs_out(self) -> None:
        waker = DispatchWaker()
        waker.notify()  # before the wait began: not this wait's news
        started = time.monotonic()
        asyncio.run(waker.wait_async(0.1, since=waker.generation()))
        assert time.monotonic() - started >= 0.1

    def test_a_ring_reaches_only_the_waits_it_concerns(self) -> None:
        waker = DispatchWaker()
        spawn = make_dispatch(repository=REPOSITORY, number=1, created_at=datetime.now(UTC))

        async def both() -> tuple[bool, bool]:
            seen = waker.generation()
            concerned = asyncio.create_task(
                waker.wait_async(HTTP_TIMEOUT, since=seen, wants=lambda _opened: True)
            )
            other = asyncio.create_task(
                waker.wait_async(0.5, since=seen, wants=lambda _opened: False)
            )
            await asyncio.sleep(0)  # both are waiting now
            threading.Thread(target=waker.notify, args=([spawn],)).start()
            await asyncio.wait_for(concerned, HTTP_TIMEOUT)
            return concerned.done(), other.done()

        assert asyncio.run(both()) == (True, False)

    def test_a_ring_that_says_nothing_of_what_opened_wakes_every_wait(self) -> None:
        waker = DispatchWaker()
        seen = waker.generation()
        waker.notify()
        started = time.monotonic()
        asyncio.run(waker.wait_async(10.0, since=seen, wants=lambda _opened: False))
        assert time.monotonic() - started < 5.0

    def test_a_ring_wakes_as_many_of_a_runners_polls_as_it_opened_work_for(self) -> None:
        waker = DispatchWaker()
        one, two, three = (_ringing(n) for n in (1, 2, 3))

        def share(opened: Opened) -> int:  # one runner's check, shared by its polls
            return len(opened.dispatches or ())

        async def polls() -> list[int]:
            seen = waker.generation()
            waits = [
                asyncio.create_task(waker.wait_async(HTTP_TIMEOUT, since=seen, wants=share))
                for _ in range(3)
            ]
            await asyncio.sleep(0)  # all three are waiting now
            done = []
            for dispatches in ([one], [two, three]):
                threading.Thread(target=waker.notify, args=(dispatches,)).start()
                await _until(lambda: sum(w.done() for w in waits) > sum(done))
                await asyncio.sleep(0.05)  # time for a wrong extra wake to show
                done.append(sum(w.done() for w in waits) - sum(done))
            return done

        assert asyncio.run(polls()) == [1, 2]

    def test_a_ring_that_says_nothing_of_what_opened_wakes_every_poll(self) -> None:
        waker = DispatchWaker()

        async def polls() -> int:
            seen = waker.generation()
            waits = [
                asyncio.create_task(waker.wait_async(HTTP_TIMEOUT, since=seen, wants=lambda _: 0))
                for _ in range(3)
            ]
            await asyncio.sleep(0)
            threading.Thread(target=waker.notify).start()
            await asyncio.wait_for(asyncio.gather(*waits), HTTP_TIMEOUT)
            return len(waits)

        assert asyncio.run(polls()) == 3

    def test_a_ring_judges_only_the_polls_of_the_runners_it_is_addressed_to(self) -> None:
        """200 runners wait: a comment for runner 7's session judges runner 7's check alone,
        and a spawn for a repository judges those that serve it and those with a workspace;
        the other runners' checks are never called."""
        waker = DispatchWaker()
        judged: list[str] = []

        def runner(n: int) -> RunnerRecord:
            served = ["octo/other"] if n % 2 else [REPOSITORY]
            return RunnerRecord(
                runner_id=f"r{n}",
                name=f"r{n}",
                secret_hash="a" * 64,
                registered_at=datetime.now(UTC),
                repositories=served,
                workspace=n == 199,
            )

        def check(runner_id: str) -> Callable[[Opened], int]:
            def wants(opened: Opened) -> int:
                judged.append(runner_id)
                return 1

            return wants

        async def polls() -> tuple[list[str], list[str]]:
            seen = waker.generation()
            runners = [runner(n) for n in range(200)]
            waits = {
                r.runner_id: asyncio.create_task(
                    waker.wait_async(HTTP_TIMEOUT, since=seen, wants=check(r.runner_id), runner=r)
                )
                for r in runners
            }
            await _until(lambda: waker.waiting() == 200)
            comment = _ringing(1).model_copy(update={"kind": "deliver", "runner_id": "r7"})
            threading.Thread(target=waker.notify, args=([comment],)).start()
            await asyncio.wait_for(waits["r7"], HTTP_TIMEOUT)
            first = sorted(judged)
            judged.clear()
            threading.Thread(target=waker.notify, args=([_ringing(2)],)).start()
            await _until(lambda: waker.waiting() == 199 - len(serving))
            return first, sorted(judged)

        serving = {f"r{n}" for n in range(0, 200, 2)} | {"r199"}
        first, second = asyncio.run(polls())
        assert first == ["r7"]
        assert set(second) == serving
        assert len(second) == len(serving)

    def test_the_newest_poll_is_woken_first(self) -> None:
        waker = DispatchWaker()

        async def polls() -> tuple[bool, bool]:
            seen = waker.generation()
            older = asyncio.create_task(waker.wait_async(0.5, since=seen, wants=_one))
            await asyncio.sleep(0)
            newer = asyncio.create_task(waker.wait_async(HTTP_TIMEOUT, since=seen, wants=_one))
            await asyncio.sleep(0)
            threading.Thread(target=waker.notify, args=([_ringing(1)],)).start()
            await asyncio.wait_for(newer, HTTP_TIMEOUT)
            return older.done(), newer.done()

        assert asyncio.run(polls()) == (False, True)

    def test_a_poll_that_leased_something_else_passes_its_wake_on(self) -> None:
        waker = DispatchWaker()
        opened, lapsed = _ringing(1), _ringing(2)

        async def polls() -> tuple[int, int]:
            seen = waker.generation()
            waits = [
                asyncio.create_task(waker.wait_async(HTTP_TIMEOUT, since=seen, wants=_one))
                for _ in range(3)
            ]
            await asyncio.sleep(0)
            threading.Thread(target=waker.notify, args=([opened],)).start()
            await _until(lambda: any(w.done() for w in waits))
            woken_by = next(w for w in waits if w.done()).result()
            assert woken_by is not None
            waker.pass_on(woken_by, taken=opened)  # it took what woke it: nothing to pass
            await asyncio.sleep(0.05)
            after_own = sum(w.done() for w in waits)
            waker.pass_on(woken_by, taken=lapsed)  # it took another: one more poll looks
            await _until(lambda: sum(w.done() for w in waits) > after_own)
            await asyncio.sleep(0.05)
            return after_own, sum(w.done() for w in waits)

        assert asyncio.run(polls()) == (1, 2)


class TestPoll:
    def test_nothing_to_do_is_204_after_the_wait(self, desk: Desk) -> None:
        runner = desk.runner("laptop")
        started = time.monotonic()
        response = desk.poll(runner, wait=SHORT_WAIT)
        assert response.status_code == 204 and response.content == b""
        assert time.monotonic() - started >= SHORT_WAIT

    def test_a_dispatch_saved_while_a_poll_waits_comes_promptly_when_the_waker_rings(
        self, desk: Desk
    ) -> None:
        runner = desk.runner("laptop")
        wait = 20.0
        started = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            polling = pool.submit(desk.poll, runner, wait)
            time.sleep(0.3)  # most likely waiting by now; the waker must not depend on it
            desk.seed(1, desk.dispatch(1))
            desk.waker.notify()
            response = polling.result(wait + HTTP_TIMEOUT)
        elapsed = time.monotonic() - started
        assert response.status_code == 200
        assert response.json()["dispatch"]["dispatch_id"] == "dp-1-1"
        assert elapsed < wait / 2, f"the poll took {elapsed:.1f} s of its {wait} s wait"

    def test_a_dispatch_saved_between_a_look_and_the_wait_is_not_missed(self, desk: Desk) -> None:
        # The router saves and rings right after the poll looked and found nothing, before it
        # starts waiting: the ring must still cut the wait short. The desk's monotonic clock,
        # read once for the deadline and once after the first look, places the save there.
        reads = 0

        def monotonic() -> float:
            nonlocal reads
            reads += 1
            if reads == 2:
                desk.seed(1, desk.dispatch(1))
                desk.waker.notify()
            return time.monotonic()

        lease_desk = _lease_desk(
            desk.stores, clock=desk.clock, waker=desk.waker, github=desk.github, monotonic=monotonic
        )
        runner = desk.stores.registry.get_runner(desk.runner("laptop").runner_id)
        assert runner is not None
        wait = 6.0
        started = time.monotonic()
        leased = long_polled(lease_desk, runner, wait)
        elapsed = time.monotonic() - started
        assert leased is not None and reads >= 2
        assert elapsed < wait / 2, f"the poll slept {elapsed:.1f} s through the ring"

    def test_without_a_waker_the_poll_looks_again_each_interval(self, desk: Desk) -> None:
        # Separate Cloud Functions share no waker: a dispatch saved mid-wait is found by the
        # next look, CLOUD_POLL_INTERVAL_SECONDS later, not at the end of the wait.
        reads = 0

        def monotonic() -> float:
            nonlocal reads
            reads += 1
            if reads == 2:
                desk.seed(1, desk.dispatch(1))
            return time.monotonic()

        lease_desk = _lease_desk(
            desk.stores, clock=desk.clock, waker=None, github=desk.github, monotonic=monotonic
        )
        runner = desk.stores.registry.get_runner(desk.runner("laptop").runner_id)
        assert runner is not None
        wait = 3 * CLOUD_POLL_INTERVAL_SECONDS + 3
        started = time.monotonic()
        leased = long_polled(lease_desk, runner, wait)
        elapsed = time.monotonic() - started
        assert leased is not None and leased.dispatch_id == "dp-1-1"
        assert CLOUD_POLL_INTERVAL_SECONDS <= elapsed < wait - 1.5

    def test_of_two_runners_racing_for_one_dispatch_exactly_one_gets_it(self, desk: Desk) -> None:
        runners = [desk.runner("left", capacity=3), desk.runner("right", capacity=3)]
        for number in (1, 2, 3):
            desk.seed(number, desk.dispatch(number))
            answers = _poll_together(desk, runners)
            statuses = sorted(response.status_code for _, response in answers)
            assert statuses == [200, 204], f"round {number}: {statuses}"
            [winner] = [runner for runner, response in answers if response.status_code == 200]
            leased = desk.stored(f"dp-{number}-1")
            assert (leased.status, leased.lease_holder, leased.attempts) == (
                "leased",
                winner.runner_id,
                1,
            )

    def test_a_revoked_runner_is_told_to_register_again(self, desk: Desk) -> None:
        runner = desk.runner("old-box")
        desk.seed(1, desk.dispatch(1))
        desk.stores.registry.revoke_runner(runner.runner_id, at=desk.clock.now())
        response = desk.poll(runner)
        assert response.status_code == 401
        assert "old-box was revoked; register it again" in response.json()["error"]
        assert desk.stored("dp-1-1").status == "pending"

    def test_a_poll_waiting_when_its_runner_is_revoked_leases_nothing(self, desk: Desk) -> None:
        """As ``up`` runs it (no runner cache): the poll was let in before the revocation,
        and the dispatch that wakes it stays for another runner."""
        runner = desk.runner("stolen-box")
        with ThreadPoolExecutor(1) as pool:
            poll = pool.submit(desk.poll, runner, 20.0)
            wait_until(lambda: desk.waker.waiting() == 1, what="the poll looked and waits")
            assert desk.stores.registry.revoke_runner(runner.runner_id, at=desk.clock.now())
            comment = desk.dispatch(1)
            desk.seed(1, comment)
            desk.waker.notify([comment])  # as the router rings
            answer = poll.result(HTTP_TIMEOUT)
        assert answer.status_code == 401, answer.text
        assert "revoked" in answer.json()["error"]
        assert desk.stored("dp-1-1").status == "pending"

    @pytest.mark.parametrize(
        ("repositories", "workspace", "labels", "offered"),
        [
            pytest.param(("octo/other",), False, {"gpu": "yes"}, False, id="repo-not-served"),
            pytest.param(("octo/other",), True, {"gpu": "yes"}, True, id="workspace-serves-all"),
            pytest.param((REPOSITORY,), False, {"gpu": "yes"}, True, id="repo-checked-out"),
            pytest.param((REPOSITORY,), False, {"gpu": "no"}, False, id="label-value-differs"),
            pytest.param((REPOSITORY,), False, {}, False, id="label-missing"),
        ],
    )
    def test_a_new_session_goes_only_to_a_runner_that_serves_it(
        self,
        desk: Desk,
        repositories: tuple[str, ...],
        workspace: bool,
        labels: dict[str, str],
        offered: bool,
    ) -> None:
        runner = desk.runner(
            "box", repositories=repositories, workspace=workspace, labels=labels | {"os": "linux"}
        )
        desk.seed(1, desk.dispatch(1, labels={"gpu": "yes", "os": "linux"}))
        assert desk.polled_id(runner) == ("dp-1-1" if offered else None)
        assert desk.stored("dp-1-1").status == ("leased" if offered else "pending")


class TestRenew:
    def test_the_holder_renews_and_anyone_else_is_refused(self, desk: Desk) -> None:
        holder, other = desk.runner("holder"), desk.runner("other")
        desk.seed(1, desk.dispatch(1))
        assert desk.polled_id(holder) == "dp-1-1"
        desk.clock.advance(45)
        renewed = desk.post("renew", {"dispatch_id": "dp-1-1"}, auth=holder.auth)
        assert renewed.status_code == 200
        until = desk.clock.now() + timedelta(seconds=CONFIG.lease_seconds)
        assert datetime.fromisoformat(renewed.json()["lease_expires_at"]) == until
        assert desk.stored("dp-1-1").lease_expires_at == until
        refused = desk.post("renew", {"dispatch_id": "dp-1-1"}, auth=other.auth)
        assert refused.status_code == 409
        assert desk.stored("dp-1-1").lease_holder == holder.runner_id


class TestResults:
    def test_a_first_spawn_goes_live_is_recorded_and_announced_once(self, desk: Desk) -> None:
        runner = desk.runner("laptop")
        first = desk.dispatch(1)
        desk.seed(1, first)
        assert desk.polled_id(runner) == "dp-1-1"
        desk.clock.advance(5)
        target = tmux_session_name(_ref(1))
        spawned = desk.report(
            runner,
            "dp-1-1",
            status="spawned",
            session_id=first.session_id,
            tmux_target=target,
            tmux_socket="lr-test",
        )
        assert spawned.status_code == 200 and spawned.json() == {"status": "succeeded"}
        assert desk.stored("dp-1-1").status == "succeeded"
        session = desk.session(1)
        assert (session.status, session.runner_id, session.announced) == (
            "live",
            runner.runner_id,
            True,
        )
        assert session.spawned_at == desk.clock.now()
        [event] = desk.events("session.spawned")
        assert event == {
            "dispatch_id": "dp-1-1",
            "interaction": "work-item",
            "harness": "claude",
            "runner": "tmux",
            "runner_id": runner.runner_id,
            "tmux_target": target,
            "session_id": first.session_id,
        }
        assert desk.reactions(first.comment_id or 0) == ["hooray"]
        [attach] = desk.attach_comments(1)
        assert f"tmux -L lr-test attach -t {target}" in attach
        assert "dp-1-1" in attach  # the marker that keeps the loop from reading it

        # The session died and was resumed: recorded as a respawn, not announced again.
        respawn = desk.dispatch(1, 2, resume=True, runner_id=runner.runner_id)
        desk.seed(1, respawn, session_status="live", session_runner=runner.runner_id)
        assert desk.polled_id(runner) == "dp-1-2"
        again = desk.report(
            runner, "dp-1-2", status="spawned", resumed=True, tmux_target=target, tmux_socket="x"
        )
        assert again.status_code == 200
        assert [e["dispatch_id"] for e in desk.events("session.respawned")] == ["dp-1-2"]
        assert len(desk.events("session.spawned")) == 1
        assert desk.reactions(respawn.comment_id or 0) == ["hooray"]
        assert len(desk.attach_comments(1)) == 1

    def test_a_headless_first_turn_places_its_session_on_the_runner_unannounced(
        self, desk: Desk
    ) -> None:
        # Without the session placed, a later turn could go to another runner and the work
        # item's pull requests never got sessions of their own (no runner to ask).
        runner = desk.runner("laptop")
        first = desk.dispatch(1)
        desk.seed(1, first)
        assert desk.polled_id(runner) == "dp-1-1"
        done = desk.report(runner, "dp-1-1", status="done", session_id=first.session_id)
        assert done.status_code == 200 and done.json() == {"status": "succeeded"}
        session = desk.session(1)
        assert (session.status, session.runner_id, session.announced) == (
            "live",
            runner.runner_id,
            False,
        )
        assert session.spawned_at == desk.clock.now()
        assert desk.attach_comments(1) == []  # nothing to attach to between turns

    def test_a_retryable_failure_is_offered_again_until_the_attempts_run_out(
        self, desk: Desk
    ) -> None:
        runner = desk.runner("laptop")
        dispatch = desk.dispatch(1)
        desk.seed(1, dispatch)
        for attempt in range(1, MAX_DISPATCH_ATTEMPTS + 1):
            assert desk.polled_id(runner) == "dp-1-1", f"attempt {attempt}"
            assert desk.stored("dp-1-1").attempts == attempt
            report = desk.report(
                runner, "dp-1-1", status="failed", reason="tmux-failed", retryable=True
            )
            final = "failed" if attempt == MAX_DISPATCH_ATTEMPTS else "pending"
            assert report.status_code == 200 and report.json() == {"status": final}
            assert desk.stored("dp-1-1").status == final
            assert desk.reactions(dispatch.comment_id or 0) == (
                ["confused"] if final == "failed" else []
            )
        assert desk.polled_id(runner) is None
        assert desk.session(1).status == "lost"
        finals = [e["final"] for e in desk.events("dispatch.failed")]
        assert finals == ["pending"] * (MAX_DISPATCH_ATTEMPTS - 1) + ["failed"]

    def test_a_final_failure_fails_at_once(self, desk: Desk) -> None:
        runner = desk.runner("laptop")
        dispatch = desk.dispatch(1)
        desk.seed(1, dispatch)
        assert desk.polled_id(runner) == "dp-1-1"
        report = desk.report(runner, "dp-1-1", status="failed", reason="harness-missing")
        assert report.json() == {"status": "failed"}
        assert desk.reactions(dispatch.comment_id or 0) == ["confused"]
        # Never announced; a short marked reply says why, naming only the reason.
        [reply] = desk.attach_comments(1)
        assert reply.startswith("😕 claude session did not start: `harness-missing`")
        assert desk.replies(1) == [reply]

    def test_a_result_after_the_lease_passed_to_another_runner_is_refused(self, desk: Desk) -> None:
        slow, fast = desk.runner("slow"), desk.runner("fast")
        desk.seed(1, desk.dispatch(1))
        assert desk.polled_id(slow) == "dp-1-1"
        assert desk.polled_id(fast) is None  # leased and unexpired
        desk.clock.advance(CONFIG.lease_seconds + 1)
        desk.heartbeat(fast)
        assert desk.polled_id(fast) == "dp-1-1"
        assert desk.events("lease.expired") == [
            {"dispatch_id": "dp-1-1", "from": slow.runner_id, "to": fast.runner_id}
        ]
        late = desk.report(slow, "dp-1-1", status="spawned", tmux_target="loop-late")
        assert late.status_code == 409
        assert desk.post("renew", {"dispatch_id": "dp-1-1"}, auth=slow.auth).status_code == 409
        assert desk.events("session.spawned") == []
        assert desk.report(fast, "dp-1-1", status="spawned").status_code == 200
        assert desk.session(1).runner_id == fast.runner_id

    def test_a_delivery_is_cheered_and_a_control_dispatch_is_not(self, desk: Desk) -> None:
        runner = desk.runner("laptop")
        deliver = desk.dispatch(1, 1, kind="deliver", runner_id=runner.runner_id)
        terminate = desk.dispatch(1, 2, kind="terminate", runner_id=runner.runner_id)
        desk.seed(1, deliver, terminate, session_status="live", session_runner=runner.runner_id)
        assert desk.polled_id(runner) == "dp-1-1"
        assert desk.report(runner, "dp-1-1", status="delivered").json() == {"status": "succeeded"}
        assert desk.polled_id(runner) == "dp-1-2"
        assert desk.report(runner, "dp-1-2", status="done").json() == {"status": "succeeded"}
        assert desk.reactions(deliver.comment_id or 0) == ["hooray"]
        assert desk.reactions(terminate.comment_id or 0) == []
        assert desk.attach_comments(1) == []
        assert (desk.session(1).status, desk.session(1).runner_id) == ("live", runner.runner_id)

    def test_a_spawn_reported_after_its_session_was_cleaned_leaves_it_cleaned(
        self, desk: Desk
    ) -> None:
        runner = desk.runner("laptop")
        dispatch = desk.dispatch(1)
        desk.seed(1, dispatch)
        assert desk.polled_id(runner) == "dp-1-1"
        desk.seed(1, session_status="cleaned")  # a cleanup decided meanwhile
        assert desk.report(runner, "dp-1-1", status="spawned").status_code == 200
        assert desk.session(1).status == "cleaned"
        assert desk.reactions(dispatch.comment_id or 0) == ["hooray"]
        assert desk.attach_comments(1) == []

    def test_github_trouble_does_not_fail_the_result(self, desk: Desk) -> None:
        runner = desk.runner("laptop")
        desk.seed(1, desk.dispatch(1))
        assert desk.polled_id(runner) == "dp-1-1"
        desk.github.script(match="reactions", status=502, body={"message": "Bad Gateway"})
        report = desk.report(runner, "dp-1-1", status="spawned", tmux_target="loop-x")
        assert report.status_code == 200 and report.json() == {"status": "succeeded"}
        assert desk.session(1).status == "live"
        [failure] = desk.events("github.failed")
        assert failure["dispatch_id"] == "dp-1-1" and "502" in failure["error"]

    def test_a_result_for_an_unknown_dispatch_is_404(self, desk: Desk) -> None:
        runner = desk.runner("laptop")
        assert desk.report(runner, "dp-nope", status="done").status_code == 404


NOT_LOGGED_IN = "Not logged in · Please run /login"


class TestHeadlessReplies:
    """Issue 12 item 6: what a headless turn says reaches the work item (or its PR) once."""

    def _turn(self, desk: Desk, number: int = 1, **changes: Any) -> tuple[Runner, DispatchRecord]:
        """A runner (room for two sessions) that leased a headless (``process``) spawn of work
        item ``number``."""
        runner = desk.runner("laptop", workspace=True, capacity=2)
        dispatch = desk.dispatch(number, **{"runner_kind": "process", **changes})
        desk.seed(number, dispatch)
        assert desk.polled_id(runner) == dispatch.dispatch_id
        return runner, dispatch

    def test_an_answer_is_posted_once_on_the_issue_with_the_marker(self, desk: Desk) -> None:
        runner, dispatch = self._turn(desk)
        answer = "Fixed: `parse()` now skips blank lines.\n\nThe-loop stop"
        report = desk.report(runner, "dp-1-1", status="done", reply=f"\n{answer}\n")
        assert report.status_code == 200 and report.json() == {"status": "succeeded"}
        marker = f"<!-- looprelay:v1 kind=reply id={dispatch.dispatch_id} -->"
        assert desk.replies(1) == [f"{answer}\n\n{marker}"]
        assert desk.reactions(dispatch.comment_id or 0) == ["hooray"]
        again = desk.report(runner, "dp-1-1", status="done", reply=answer)  # a retried report
        assert again.status_code == 409
        assert len(desk.replies(1)) == 1

    def test_a_post_whose_answer_was_lost_is_found_not_posted_again(self, desk: Desk) -> None:
        runner, _ = self._turn(desk)
        desk.github.script(match="POST .*/issues/1/comments", status=502, after=True)
        report = desk.report(runner, "dp-1-1", status="done", reply="All green.")
        assert report.json() == {"status": "succeeded"}
        assert [body.split("\n")[0] for body in desk.replies(1)] == ["All green."]
        assert desk.events("github.failed") == []

    def test_a_pr_sessions_answer_goes_on_the_pull_request(self, desk: Desk) -> None:
        pr = _ref(7)
        runner, _ = self._turn(desk, endpoint=pr, session_name=tmux_session_name(pr))
        assert desk.report(runner, "dp-1-1", status="done", reply="Rebased.").status_code == 200
        assert [body.split("\n")[0] for body in desk.replies(7)] == ["Rebased."]
        assert desk.replies(1) == []

    def test_the_longest_reply_is_taken_and_posted_within_githubs_limit(self, desk: Desk) -> None:
        runner, _ = self._turn(desk)
        # Each emoji travels as two \\uXXXX escapes: the largest body a runner can send.
        longest = "🙂" * MAX_REPLY_CHARS
        assert desk.report(runner, "dp-1-1", status="done", reply=longest).status_code == 200
        [body] = desk.replies(1)
        assert body.startswith(longest) and len(body) <= GITHUB_MAX_COMMENT_CHARS

    def test_a_reply_over_the_limit_is_refused_by_name(self, desk: Desk) -> None:
        runner, _ = self._turn(desk)
        report = desk.report(runner, "dp-1-1", status="done", reply="x" * (MAX_REPLY_CHARS + 1))
        assert report.status_code == 400 and "reply" in report.json()["error"]
        assert desk.stored("dp-1-1").status == "leased"

    def test_a_failed_turn_leaves_a_short_note_its_message_in_the_log_and_the_dispatch(
        self, desk: Desk
    ) -> None:
        runner, dispatch = self._turn(desk)
        detail = f"claude: {NOT_LOGGED_IN} (exit 1)"
        note = f"😕 claude turn failed: `{NOT_LOGGED_IN}`"
        report = desk.report(
            runner,
            "dp-1-1",
            status="failed",
            reason="harness-failed",
            detail=detail + "; " + "x" * 1_900,
            reply=note,
        )
        assert report.json() == {"status": "failed"}
        [body] = desk.replies(1)
        assert body.startswith(note + "\n\n<!-- looprelay:v1 kind=reply id=dp-1-1 -->")
        assert desk.reactions(dispatch.comment_id or 0) == ["confused"]
        [event] = desk.events("dispatch.failed")
        assert (event["reason"], event["final"]) == ("harness-failed", "failed")
        assert event["detail"].startswith(detail) and len(event["detail"]) == 500
        stored = desk.stored("dp-1-1")
        assert (stored.result, stored.detail) == ("harness-failed", event["detail"])

    def test_a_failure_without_a_note_is_named_by_its_reason_and_a_long_note_is_cut(
        self, desk: Desk
    ) -> None:
        runner, _ = self._turn(desk)
        desk.report(runner, "dp-1-1", status="failed", reason="harness-timeout", detail="/home/x")
        second = desk.dispatch(2, runner_kind="process")
        desk.seed(2, second)
        assert desk.polled_id(runner) == "dp-2-1"
        desk.report(runner, "dp-2-1", status="failed", reason="harness-failed", reply="😕" * 900)
        [timeout] = desk.replies(1)
        assert timeout.startswith("😕 claude turn failed: `harness-timeout`\n\n<!--")
        [long] = desk.replies(2)
        note = long.split("\n\n<!--")[0]
        assert len(note) == MAX_FAILURE_NOTE_CHARS and "(cut: " in note

    def test_a_failure_offered_again_posts_nothing_yet(self, desk: Desk) -> None:
        runner, _ = self._turn(desk)
        report = desk.report(
            runner, "dp-1-1", status="failed", reason="draining", retryable=True, reply="later"
        )
        assert report.json() == {"status": "pending"}
        assert desk.replies(1) == []

    def test_a_tmux_dispatch_never_gets_a_reply_posted(self, desk: Desk) -> None:
        runner = desk.runner("laptop")
        desk.seed(1, desk.dispatch(1))
        assert desk.polled_id(runner) == "dp-1-1"
        assert desk.report(runner, "dp-1-1", status="spawned", reply="hi").status_code == 200
        assert desk.replies(1) == []

    def test_github_trouble_with_the_reply_does_not_fail_the_result(self, desk: Desk) -> None:
        runner, _ = self._turn(desk)
        desk.github.script(3, match="POST .*/issues/1/comments", status=502)
        report = desk.report(runner, "dp-1-1", status="done", reply="Fixed.")
        assert report.status_code == 200 and report.json() == {"status": "succeeded"}
        [failure] = desk.events("github.failed")
        assert failure["dispatch_id"] == "dp-1-1" and "502" in failure["error"]

    def test_a_post_answered_in_the_wrong_shape_is_found_not_posted_again(self, desk: Desk) -> None:
        # Issue 24: an answer of the wrong shape failed the whole report with a 500.
        runner, _ = self._turn(desk)
        desk.github.script(
            match="POST .*/issues/1/comments", status=201, body=["not", "a comment"], after=True
        )
        report = desk.report(runner, "dp-1-1", status="done", reply="All green.")
        assert report.status_code == 200 and report.json() == {"status": "succeeded"}
        assert [body.split("\n")[0] for body in desk.replies(1)] == ["All green."]
        assert desk.events("github.failed") == []

    def test_a_listing_in_the_wrong_shape_is_a_logged_failure_and_the_report_succeeds(
        self, desk: Desk
    ) -> None:
        runner, dispatch = self._turn(desk)
        desk.github.script(3, match="GET .*/issues/1/comments", status=200, body={"id": 1})
        report = desk.report(runner, "dp-1-1", status="done", reply="Fixed.")
        assert report.status_code == 200 and report.json() == {"status": "succeeded"}
        [failure] = desk.events("github.failed")
        assert failure["dispatch_id"] == "dp-1-1"
        assert "not a list of comments" in failure["error"]
        assert desk.reactions(dispatch.comment_id or 0) == ["hooray"]  # the rest went on

    def test_with_replies_switched_off_nothing_is_posted(self, quiet_desk: Desk) -> None:
        runner, dispatch = self._turn(quiet_desk)
        quiet_desk.report(runner, "dp-1-1", status="done", reply="Fixed.")
        second = quiet_desk.dispatch(2, runner_kind="process")
        quiet_desk.seed(2, second)
        assert quiet_desk.polled_id(runner) == "dp-2-1"
        quiet_desk.report(runner, "dp-2-1", status="failed", reason="harness-failed", reply="😕")
        assert quiet_desk.replies(1) == quiet_desk.replies(2) == []
        assert quiet_desk.reactions(dispatch.comment_id or 0) == ["hooray"]
        assert quiet_desk.reactions(second.comment_id or 0) == ["confused"]


class TestOrderAndAffinity:
    def test_a_later_dispatch_of_a_work_item_waits_for_the_earlier_one(self, desk: Desk) -> None:
        first, second = desk.runner("first"), desk.runner("second")
        desk.seed(1, desk.dispatch(1, 1), desk.dispatch(1, 2, kind="deliver"))
        assert desk.polled_id(first) == "dp-1-1"
        assert desk.polled_id(second) is None
        assert desk.stored("dp-1-2").status == "pending"
        assert desk.report(first, "dp-1-1", status="spawned").status_code == 200
        # Now it may go, to the runner its session lives on (see the next test).
        assert desk.polled_id(first) == "dp-1-2"

    def test_a_session_stays_with_its_runner_until_that_runner_is_lost(self, desk: Desk) -> None:
        holder, other = desk.runner("holder"), desk.runner("other")
        desk.seed(
            1,
            desk.dispatch(1, 1, kind="deliver", runner_id=holder.runner_id),
            session_status="live",
            session_runner=holder.runner_id,
        )
        assert desk.polled_id(other) is None
        desk.clock.advance(CONFIG.lost_after_seconds + 1)  # the holder fell silent
        desk.heartbeat(other)
        assert desk.polled_id(other) == "dp-1-1"
        assert desk.events("runner.lost") == [
            {"dispatch_id": "dp-1-1", "runner_id": holder.runner_id, "taken_by": other.runner_id}
        ]

    def test_the_holder_itself_gets_its_sessions_dispatch(self, desk: Desk) -> None:
        holder, other = desk.runner("holder"), desk.runner("other")
        desk.seed(
            1,
            desk.dispatch(1, 1, kind="deliver", runner_id=holder.runner_id),
            session_status="live",
            session_runner=holder.runner_id,
        )
        assert desk.polled_id(other) is None
        assert desk.polled_id(holder) == "dp-1-1"
        assert desk.events("runner.lost") == []

    def test_a_delivery_routed_before_the_spawn_was_reported_stays_with_the_spawner(
        self, desk: Desk
    ) -> None:
        spawner, other = desk.runner("spawner"), desk.runner("other")
        # Routed while the session was pending: the deliver names no runner yet.
        desk.seed(1, desk.dispatch(1, 1), desk.dispatch(1, 2, kind="deliver"))
        assert desk.polled_id(spawner) == "dp-1-1"
        assert desk.report(spawner, "dp-1-1", status="spawned").status_code == 200
        assert desk.session(1).runner_id == spawner.runner_id
        assert desk.polled_id(other) is None
        assert desk.polled_id(spawner) == "dp-1-2"

    def test_a_poll_the_moment_the_spawn_settles_already_finds_the_session_placed(
        self, watched_desk: Desk, settling: _PollOnSettle
    ) -> None:
        desk = watched_desk
        spawner, other = desk.runner("spawner"), desk.runner("other")
        # Routed while the session was pending: once the spawn settles, the deliver heads the
        # session's line, and a poll of another runner may come at that very moment.
        desk.seed(1, desk.dispatch(1, 1), desk.dispatch(1, 2, kind="deliver"))
        assert desk.polled_id(spawner) == "dp-1-1"
        other_desk = _lease_desk(desk.stores, clock=desk.clock, waker=None, github=desk.github)
        other_record = desk.stores.registry.get_runner(other.runner_id)
        assert other_record is not None
        settling.then = lambda: other_desk.try_lease(other_record)
        assert desk.report(spawner, "dp-1-1", status="spawned").status_code == 200
        assert settling.leased == [None]  # not a second harness on the other runner
        assert desk.polled_id(spawner) == "dp-1-2"


class TestCapacity:
    """A runner's capacity is counted from the sessions the server gave it, at lease time."""

    def test_ten_items_started_together_on_a_runner_of_capacity_two_give_it_two_sessions(
        self, desk: Desk
    ) -> None:
        runner = desk.runner("laptop", capacity=2)
        for number in range(1, 11):
            desk.seed(number, desk.dispatch(number))
        start = threading.Barrier(10)

        def poll(_: int) -> int:
            start.wait(HTTP_TIMEOUT)
            return desk.poll(runner).status_code

        with ThreadPoolExecutor(10) as pool:
            statuses = sorted(pool.map(poll, range(10)))
        assert statuses == [200] * 2 + [204] * 8
        leased = desk.stores.work_items.list_dispatches(statuses=("leased",))
        assert len(leased) == 2
        for dispatch in leased:  # spawned, both stay, and still nothing more fits
            assert desk.report(runner, dispatch.dispatch_id, status="spawned").status_code == 200
        assert desk.polled_id(runner) is None

    def test_a_stopped_session_frees_its_slot_for_the_next_item(self, desk: Desk) -> None:
        runner = desk.runner("laptop", capacity=1)
        desk.seed(21, desk.dispatch(21))
        assert desk.polled_id(runner) == "dp-21-1"
        assert desk.report(runner, "dp-21-1", status="spawned").status_code == 200
        desk.heartbeat(runner, sessions=1)
        desk.seed(22, desk.dispatch(22))
        assert desk.polled_id(runner) is None  # #22 waits: #21 holds the only slot
        stop = desk.dispatch(21, 2, kind="terminate", runner_id=runner.runner_id)
        desk.seed(21, stop, session_status="terminated", session_runner=runner.runner_id)
        assert desk.polled_id(runner) == "dp-21-2"
        assert desk.report(runner, "dp-21-2", status="done").status_code == 200
        # Its last heartbeat still counts #21; the server knows better, without a cleanup.
        assert desk.polled_id(runner) == "dp-22-1"


@dataclass(frozen=True)
class Polled:
    leased: DispatchRecord | None
    looks: int
    seconds: float


class _LookingDesk(LeaseDesk):
    """The lease desk, counting its looks at the store; ``meanwhile`` runs right after the
    first one leased nothing, before the poll waits."""

    looks = 0
    meanwhile: Callable[[], None] = staticmethod(lambda: None)

    def try_lease(self, runner: RunnerRecord) -> DispatchRecord | None:
        self.looks += 1
        leased = super().try_lease(runner)
        if self.looks == 1 and leased is None:
            self.meanwhile()
        return leased


def _poll_with(desk: Desk, runner: Runner, wait: float, meanwhile: Callable[[], None]) -> Polled:
    """Poll as ``runner`` for up to ``wait`` s on a desk of its own (sharing ``desk``'s stores
    and waker), running ``meanwhile`` after the first look and before the wait: what it
    leased, how many looks at the store it made, how long it took."""
    lease_desk = _lease_desk(
        desk.stores, clock=desk.clock, waker=desk.waker, github=desk.github, kind=_LookingDesk
    )
    assert isinstance(lease_desk, _LookingDesk)
    lease_desk.meanwhile = meanwhile
    record = desk.stores.registry.get_runner(runner.runner_id)
    assert record is not None
    started = time.monotonic()
    leased = long_polled(lease_desk, record, wait)
    return Polled(leased, lease_desk.looks, time.monotonic() - started)


class TestWakes:
    """A ring wakes only the polls that might take what it opened, so a thousand idle polls
    cost a delivery nothing; a poll that can take it is never left sleeping."""

    @pytest.mark.parametrize("holder_lost", [False, True], ids=["holder-live", "holder-lost"])
    def test_a_delivery_to_a_session_on_another_runner_wakes_a_poll_only_if_that_one_is_lost(
        self, desk: Desk, holder_lost: bool
    ) -> None:
        holder = desk.runner("holder")
        idle = desk.runner("idle")
        # Work nobody here can take: the idle runner's first look reads who is live.
        desk.seed(9, desk.dispatch(9, labels={"gpu": "yes"}))
        if holder_lost:
            desk.clock.advance(CONFIG.lost_after_seconds + 1)

        def deliver() -> None:
            comment = desk.dispatch(1, kind="deliver", runner_id=holder.runner_id)
            desk.seed(1, comment, session_status="live", session_runner=holder.runner_id)
            desk.waker.notify([comment])  # as the router rings

        wait = 3.0
        polled = _poll_with(desk, idle, wait, deliver)
        if holder_lost:  # the session moves: the idle runner takes it at once
            assert polled.leased is not None and polled.leased.dispatch_id == "dp-1-1"
            assert polled.seconds < wait / 2, f"the poll slept {polled.seconds:.1f} s"
        else:  # not its work: it kept waiting, and looked only once more, at the end
            assert polled.leased is None
            assert polled.looks == 2
            assert desk.stored("dp-1-1").status == "pending"

    def test_a_stopped_session_wakes_its_runners_poll_for_the_item_waiting_on_a_slot(
        self, desk: Desk
    ) -> None:
        runner = desk.runner("laptop", capacity=1)
        desk.seed(21, desk.dispatch(21))
        assert desk.polled_id(runner) == "dp-21-1"
        assert desk.report(runner, "dp-21-1", status="spawned").status_code == 200
        stop = desk.dispatch(21, 2, kind="terminate", runner_id=runner.runner_id)
        desk.seed(21, stop, session_status="terminated", session_runner=runner.runner_id)
        assert desk.polled_id(runner) == "dp-21-2"
        desk.seed(22, desk.dispatch(22))  # waits for #21's slot

        def stopped() -> None:
            assert desk.report(runner, "dp-21-2", status="done").status_code == 200

        wait = 6.0
        polled = _poll_with(desk, runner, wait, stopped)
        assert polled.leased is not None and polled.leased.dispatch_id == "dp-22-1"
        assert polled.seconds < wait / 2, f"the poll slept {polled.seconds:.1f} s through it"

    def test_a_result_wakes_the_poll_for_the_next_dispatch_of_its_session(self, desk: Desk) -> None:
        runner = desk.runner("laptop")
        first, second = (
            desk.dispatch(1, seq, kind="deliver", runner_id=runner.runner_id) for seq in (1, 2)
        )
        desk.seed(1, first, second, session_status="live", session_runner=runner.runner_id)
        assert desk.polled_id(runner) == "dp-1-1"  # dp-1-2 waits behind it

        def done() -> None:
            assert desk.report(runner, "dp-1-1", status="done").status_code == 200

        wait = 6.0
        polled = _poll_with(desk, runner, wait, done)
        assert polled.leased is not None and polled.leased.dispatch_id == "dp-1-2"
        assert polled.seconds < wait / 2, f"the poll slept {polled.seconds:.1f} s through it"


class _CountingDesk(LeaseDesk):
    """The lease desk, counting its looks at the store from any thread."""

    looks = 0
    _counted = threading.Lock()

    def try_lease(self, runner: RunnerRecord) -> DispatchRecord | None:
        with self._counted:
            self.looks += 1
        return super().try_lease(runner)


@pytest.fixture
def counting_desk(stores: Stores, fake_github: FakeGitHub) -> Iterator[Desk]:
    yield from serve_desk(stores, fake_github, kind=_CountingDesk)


def test_a_comment_wakes_one_of_its_runners_waiting_polls_and_the_others_wait_on(
    counting_desk: Desk,
) -> None:
    desk, counting = counting_desk, cast(_CountingDesk, counting_desk.lease_desk)
    runner = desk.runner("laptop", capacity=3)
    wait = 2.0
    with ThreadPoolExecutor(3) as pool:
        polls = [pool.submit(desk.poll, runner, wait) for _ in range(3)]
        wait_until(lambda: desk.waker.waiting() == 3, what="three polls looked and wait")
        comment = desk.dispatch(1, kind="deliver", runner_id=runner.runner_id)
        desk.seed(1, comment, session_status="live", session_runner=runner.runner_id)
        desk.waker.notify([comment])  # as the router rings
        answers = [poll.result(HTTP_TIMEOUT) for poll in polls]
    assert sorted(a.status_code for a in answers) == [200, 204, 204]
    # Three first looks, one woken look that leased, one last look of each other poll.
    assert counting.looks == 3 + 1 + 2


class TestPerEndpointLines:
    def test_a_pull_request_session_nobody_can_take_does_not_hold_up_the_work_items_own(
        self, desk: Desk
    ) -> None:
        holder = desk.runner("holder", capacity=1)
        pr = "github:octo/repo#2"
        desk.seed(
            1,
            desk.dispatch(
                1,
                1,
                endpoint=pr,
                session_name="loop-pr-2",
                dispatch_id="dp-pr",
                labels={"gpu": "yes"},  # no runner has one
            ),
            desk.dispatch(1, 2, kind="deliver", runner_id=holder.runner_id),
            session_status="live",
            session_runner=holder.runner_id,
        )
        # The spawn of the PR's session (seq 1) fits on no runner; the delivery into the work
        # item's own live session (seq 2) goes ahead of it.
        assert desk.polled_id(holder) == "dp-1-2"
        assert desk.stored("dp-pr").status == "pending"
