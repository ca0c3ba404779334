"""The Store contract for user-id pins (``Store.pin_user_id``): every adapter (SQLite,
Firestore) must pass the same cases. A pin holds a login to the one GitHub account it meant
when the operator listed it, so it is made once, never replaced and never expires."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from google.cloud import firestore

from looprelay.adapters.firestore.store import FirestoreStore
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.ports import Store

T0 = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
OCTOCAT = 583231


class TestPinUserId:
    def test_the_first_pin_of_a_login_is_made(self, store: Store) -> None:
        assert store.pin_user_id("octocat", user_id=OCTOCAT, at=T0) == (OCTOCAT, True)

    @pytest.mark.parametrize("later_id", [OCTOCAT, 9_000_666], ids=["same-id", "other-id"])
    def test_a_later_pin_keeps_the_first_id(self, store: Store, later_id: int) -> None:
        store.pin_user_id("octocat", user_id=OCTOCAT, at=T0)
        later = T0 + timedelta(days=30)
        assert store.pin_user_id("octocat", user_id=later_id, at=later) == (OCTOCAT, False)

    def test_each_login_has_a_pin_of_its_own(self, store: Store) -> None:
        store.pin_user_id("octocat", user_id=OCTOCAT, at=T0)
        assert store.pin_user_id("renovate[bot]", user_id=29139614, at=T0) == (29139614, True)
        assert store.pin_user_id("octocat", user_id=1, at=T0) == (OCTOCAT, False)

    def test_a_pin_outlives_the_ledgers_retention(self, store: Store) -> None:
        """Pins are not ledger records: a year later the login is still held to its id."""
        store.pin_user_id("octocat", user_id=OCTOCAT, at=T0)
        a_year_on = T0 + timedelta(days=365)
        assert store.pin_user_id("octocat", user_id=7, at=a_year_on) == (OCTOCAT, False)

    def test_racing_first_sights_agree_on_one_pin(self, store: Store) -> None:
        results: list[tuple[int, bool]] = []
        barrier = threading.Barrier(4)

        def pin(user_id: int) -> None:
            barrier.wait()
            results.append(store.pin_user_id("octocat", user_id=user_id, at=T0))

        threads = [threading.Thread(target=pin, args=(n,)) for n in (11, 22, 33, 44)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        assert len({pinned for pinned, _ in results}) == 1
        assert [created for _, created in results].count(True) == 1


class TestPinsAreDurable:
    def test_sqlite_keeps_a_pin_across_a_reopen(self, tmp_path: Path) -> None:
        path = tmp_path / "looprelay.db"
        first = SqliteStore(path)
        first.pin_user_id("octocat", user_id=OCTOCAT, at=T0)
        first.close()

        reopened = SqliteStore(path)
        try:
            assert reopened.pin_user_id("octocat", user_id=7, at=T0) == (OCTOCAT, False)
        finally:
            reopened.close()

    @pytest.mark.firestore
    def test_a_firestore_pin_carries_no_expiry_for_the_ttl_policy(
        self, firestore_client: firestore.Client
    ) -> None:
        store = FirestoreStore(firestore_client, collection_prefix="pins_", retention_days=7)
        store.pin_user_id("octocat", user_id=OCTOCAT, at=T0)

        document = firestore_client.collection("pins_user_pins").document("octocat").get()
        assert document.to_dict() == {"login": "octocat", "user_id": OCTOCAT, "pinned_at": T0}
