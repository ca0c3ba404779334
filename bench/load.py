"""A bounded burst of signed deliveries into ``looprelay up`` with one runner agent.

Sends ``--deliveries`` signed ``issue_comment`` deliveries across ``--work-items`` issues (one
``the-loop start`` each, routed first, then comments round-robin) from ``--senders`` keep-alive
connections at full speed, waits until the runner has applied every dispatch, and reports ack
and end-to-end latency, drain time, store operations per delivery and peak RSS. Exits 1 when
anything acked was lost or applied twice (or the rig failed), 0 otherwise. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadrig import LoadError
from loadrun import format_report, run_load


def main() -> int:
    """Run one burst and print its report; exit 1 on loss, duplicates or a failed rig."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=10_000, help="[default: 10000]")
    parser.add_argument("--work-items", type=int, default=200, help="[default: 200]")
    parser.add_argument("--senders", type=int, default=8, help="concurrent senders [default: 8]")
    parser.add_argument(
        "--max-minutes", type=float, default=30.0, help="give up on the drain [default: 30]"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    if not 1 <= args.work_items <= min(args.deliveries, 256):
        parser.error("--work-items must be 1..256 and at most --deliveries (runner capacity)")
    try:
        with tempfile.TemporaryDirectory(prefix="looprelay-load-") as tmp:
            report = run_load(
                Path(tmp),
                deliveries=args.deliveries,
                work_items=args.work_items,
                senders=args.senders,
                max_seconds=args.max_minutes * 60,
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(report), indent=2) if args.json else format_report(report))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
