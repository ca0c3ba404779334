"""The redelivery sweeper against the loopback fake GitHub over real HTTP, with a SQLite ledger:
the App's failed deliveries the ledger lacks are asked for again, nothing else is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from looprelay.adapters.github.auth import AppAuth, TokenAuth
from looprelay.adapters.github.rest import GitHubRest
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.app.cloud import build_sweeper
from looprelay.app.messages import Request
from looprelay.app.sweep import SweepHandler
from looprelay.config.model import Config, GitHubConfig, SqliteConfig, StoreConfig, SweeperConfig
from looprelay.core.model import DeliveryRecord
from looprelay.core.sweep import LISTING_OVERLAP
from looprelay.errors import ConfigError, Permanent
from looprelay.service.sweeper import REDELIVERED_EVENT, SWEPT_EVENT, Sweeper, sweep
from tests.fake_github import APP_ID, AppKey, FakeDelivery, FakeGitHub

SWEEP_COMMAND = (sys.executable, "-m", "looprelay.cli", "deliveries", "sweep")
NOW = datetime.now(UTC).replace(microsecond=0)  # the fake renders whole seconds, as GitHub does


class FixedClock:
    """The ``Clock`` port, stopped at ``NOW``."""

    def now(self) -> datetime:
        return NOW


@pytest.fixture
def waits() -> list[float]:
    """Every retry wait the client asked for (it never really sleeps)."""
    return []


@pytest.fixture
def github(fake_github: FakeGitHub, github_app_key: AppKey, waits: list[float]) -> GitHubRest:
    """A client with the App's key, which the fake trusts."""
    return _app_client(fake_github, github_app_key, waits)


