"""The lease desk's heads query in `looprelay up` on a backlog: 200 work items x 40 dispatches.

Every poll (and every look of a waiting poll a new dispatch wakes) lists each session's next
dispatch (``SqliteWorkItemStore.list_dispatch_heads``) and reads the work items of those heads
(``get_work_items``). Prints, for both, the store's p50 next to a baseline run in the same
process on the same file: the heads by the query before the covering index (the group's
minimum found by parsing each dispatch's repository out of its document), and the work items
parsed afresh on every read. See bench/README.md.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from looprelay.adapters.sqlite.work_items import SqliteWorkItemStore  # noqa: E402
from looprelay.core.model import DispatchRecord, WorkItemRecord  # noqa: E402
from tests.dispatches import make_dispatch, save_with_own_session  # noqa: E402

REPOSITORY = "codertocat/hello-world"
OPEN = ("pending", "leased")
UNINDEXED_HEADS = (
    "SELECT doc, created_at, seq, dispatch_id FROM (SELECT doc, created_at, dispatch_id,"
    " MIN(seq) AS seq FROM dispatches WHERE status IN (?, ?)"
    " AND lower(json_extract(doc, '$.repository')) IN (?)"
    " GROUP BY work_item, endpoint) ORDER BY created_at, seq, dispatch_id LIMIT 500"
)
"""The heads query as it was: what the baseline runs."""


def _p50_ms(call: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-items", type=int, default=200)
    parser.add_argument("--per-item", type=int, default=40, help="dispatches per work item")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp(prefix="looprelay-heads-")) / "work.db"
    store = SqliteWorkItemStore(path)
    now = datetime.now(UTC)
    for number in range(1, args.work_items + 1):
        dispatches = [
            make_dispatch(
                repository=REPOSITORY,
                number=number,
                seq=seq,
                created_at=now + timedelta(milliseconds=seq * 200 + number),
                kind="spawn" if seq == 1 else "deliver",
            )
            for seq in range(1, args.per_item + 1)
        ]
        save_with_own_session(
            store, repository=REPOSITORY, number=number, dispatches=dispatches, now=now
        )
    raw = sqlite3.connect(path)

    def unindexed() -> list[DispatchRecord]:
        rows = raw.execute(UNINDEXED_HEADS, (*OPEN, REPOSITORY)).fetchall()
        return [DispatchRecord.model_validate_json(row[0]) for row in rows]

    heads = store.list_dispatch_heads(statuses=OPEN, repositories=[REPOSITORY])
    assert [d.dispatch_id for d in heads] == [d.dispatch_id for d in unindexed()]
    refs = [d.work_item for d in heads]

    def parsed_afresh() -> dict[str, WorkItemRecord]:
        marks = ",".join("?" * len(refs))
        rows = raw.execute(f"SELECT ref, doc FROM work_items WHERE ref IN ({marks})", refs)  # noqa: S608
        return {ref: WorkItemRecord.model_validate_json(doc) for ref, doc in rows}

    total = args.work_items * args.per_item
    base = _p50_ms(unindexed, args.runs)
    now_ms = _p50_ms(
        lambda: store.list_dispatch_heads(statuses=OPEN, repositories=[REPOSITORY]), args.runs
    )
    print(
        f"heads of {len(heads)} sessions over {total} open dispatches: p50 {now_ms:.1f} ms, "
        f"baseline (unindexed) {base:.1f} ms, x{now_ms / base:.2f}"
    )
    base = _p50_ms(parsed_afresh, args.runs)
    now_ms = _p50_ms(lambda: store.get_work_items(refs), args.runs)
    print(
        f"their {len(refs)} work items: p50 {now_ms:.1f} ms, baseline (parsed on every read) "
        f"{base:.1f} ms, x{now_ms / base:.2f}"
    )
    raw.close()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
