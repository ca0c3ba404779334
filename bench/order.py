"""A burst of comments on one issue, all at once, in the cloud shape on the Firestore emulator.

Signed webhooks into ``Ingress``, ``CloudTasksQueue`` against the loopback Cloud Tasks
recorder, a dispatcher with Cloud Tasks' semantics (each task pushed at once, a non-2xx retried
after 1 s x 2^n: ``tests/cloudtasks_dispatcher.py``), and the real ``Worker`` over HTTP on a
``FirestoreStore``, which queues its wakes (``core/wake.py``) on the same recorder; its
handler records the order and the moment each delivery is handed off
(the router and the session are left out: what is measured is the order the inbox keeps).
The comments are made in one GitHub second with growing ids and sent from one thread each in
a shuffled order. Prints, per burst size, the inversions (neighbours handed off out of creation
order) and the time from the burst's first send to the last hand-off (p50 and max over
``--runs``), next to a lone comment's in the same run. Then a review with ``--review``
inline comments, its deliveries sent at once in a shuffled order, through the same rig with
``routing``'s default order rules (review turns on): the hand-offs it took (1: one turn) and
the time to it, against ``routing.turnWindowSeconds``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import random
import secrets
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from google.cloud import firestore  # noqa: E402
from loadrun import FIXTURE  # noqa: E402
from storeops import _emulator  # noqa: E402

from looprelay.adapters.firestore.store import FirestoreStore  # noqa: E402
from looprelay.adapters.gcp.cloud_tasks import CloudTasksQueue  # noqa: E402
from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator  # noqa: E402
from looprelay.app.ingress_http import webhook_handler  # noqa: E402
from looprelay.app.messages import Request  # noqa: E402
from looprelay.app.worker_http import worker_handler  # noqa: E402
from looprelay.config.model import RoutingConfig, WebhookConfig  # noqa: E402
from looprelay.config.order import order_rules  # noqa: E402
from looprelay.core.envelope import Envelope  # noqa: E402
from looprelay.core.model import DeliveryRecord  # noqa: E402
from looprelay.core.order import DEFAULT_RULES, OrderRules  # noqa: E402
from looprelay.core.signature import sign_body  # noqa: E402
from looprelay.service.ingress import Ingress  # noqa: E402
from looprelay.service.worker import Outcome, Worker  # noqa: E402
from tests.app_server import AppServer  # noqa: E402
from tests.cloudtasks_dispatcher import CloudTasksDispatcher  # noqa: E402
from tests.cloudtasks_recorder import CloudTasksRecorder, recorder_config  # noqa: E402

SECRET = b"bench-order-webhook"
TOKEN = secrets.token_hex(16)
PROJECT = "demo-looprelay"
DEADLINE_SECONDS = 120.0


class Recorder:
    """The worker's handler: which delivery was handed off when, with how many joined."""

    def __init__(self) -> None:
        self.handed: list[tuple[int, float]] = []
        self.turns: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def __call__(self, envelope: Envelope, record: DeliveryRecord) -> Outcome:
        with self._lock:
            self.handed.append((envelope.comment.id if envelope.comment else 0, time.monotonic()))
            self.turns.append((envelope.delivery_id, len(envelope.joined)))
        return Outcome("dispatched", "recorded")


@contextmanager
def _rig(
    client: firestore.Client, handler: Recorder, rules: OrderRules
) -> Iterator[tuple[Callable[[Request], Any], CloudTasksDispatcher]]:
    """Ingress (as a request handler) into the Cloud Tasks shape, to a fresh worker."""
    store = FirestoreStore(client, collection_prefix=f"b{uuid.uuid4().hex[:12]}_")
    # The worker queues its wakes on the queue that brings it its tasks, which needs the
    # worker's URL first: the server hands requests on to the worker made next.
    handlers: list[Callable[[Request], Any]] = []

    def to_worker(request: Request) -> Any:
        return handlers[0](request)

    server = AppServer(exact={"/worker": to_worker})
    server.start()
    recorder = CloudTasksRecorder()
    recorder.start()
    dispatcher = CloudTasksDispatcher(worker_url=f"{server.url}/worker", token=TOKEN)
    recorder.on_created.append(dispatcher.push)
    queue = CloudTasksQueue.from_config(recorder_config(recorder, worker_url=dispatcher.worker_url))
    worker = Worker(
        store=store,
        authenticator=SharedSecretAuthenticator(TOKEN),
        clock=_Clock(),
        handler=handler,
        order_rules=rules,
        wakes=queue,
    )
    handlers.append(worker_handler(worker))
    try:
        yield (
            webhook_handler(Ingress(secrets=[SECRET], queue=queue, config=WebhookConfig())),
            dispatcher,
        )
    finally:
        dispatcher.stop()
        recorder.stop()
        server.stop()


def _send_at_once(ingress: Callable[[Request], Any], requests: list[Request]) -> float:
    """Send ``requests`` from one thread each; the monotonic moment the first went."""
    start = time.monotonic()
    with ThreadPoolExecutor(len(requests)) as pool:
        statuses = list(pool.map(lambda request: ingress(request).status, requests))
    assert statuses == [202] * len(requests), statuses
    return start