def _app_client(
    fake: FakeGitHub,
    key: AppKey,
    waits: list[float],
    *,
    clock: Callable[[], float] = time.time,
) -> GitHubRest:
    fake.app_public_key = key.public_key
    auth = AppAuth(
        app_id=APP_ID, private_key_pem=key.private_pem, api_url=fake.url, session=requests.Session()
    )
    return GitHubRest(
        api_url=fake.url, auth=auth, sleep=waits.append, timeout_seconds=5, clock=clock
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    """An empty SQLite ledger."""
    sqlite = SqliteStore(tmp_path / "store.db")
    yield sqlite
    sqlite.close()


def _attempt(
    id: int, guid: str, *, status: int = 503, ago: timedelta = timedelta(minutes=10)
) -> FakeDelivery:
    return FakeDelivery(id=id, guid=guid, delivered_at=NOW - ago, status_code=status)


def _hold(store: SqliteStore, guid: str) -> None:
    store.begin_delivery(DeliveryRecord(delivery_id=guid, event="issue_comment", received_at=NOW))


class TestSweep:
    def test_a_failed_delivery_the_ledger_lacks_is_redelivered_and_logged(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [_attempt(11, "lost"), _attempt(12, "fine", status=202)]

        report = sweep(github, store, FixedClock())

        assert fake_github.redelivered == [11]
        assert report.counts() == {
            "listed": 2,
            "failed": 1,
            "in_ledger": 0,
            "redelivered": 1,
            "errors": 0,
            "left": 0,
        }
        [event] = store.list_events(name=REDELIVERED_EVENT)
        assert (event.delivery_id, event.data["attempt"], event.at) == ("lost", 11, NOW)

    def test_a_failed_delivery_the_ledger_holds_is_not(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        """GitHub gave up waiting (10 s) after ingress had queued it: the worker has it."""
        fake_github.app_deliveries = [_attempt(11, "slow-ack", status=0)]
        _hold(store, "slow-ack")

        report = sweep(github, store, FixedClock())

        assert fake_github.redelivered == []
        assert (report.failed, report.in_ledger, report.redelivered) == (1, 1, 0)

    def test_one_older_than_three_days_is_not(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [
            _attempt(11, "recent", ago=timedelta(days=2, hours=23)),
            _attempt(10, "too-old", ago=timedelta(days=3, minutes=1)),
        ]

        report = sweep(github, store, FixedClock())

        assert fake_github.redelivered == [11]
        assert report.listed == 1  # the listing stops at the first attempt past the window

    def test_a_guid_that_later_succeeded_is_not(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [
            _attempt(11, "healed", status=502, ago=timedelta(hours=2)),
            _attempt(12, "healed", status=202, ago=timedelta(hours=1)),
        ]

        report = sweep(github, store, FixedClock())

        assert fake_github.redelivered == []
        assert (report.listed, report.failed) == (2, 0)

    def test_the_newest_failed_attempt_of_a_guid_is_redelivered(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [
            _attempt(11, "flaky", status=502, ago=timedelta(hours=2)),
            _attempt(15, "flaky", status=503, ago=timedelta(hours=1)),
        ]

        sweep(github, store, FixedClock())

        assert fake_github.redelivered == [15]

    def test_every_page_is_read_following_the_cursor(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        # 250 attempts, newest first: ids 250..1; only the oldest, on page 3, failed.
        fake_github.app_deliveries = [
            _attempt(n, f"g{n}", status=503 if n == 1 else 202, ago=timedelta(minutes=300 - n))
            for n in range(1, 251)
        ]

        report = sweep(github, store, FixedClock())

        assert fake_github.redelivered == [1]
        assert report.listed == 250
        pages = fake_github.calls("GET", "^/app/hook/deliveries$")
        assert [p.query.get("cursor") for p in pages] == [None, ["v1_100"], ["v1_200"]]
        assert all(p.query["per_page"] == ["100"] for p in pages)

    def test_the_listing_reads_at_most_max_pages(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [
            _attempt(n, f"g{n}", ago=timedelta(minutes=300 - n)) for n in range(1, 251)
        ]

        settings = SweeperConfig(max_pages_per_run=2, redeliveries_per_run=0)

        report = sweep(github, store, FixedClock(), settings=settings)

        assert (report.listed, report.failed, report.complete) == (200, 200, False)
        assert len(fake_github.calls("GET", "^/app/hook/deliveries$")) == 2

    def test_each_run_asks_for_at_most_its_budget_oldest_first(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [
            _attempt(n, f"g{n}", ago=timedelta(minutes=60 - n)) for n in range(1, 8)
        ]

        report = sweep(github, store, FixedClock(), settings=SweeperConfig(redeliveries_per_run=3))

        assert fake_github.redelivered == [1, 2, 3]
        assert (report.failed, report.redelivered, report.left) == (7, 3, 4)

    def test_a_dry_run_picks_but_asks_for_nothing(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [_attempt(11, "lost")]

        report = sweep(github, store, FixedClock(), dry_run=True)

        assert fake_github.redelivered == []
        assert [(d.id, outcome) for d, outcome in report.picked] == [(11, "not asked")]
        assert store.list_events(name=REDELIVERED_EVENT) == []

    def test_a_refused_redelivery_is_counted_and_the_next_one_asked_for(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [
            _attempt(12, "gone", ago=timedelta(minutes=1)),
            _attempt(11, "lost", ago=timedelta(minutes=2)),
        ]
        fake_github.script(match="POST /app/hook/deliveries/11/", status=404, body={})

        report = sweep(github, store, FixedClock())

        assert fake_github.redelivered == [12]
        assert [outcome for _, outcome in report.picked] == ["refused", "redelivered"]
        assert (report.redelivered, report.errors) == (1, 1)

    def test_a_transient_failure_leaves_the_rest_for_the_next_run(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [
            _attempt(n, f"g{n}", ago=timedelta(minutes=60 - n)) for n in range(1, 4)
        ]
        fake_github.script(4, match="POST /app/hook/deliveries/2/", status=502)

        report = sweep(github, store, FixedClock())

        assert fake_github.redelivered == [1]
        assert [outcome for _, outcome in report.picked] == ["redelivered", "failed", "not asked"]
        assert (report.redelivered, report.errors) == (1, 1)

    def test_the_calls_carry_the_apps_jwt(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [_attempt(11, "lost")]

        sweep(github, store, FixedClock())

        for call in fake_github.calls("GET", "^/app/") + fake_github.calls("POST", "^/app/"):
            assert call.headers["authorization"].startswith("Bearer ey")  # a JWT, not ghs_
        assert fake_github.issued == []  # no installation token was needed

    def test_a_token_cannot_list_the_apps_deliveries(
        self, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        client = GitHubRest(api_url=fake_github.url, auth=TokenAuth("ghp_operator0123"))

        with pytest.raises(Permanent, match=r"github\.appId and github\.privateKeyEnv"):
            sweep(client, store, FixedClock())
        assert fake_github.requests == []


class TestConsecutiveSweeps:
    def test_a_sweep_lists_back_only_to_where_the_last_one_left_off(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [
            _attempt(n, f"g{n}", status=202, ago=timedelta(minutes=300 - n)) for n in range(1, 251)
        ]
        sweep(github, store, FixedClock())
        first = len(fake_github.calls("GET", "^/app/hook/deliveries$"))

        report = sweep(github, store, FixedClock())

        assert first == 3
        assert len(fake_github.calls("GET", "^/app/hook/deliveries$")) == first + 1
        [swept, _] = store.list_events(name=SWEPT_EVENT, newest=True, limit=2)[::-1]
        assert swept.data["resume"] == report.resume.isoformat()
        assert report.since == NOW - timedelta(minutes=50) - LISTING_OVERLAP

    def test_a_dry_run_leaves_the_resume_point_alone(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [_attempt(11, "lost")]

        sweep(github, store, FixedClock(), dry_run=True)

        assert store.list_events(name=SWEPT_EVENT) == []

    def test_a_spent_rate_limit_stops_the_run_and_the_next_one_finishes(
        self,
        store: SqliteStore,
        fake_github: FakeGitHub,
        github_app_key: AppKey,
        waits: list[float],
    ) -> None:
        epoch = [time.time()]
        github = _app_client(fake_github, github_app_key, waits, clock=lambda: epoch[0])
        # 250 attempts, one failure on each page; the quota lasts for two pages.
        fake_github.app_deliveries = [
            _attempt(
                n, f"g{n}", status=503 if n % 100 == 50 else 202, ago=timedelta(minutes=300 - n)
            )
            for n in range(1, 251)
        ]
        fake_github.app_quota = 2

        cut = sweep(github, store, FixedClock())

        assert (cut.listed, cut.complete, fake_github.redelivered) == (200, False, [])
        assert [outcome for _, outcome in cut.picked] == ["failed", "not asked"]
        assert waits == []  # the run did not sit out GitHub's hour
        assert cut.resume == cut.since
        fake_github.app_quota = 100
        epoch[0] += 3601  # the hour turned

        done = sweep(github, store, FixedClock())

        assert (done.complete, done.left) == (True, 0)
        assert fake_github.redelivered == [50, 150, 250]

    def test_a_retry_after_stops_the_run_at_once(
        self,
        github: GitHubRest,
        store: SqliteStore,
        fake_github: FakeGitHub,
        waits: list[float],
    ) -> None:
        fake_github.app_deliveries = [
            _attempt(n, f"g{n}", ago=timedelta(minutes=60 - n)) for n in range(1, 4)
        ]
        fake_github.script(
            match="POST /app/hook/deliveries/2/", status=403, headers={"Retry-After": "60"}
        )

        report = sweep(github, store, FixedClock())

        assert fake_github.redelivered == [1]
        assert (report.left, waits) == (2, [])
        assert len(fake_github.calls("POST", "^/app/hook/deliveries/2/")) == 1


SIMULATED_START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
RATE = 100  # deliveries a second
SIMULATED = timedelta(minutes=15)


class MovingClock:
    """The ``Clock`` port at a time the test moves."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


class TestAtScale:
    def test_100_deliveries_a_second_for_15_minutes_nothing_missed(
        self,
        store: SqliteStore,
        fake_github: FakeGitHub,
        github_app_key: AppKey,
        waits: list[float],
    ) -> None:
        """90,000 attempts, 1% failed, 1 in 10 of those already in the ledger. Sweeps every 5
        minutes with a budget under the failures of 5 minutes, and GitHub's quota running
        out in one of them: every failure the ledger lacks is asked for exactly once."""
        total = int(SIMULATED.total_seconds()) * RATE
        log = [
            FakeDelivery(
                id=n,
                guid=f"g{n}",
                delivered_at=SIMULATED_START + timedelta(seconds=n // RATE),
                status_code=503 if n % 100 == 37 else 202,
            )
            for n in range(total)
        ]
        lost = {d.guid for d in log if d.status_code == 503}
        held = set(sorted(lost)[::10])
        for guid in held:
            store.begin_delivery(
                DeliveryRecord(delivery_id=guid, event="issue_comment", received_at=NOW)
            )
        clock = MovingClock(SIMULATED_START)
        fake_github.attempt_clock = clock.now
        hours = [0]  # GitHub's quota refills between runs: the client's clock moves an hour
        github = _app_client(
            fake_github, github_app_key, waits, clock=lambda: time.time() + 3600 * hours[0]
        )
        settings = SweeperConfig(redeliveries_per_run=250)
        quotas = {2: 150}  # the second sweep may make 150 calls: its listing is cut short
        reports = []
        for run in range(1, 12):
            clock.at = SIMULATED_START + timedelta(minutes=5 * run)
            hours[0] += 1
            redeliveries = [d for d in fake_github.app_deliveries if d.redelivery]
            fake_github.app_deliveries = [d for d in log if d.delivered_at <= clock.at]
            fake_github.app_deliveries += redeliveries
            fake_github.app_quota = quotas.get(run)
            reports.append(sweep(github, store, clock, settings=settings))
            last = reports[-1]
            if clock.at >= SIMULATED_START + SIMULATED and last.complete and not last.left:
                break

        guids = {d.id: d.guid for d in log}
        assert sorted(guids[i] for i in fake_github.redelivered) == sorted(lost - held)
        assert reports[1].complete is False and reports[1].left > 0
        assert all(r.complete for r in reports[2:])
        assert len(reports) <= 8, [r.counts() for r in reports]


class TestSweepHandler:
    def _handler(self, github: GitHubRest, store: SqliteStore) -> SweepHandler:
        settings = SweeperConfig(redeliveries_per_run=5)
        return SweepHandler(Sweeper(github, store, FixedClock(), settings))

    def test_a_post_sweeps_and_answers_the_counts(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [_attempt(11, "lost")]

        response = self._handler(github, store).handle(Request("POST", "/", {}))

        assert response.status == 200
        assert json.loads(response.body)["redelivered"] == 1

    def test_other_methods_are_refused(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        assert self._handler(github, store).handle(Request("GET", "/", {})).status == 405
        assert fake_github.requests == []

    @pytest.mark.parametrize(("status", "answer"), [(502, 503), (401, 500)])
    def test_a_listing_failure_is_retryable_or_not(
        self,
        github: GitHubRest,
        store: SqliteStore,
        fake_github: FakeGitHub,
        status: int,
        answer: int,
    ) -> None:
        fake_github.script(4, match="GET /app/hook/deliveries", status=status, body={})

        assert self._handler(github, store).handle(Request("POST", "/", {})).status == answer


class TestBuildSweeper:
    def test_without_app_auth_the_function_refuses_to_start(self, tmp_path: Path) -> None:
        config = Config(
            github=GitHubConfig(token_env="GH_TOKEN"),
            store=StoreConfig(sqlite=SqliteConfig(path=str(tmp_path / "s.db"))),
        )

        with pytest.raises(ConfigError, match=r"github\.appId and github\.privateKeyEnv"):
            build_sweeper(config, {"GH_TOKEN": "ghp_x"})

    def test_with_app_auth_it_builds(self, tmp_path: Path, github_app_key: AppKey) -> None:
        config = Config(
            github=GitHubConfig(app_id=APP_ID, private_key_env="GH_APP_KEY"),
            store=StoreConfig(sqlite=SqliteConfig(path=str(tmp_path / "s.db"))),
        )

        sweeper = build_sweeper(config, {"GH_APP_KEY": github_app_key.private_pem})

        assert isinstance(sweeper, Sweeper)


class TestCommandLine:
    def _run(self, *args: str, config: Path, env: dict[str, str]) -> Any:
        return subprocess.run(
            [*SWEEP_COMMAND, "--config", str(config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=os.environ | env,
        )

    def test_deliveries_sweep_redelivers_in_the_embedded_store(
        self, tmp_path: Path, fake_github: FakeGitHub, github_app_key: AppKey
    ) -> None:
        fake_github.app_public_key = github_app_key.public_key
        now = datetime.now(UTC)  # the command reads the system clock
        fake_github.app_deliveries = [
            FakeDelivery(21, "lost", delivered_at=now - timedelta(minutes=3), status_code=0),
            FakeDelivery(20, "held", delivered_at=now - timedelta(minutes=4), status_code=0),
        ]
        config = tmp_path / "looprelay.yaml"
        config.write_text(
            f"github:\n  apiUrl: {fake_github.url}\n  appId: {APP_ID}\n"
            "  privateKeyEnv: TEST_GH_APP_KEY\n"
        )
        data = tmp_path / "data"
        data.mkdir()
        held = SqliteStore(data / "looprelay.db")
        _hold(held, "held")
        held.close()
        env = {"TEST_GH_APP_KEY": github_app_key.private_pem}

        dry = self._run("--data", str(data), "--dry-run", config=config, env=env)
        assert dry.returncode == 0, dry.stderr
        assert fake_github.redelivered == []
        assert "not asked  lost  attempt 21" in dry.stdout

        done = self._run("--data", str(data), "--limit", "5", config=config, env=env)
        assert done.returncode == 0, done.stderr
        assert fake_github.redelivered == [21]
        assert "already in the ledger 1, redelivered 1, errors 0" in done.stdout

    def test_without_app_auth_it_names_the_keys(self, tmp_path: Path) -> None:
        config = tmp_path / "looprelay.yaml"
        config.write_text("github:\n  tokenEnv: GH_TOKEN\n")

        result = self._run("--data", str(tmp_path), config=config, env={"GH_TOKEN": "ghp_x"})

        assert result.returncode == 1
        assert "github.appId and github.privateKeyEnv" in result.stderr


class _CutOff(BaseException):
    """The platform ending the run at its timeout: nothing after it runs."""


class _CutOffAfter:
    """The ``GitHub`` port of ``inner``, whose run is cut off as it asks for redelivery
    number ``cut + 1``."""

    def __init__(self, inner: GitHubRest, cut: int) -> None:
        self._inner, self._left = inner, cut

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def redeliver(self, *, delivery_id: int) -> None:
        if self._left == 0:
            raise _CutOff
        self._left -= 1
        self._inner.redeliver(delivery_id=delivery_id)


class TestACutOffRun:
    def test_the_next_run_resumes_after_the_last_redelivery_it_made(
        self, github: GitHubRest, store: SqliteStore, fake_github: FakeGitHub
    ) -> None:
        fake_github.app_deliveries = [
            _attempt(n, f"g{n}", ago=timedelta(minutes=60 - n)) for n in range(1, 6)
        ]
        with pytest.raises(_CutOff):
            sweep(_CutOffAfter(github, cut=2), store, FixedClock())
        assert fake_github.redelivered == [1, 2]
        assert store.list_events(name=SWEPT_EVENT) == []

        report = sweep(github, store, FixedClock())

        # Listed back to the oldest not asked for (g3), not to the start of GitHub's window.
        assert report.since == NOW - timedelta(minutes=57)
        assert fake_github.redelivered[2:] == [3, 4, 5]
        assert report.left == 0


def test_the_time_budget_ends_before_the_sweeper_function_is_cut_off() -> None:
    from looprelay.service.sweeper import FINISH_SECONDS
    from tests.infra.test_terraform import _Eval, _infra

    functions = _Eval().value(_infra()["locals"]["functions"])
    timeout = functions["sweeper"]["timeout_seconds"]

    assert SweeperConfig().max_run_seconds + FINISH_SECONDS <= timeout
