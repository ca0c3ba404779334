"""``looprelay events --follow`` misses nothing while writers race: 480 events written by four
store instances, or by eight threads of one, are all followed, each once, on each store."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest

from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.core.model import EventRecord
from looprelay.ports import Store
from looprelay.service.follow import follow

EVENTS = 480
DEADLINE_SECONDS = 120.0

MakeStores = Callable[[int], list[Store]]


@pytest.fixture(params=["sqlite", pytest.param("firestore", marks=pytest.mark.firestore)])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStores]:
    """``stores(n)``: ``n`` store instances over one log, each with a connection of its own."""
    opened: list[Callable[[], None]] = []
    if request.param == "sqlite":

        def make(count: int) -> list[Store]:
            made = [SqliteStore(tmp_path / "state.db") for _ in range(count)]
            opened.extend(store.close for store in made)
            return list(made)

    else:
        from google.cloud import firestore

        from looprelay.adapters.firestore.store import FirestoreStore
        from tests.firestore_emulator import PROJECT

        request.getfixturevalue("firestore_client")  # the emulator, wiped
        prefix = f"t{uuid.uuid4().hex[:12]}_"

        def make(count: int) -> list[Store]:
            clients = [firestore.Client(project=PROJECT) for _ in range(count)]
            opened.extend(client.close for client in clients)
            return [FirestoreStore(client, collection_prefix=prefix) for client in clients]

    yield make
    for close in opened:
        close()


def _followed_while_written(follower: Store, writers: list[Store]) -> list[str]:
    """Follow ``follower``'s log from its start while each writer appends its share of the
    ``EVENTS`` from a thread of its own; return the delivery ids followed, in order."""
    stop = threading.Event()
    seen: list[str] = []
    done = threading.Event()

    def tail() -> None:
        listing = partial(follower.list_events, limit=50)
        for batch in follow(listing, cursor=None, poll_seconds=0.05, sleep=stop.wait):
            seen.extend(event.delivery_id or "" for event in batch)
            if len(seen) >= EVENTS or stop.is_set():
                break
        done.set()

    def write(index: int, store: Store) -> None:
        for number in range(index, EVENTS, len(writers)):
            store.append_event(
                EventRecord(name="race", at=datetime.now(UTC), delivery_id=f"d-{number:04d}")
            )

    following = threading.Thread(target=tail, daemon=True)
    following.start()
    threads = [
        threading.Thread(target=write, args=(index, store)) for index, store in enumerate(writers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.wait(DEADLINE_SECONDS)
    stop.set()
    following.join(DEADLINE_SECONDS)
    return seen


class TestFollowingRacingWriters:
    def test_four_store_instances_writing_at_once_are_all_followed_once(
        self, stores: MakeStores
    ) -> None:
        follower, *writers = stores(5)
        seen = _followed_while_written(follower, writers)
        assert len(seen) == len(set(seen)), "each event once"
        assert sorted(seen) == [f"d-{n:04d}" for n in range(EVENTS)]

    def test_eight_threads_of_one_store_writing_at_once_are_all_followed_once(
        self, stores: MakeStores
    ) -> None:
        follower, shared = stores(2)
        seen = _followed_while_written(follower, [shared] * 8)
        assert len(seen) == len(set(seen)), "each event once"
        assert sorted(seen) == [f"d-{n:04d}" for n in range(EVENTS)]