def _wait(handler: Recorder, count: int, start: float) -> None:
    deadline = start + DEADLINE_SECONDS
    while len(handler.handed) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def burst(size: int, client: firestore.Client) -> tuple[int, float, int]:
    """Send ``size`` comments at once; return (inversions, seconds to the last hand-off,
    queue retries)."""
    handler = Recorder()
    with _rig(client, handler, DEFAULT_RULES) as (ingress, dispatcher):
        made = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        requests = [_signed(_comment(1000 + n, made), f"burst-{n:03d}") for n in range(size)]
        random.Random(size).shuffle(requests)
        start = _send_at_once(ingress, requests)
        _wait(handler, size, start)
        ids = [comment for comment, _ in handler.handed]
        inversions = sum(later < earlier for earlier, later in itertools.pairwise(ids))
        last = max((at for _, at in handler.handed), default=start + DEADLINE_SECONDS) - start
        return inversions + size - len(ids), last, dispatcher.retries()


def review(comments: int, client: firestore.Client) -> tuple[int, int, float]:
    """Send a review with ``comments`` inline comments at once; return (hand-offs, deliveries
    joined into the first, seconds to the first hand-off)."""
    handler = Recorder()
    rules = order_rules(RoutingConfig())
    with _rig(client, handler, rules) as (ingress, _dispatcher):
        parts = [
            _signed(_review_comment(2000 + n), f"part-{n:03d}", event=_INLINE)
            for n in range(comments)
        ]
        parts.append(_signed(_review_body(), "review", event=_REVIEW))
        random.Random(comments).shuffle(parts)
        start = _send_at_once(ingress, parts)
        _wait(handler, 1, start)
        time.sleep(rules.turn_window.total_seconds() + 1)  # a second hand-off would come by now
        first = handler.handed[0][1] - start if handler.handed else DEADLINE_SECONDS
        joined = handler.turns[0][1] if handler.turns else 0
        return len(handler.turns), joined, first


_INLINE = "pull_request_review_comment"
_REVIEW = "pull_request_review"


def _review_comment(comment_id: int) -> dict[str, Any]:
    payload = _fixture(_INLINE + ".created")
    payload["comment"].update(id=comment_id, body=f"note {comment_id}", line=comment_id % 90)
    return payload


def _review_body() -> dict[str, Any]:
    payload = _fixture(_REVIEW + ".submitted")
    payload["review"]["body"] = "Two things before this merges."
    return payload


def _fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURE.parent / f"{name}.json").read_text("utf-8"))
    return loaded


class _Clock:
    def now(self) -> datetime:
        return datetime.now(UTC)


def _comment(comment_id: int, made: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
    payload["issue"]["number"] = 1
    payload["comment"].update(id=comment_id, body=f"comment {comment_id}", created_at=made)
    return payload


def _signed(payload: dict[str, Any], delivery_id: str, *, event: str = "issue_comment") -> Request:
    body = json.dumps(payload).encode()
    headers = {
        "content-type": "application/json",
        "x-github-event": event,
        "x-github-delivery": delivery_id,
        "x-hub-signature-256": sign_body(body, SECRET),
        "content-length": str(len(body)),
    }
    return Request("POST", "/webhook", headers, body)


def main() -> int:
    """Run the bursts and print one row per size; exit 1 on any inversion or loss."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="15,50", help="burst sizes [default: 15,50]")
    parser.add_argument("--runs", type=int, default=5, help="runs per size [default: 5]")
    parser.add_argument(
        "--review", type=int, default=5, help="inline comments of the review [default: 5]"
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # each held attempt logs its 503: noise here
    with _emulator() as host:
        if host is None:
            print("error: no Firestore emulator (see tests/firestore_emulator.py)", file=sys.stderr)
            return 1
        client = firestore.Client(project=PROJECT)
        lone = statistics.median(burst(1, client)[1] for _ in range(args.runs))
        print(f"lone comment: last handed off p50 {lone:.2f} s (baseline)")
        failed = False
        for size in (int(part) for part in args.sizes.split(",")):
            results = [burst(size, client) for _ in range(args.runs)]
            inversions = [r[0] for r in results]
            lasts = [r[1] for r in results]
            p50 = statistics.median(lasts)
            print(
                f"{size} comments at once: inversions {max(inversions)} (max of {args.runs}), "
                f"last handed off p50 {p50:.2f} s, max {max(lasts):.2f} s "
                f"({p50 / lone:.1f}x the lone comment), queue retries p50 "
                f"{statistics.median(r[2] for r in results):.0f}"
            )
            failed = failed or any(inversions)
        reviews = [review(args.review, client) for _ in range(args.runs)]
        handoffs = [r[0] for r in reviews]
        firsts = [r[2] for r in reviews]
        print(
            f"a review with {args.review} inline comments at once: hand-offs {max(handoffs)} "
            f"(max of {args.runs}; 1 is one turn), joined {min(r[1] for r in reviews)} (min), "
            f"handed off p50 {statistics.median(firsts):.2f} s, max {max(firsts):.2f} s "
            f"(routing.turnWindowSeconds {RoutingConfig().turn_window_seconds:.0f} s)"
        )
        failed = failed or any(count != 1 for count in handoffs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
