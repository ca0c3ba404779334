"""The RunnerRegistry contract: SQLite and Firestore must agree on every case."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from looprelay.core.model import RegistrationToken, RunnerRecord
from looprelay.ports import RunnerRegistry, RunnerStatus

T0 = datetime(2026, 11, 30, 12, 0, 0, 250000, tzinfo=UTC)
ONE, TWO, THREE = "r-0000000000000001", "r-0000000000000002", "r-0000000000000003"
UNKNOWN = "r-ffffffffffffffff"


def _runner(runner_id: str = "r-0000000000000001", *, at: datetime = T0) -> RunnerRecord:
    return RunnerRecord(
        runner_id=runner_id,
        name="laptop",
        labels={"os": "linux", "gpu": "none"},
        secret_hash="a" * 64,
        registered_at=at,
        version="0.1.0",
        capacity=2,
    )


class TestRegistrationTokens:
    def test_a_token_is_consumed_once(self, runner_registry: RunnerRegistry) -> None:
        runner_registry.add_registration_token(
            RegistrationToken(token_hash="h1", created_at=T0, expires_at=T0 + timedelta(hours=1))
        )
        assert runner_registry.consume_registration_token("h1", at=T0 + timedelta(minutes=1))
        assert not runner_registry.consume_registration_token("h1", at=T0 + timedelta(minutes=2))

    def test_an_expired_token_is_refused(self, runner_registry: RunnerRegistry) -> None:
        runner_registry.add_registration_token(
            RegistrationToken(token_hash="h1", created_at=T0, expires_at=T0 + timedelta(hours=1))
        )
        assert not runner_registry.consume_registration_token("h1", at=T0 + timedelta(hours=1))

    def test_an_unknown_token_is_refused(self, runner_registry: RunnerRegistry) -> None:
        assert not runner_registry.consume_registration_token("nope", at=T0)

    def test_racing_consumers_have_one_winner(self, runner_registry: RunnerRegistry) -> None:
        runner_registry.add_registration_token(
            RegistrationToken(token_hash="h1", created_at=T0, expires_at=T0 + timedelta(hours=1))
        )
        wins: list[bool] = []
        barrier = threading.Barrier(4)

        def consume() -> None:
            barrier.wait()
            wins.append(runner_registry.consume_registration_token("h1", at=T0))

        threads = [threading.Thread(target=consume) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(wins) == [False, False, False, True]


class TestRunners:
    def test_a_runner_round_trips(self, runner_registry: RunnerRegistry) -> None:
        runner_registry.add_runner(_runner())
        assert runner_registry.get_runner("r-0000000000000001") == _runner()
        assert runner_registry.get_runner("r-ffffffffffffffff") is None

    def test_an_existing_id_is_not_overwritten(self, runner_registry: RunnerRegistry) -> None:
        runner_registry.add_runner(_runner())
        with pytest.raises(ValueError, match="already exists"):
            runner_registry.add_runner(_runner().model_copy(update={"name": "other"}))
        stored = runner_registry.get_runner("r-0000000000000001")
        assert stored is not None and stored.name == "laptop"

    def test_a_checkout_runner_is_found_by_workspace_or_label(
        self, runner_registry: RunnerRegistry
    ) -> None:
        assert runner_registry.find_checkout_runner() is None
        runner_registry.add_runner(_runner(ONE))
        assert runner_registry.find_checkout_runner() is None
        runner_registry.add_runner(_runner(TWO).model_copy(update={"workspace": True}))
        assert runner_registry.find_checkout_runner() == TWO
        assert runner_registry.revoke_runner(TWO, at=T0)
        assert runner_registry.find_checkout_runner() is None
        labelled = _runner(THREE).model_copy(update={"labels": {"workspace": "true"}})
        runner_registry.add_runner(labelled)
        assert runner_registry.find_checkout_runner() == THREE

    def test_list_is_oldest_first(self, runner_registry: RunnerRegistry) -> None:
        runner_registry.add_runner(_runner("r-0000000000000002", at=T0 + timedelta(seconds=5)))
        runner_registry.add_runner(_runner("r-0000000000000001"))
        assert [r.runner_id for r in runner_registry.list_runners()] == [
            "r-0000000000000001",
            "r-0000000000000002",
        ]

    def test_the_list_holds_revoked_runners_too(self, runner_registry: RunnerRegistry) -> None:
        """Operators see them all (``looprelay runners list``, the status page)."""
        runner_registry.add_runner(_runner(ONE))
        runner_registry.add_runner(_runner(TWO, at=T0 + timedelta(seconds=5)))
        assert runner_registry.revoke_runner(TWO, at=T0)
        assert [(r.runner_id, r.revoked) for r in runner_registry.list_runners()] == [
            (ONE, False),
            (TWO, True),
        ]

    def test_heartbeat_updates_liveness_version_and_capacity(
        self, runner_registry: RunnerRegistry
    ) -> None:
        runner_registry.add_runner(_runner())
        later = T0 + timedelta(seconds=30)
        assert runner_registry.record_heartbeat(
            "r-0000000000000001",
            at=later,
            status=RunnerStatus(
                version="0.2.0",
                capacity=4,
                repositories=("octo/demo",),
                workspace=True,
                sessions=3,
                hostname="build-box.local",
            ),
        )
        stored = runner_registry.get_runner("r-0000000000000001")
        assert stored is not None
        assert stored.hostname == "build-box.local"
        assert (stored.last_seen_at, stored.version, stored.capacity) == (later, "0.2.0", 4)
        assert (stored.repositories, stored.workspace, stored.sessions) == (["octo/demo"], True, 3)
        assert stored.labels == {"os": "linux", "gpu": "none"}

    def test_rotation_replaces_only_the_secret_hash(self, runner_registry: RunnerRegistry) -> None:
        runner_registry.add_runner(_runner())
        assert runner_registry.rotate_runner_secret("r-0000000000000001", secret_hash="b" * 64)
        stored = runner_registry.get_runner("r-0000000000000001")
        assert stored is not None
        assert stored == _runner().model_copy(update={"secret_hash": "b" * 64})

    def test_a_revoked_runner_stays_revoked_and_cannot_change(
        self, runner_registry: RunnerRegistry
    ) -> None:
        runner_registry.add_runner(_runner())
        assert runner_registry.revoke_runner("r-0000000000000001", at=T0)
        assert not runner_registry.revoke_runner("r-0000000000000001", at=T0)
        assert not runner_registry.rotate_runner_secret("r-0000000000000001", secret_hash="c")
        assert not runner_registry.record_heartbeat(
            "r-0000000000000001", at=T0, status=RunnerStatus()
        )
        stored = runner_registry.get_runner("r-0000000000000001")
        assert stored is not None and stored.revoked and stored.revoked_at == T0
        assert stored.secret_hash == "a" * 64

    def test_changes_to_an_unknown_runner_report_false(
        self, runner_registry: RunnerRegistry
    ) -> None:
        unknown = "r-ffffffffffffffff"
        assert not runner_registry.revoke_runner(unknown, at=T0)
        assert not runner_registry.rotate_runner_secret(unknown, secret_hash="x")
        assert not runner_registry.record_heartbeat(unknown, at=T0, status=RunnerStatus())
        assert runner_registry.list_runners() == []


class TestLiveness:
    """A heartbeat that reports nothing new records only that the runner is alive
    (``record_alive``); every read of a runner says when it was last heard from."""

    def test_alive_moves_last_seen_and_nothing_else(self, runner_registry: RunnerRegistry) -> None:
        runner_registry.add_runner(_runner())
        later = T0 + timedelta(seconds=30)
        runner_registry.record_alive("r-0000000000000001", at=later)
        expected = _runner().model_copy(update={"last_seen_at": later})
        assert runner_registry.get_runner("r-0000000000000001") == expected
        assert runner_registry.list_runners() == [expected]
        assert runner_registry.list_last_seen([ONE]) == {ONE: later}

    def test_the_latest_heartbeat_wins_whichever_way_it_came(
        self, runner_registry: RunnerRegistry
    ) -> None:
        runner_registry.add_runner(_runner())
        status = RunnerStatus(version="0.2.0", capacity=2, sessions=1)
        runner_registry.record_alive("r-0000000000000001", at=T0 + timedelta(seconds=30))
        assert runner_registry.record_heartbeat(
            "r-0000000000000001", at=T0 + timedelta(seconds=60), status=status
        )
        runner_registry.record_alive("r-0000000000000001", at=T0 + timedelta(seconds=90))
        stored = runner_registry.get_runner("r-0000000000000001")
        assert stored is not None
        assert (stored.last_seen_at, stored.version, stored.sessions) == (
            T0 + timedelta(seconds=90),
            "0.2.0",
            1,
        )
        assert runner_registry.record_heartbeat(
            "r-0000000000000001", at=T0 + timedelta(seconds=120), status=status
        )
        seen = T0 + timedelta(seconds=120)
        assert [r.last_seen_at for r in runner_registry.list_runners()] == [seen]
        assert runner_registry.list_last_seen([ONE]) == {ONE: seen}

    def test_a_runner_added_as_seen_is_listed_as_seen(
        self, runner_registry: RunnerRegistry
    ) -> None:
        runner_registry.add_runner(_runner().model_copy(update={"last_seen_at": T0}))
        runner_registry.add_runner(_runner("r-0000000000000002", at=T0 + timedelta(seconds=5)))
        assert runner_registry.list_last_seen([ONE, TWO]) == {ONE: T0}

    def test_alive_never_revives_a_revoked_runner(self, runner_registry: RunnerRegistry) -> None:
        """A heartbeat authenticated just before the revocation may still record it alive."""
        runner_registry.add_runner(_runner())
        assert runner_registry.revoke_runner("r-0000000000000001", at=T0)
        runner_registry.record_alive("r-0000000000000001", at=T0 + timedelta(seconds=30))
        stored = runner_registry.get_runner("r-0000000000000001")
        assert stored is not None and stored.revoked and stored.revoked_at == T0
        assert [r.revoked_at for r in runner_registry.list_runners()] == [T0]
        assert not runner_registry.rotate_runner_secret("r-0000000000000001", secret_hash="c")

    def test_alive_never_makes_an_unknown_runner_known(
        self, runner_registry: RunnerRegistry
    ) -> None:
        runner_registry.record_alive("r-0000000000000001", at=T0)
        assert runner_registry.get_runner("r-0000000000000001") is None
        assert runner_registry.list_runners() == []
        assert not runner_registry.record_heartbeat(
            "r-0000000000000001", at=T0, status=RunnerStatus()
        )
        runner_registry.add_runner(_runner())  # registered later: never heard from yet
        assert runner_registry.get_runner("r-0000000000000001") == _runner()
        assert runner_registry.list_runners() == [_runner()]
        assert runner_registry.list_last_seen([ONE]) == {}


class TestSomeRunners:
    """What the lease desk reads to learn whether the runners its candidates are pinned to
    are live: those runners alone, in one round trip."""

    def test_only_the_runners_asked_for_are_read(self, runner_registry: RunnerRegistry) -> None:
        for n, runner_id in enumerate((ONE, TWO, THREE)):
            runner_registry.add_runner(_runner(runner_id, at=T0 + timedelta(seconds=n)))
        found = runner_registry.get_runners([THREE, ONE, UNKNOWN, ONE])
        assert found == {ONE: _runner(ONE), THREE: _runner(THREE, at=T0 + timedelta(seconds=2))}
        assert runner_registry.get_runners([]) == {}
        assert runner_registry.get_runners([UNKNOWN]) == {}

    def test_a_revoked_runner_is_read_as_revoked(self, runner_registry: RunnerRegistry) -> None:
        runner_registry.add_runner(_runner(ONE))
        assert runner_registry.revoke_runner(ONE, at=T0)
        runner_registry.record_alive(ONE, at=T0 + timedelta(seconds=30))
        found = runner_registry.get_runners([ONE])
        assert found[ONE].revoked and found[ONE] == runner_registry.get_runner(ONE)

    def test_the_latest_heartbeat_wins_whichever_way_it_came(
        self, runner_registry: RunnerRegistry
    ) -> None:
        runner_registry.add_runner(_runner(ONE))
        runner_registry.add_runner(_runner(TWO))
        status = RunnerStatus(version="0.2.0", capacity=2, sessions=1)
        assert runner_registry.record_heartbeat(ONE, at=T0 + timedelta(seconds=60), status=status)
        runner_registry.record_alive(ONE, at=T0 + timedelta(seconds=90))
        runner_registry.record_alive(TWO, at=T0 + timedelta(seconds=30))
        assert runner_registry.record_heartbeat(TWO, at=T0 + timedelta(seconds=60), status=status)
        found = runner_registry.get_runners([ONE, TWO])
        assert {r: (found[r].last_seen_at, found[r].sessions) for r in found} == {
            ONE: (T0 + timedelta(seconds=90), 1),
            TWO: (T0 + timedelta(seconds=60), 1),
        }
        assert found == {r: runner_registry.get_runner(r) for r in (ONE, TWO)}
        assert runner_registry.list_last_seen([ONE, TWO, UNKNOWN]) == {
            ONE: T0 + timedelta(seconds=90),
            TWO: T0 + timedelta(seconds=60),
        }

    def test_last_seen_leaves_out_the_never_heard_from_and_the_unknown(
        self, runner_registry: RunnerRegistry
    ) -> None:
        runner_registry.add_runner(_runner(ONE))
        runner_registry.add_runner(_runner(TWO))
        runner_registry.record_alive(TWO, at=T0 + timedelta(seconds=30))
        assert runner_registry.list_last_seen([ONE, TWO, UNKNOWN]) == {
            TWO: T0 + timedelta(seconds=30)
        }
        assert runner_registry.list_last_seen([]) == {}

    def test_many_runners_are_read_whatever_a_batch_holds(
        self, runner_registry: RunnerRegistry
    ) -> None:
        ids = [f"r-{n:016x}" for n in range(1, 121)]
        for runner_id in ids:
            runner_registry.add_runner(_runner(runner_id).model_copy(update={"last_seen_at": T0}))
        assert set(runner_registry.get_runners(ids)) == set(ids)
        assert runner_registry.list_last_seen(ids) == dict.fromkeys(ids, T0)
