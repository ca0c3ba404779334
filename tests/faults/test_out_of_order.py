"""Fault: deliveries for one work item arriving out of order.

The order guarantee (SPEC §2 "Dispatch", docs/architecture.md "Per-work-item order") is about
what the worker *saved*, not about the order GitHub sent things in: Cloud Tasks and the
embedded queue do not order tasks, and GitHub does not either. For one work item:

- its dispatches carry ``seq`` numbers that are unique and follow the order the worker saved
  them in (a later ``seq`` is never older), so a runner applies them in that order;
- its session is spawned once, by the first delivery that starts it, and that ``spawn`` has the
  lowest ``seq``: nothing is delivered to a session before its spawn;
- a comment handled before the work item started is settled ``ignored`` (``not-started``) and
  never replayed later (an ``edited`` one alike; after the start an edit is delivered as an
  event of its own); nothing is applied twice.

The test sends, per issue, ``opened`` and ``labeled`` (either starts it), created comments and
edits of them, all shuffled together (seeded; the seed is printed) and posted from 8 threads.
"""

from __future__ import annotations

from pathlib import Path

from tests.fake_github import FakeGitHub
from tests.faults.deliveries import (
    AUTHORIZED,
    REPO,
    Delivery,
    Up,
    comment_payload,
    delivery,
    labeled_payload,
    opened_payload,
    seeded_random,
    send_all,
    wait_settled,
    write_config,
)

ISSUES = 6
COMMENTS = 3
EDITS = 2
"""Per issue: opened, labeled, 3 comments, 2 edits = 7; 42 deliveries in all."""


def _issue_deliveries(github: FakeGitHub, number: int) -> list[Delivery]:
    items = [
        delivery("issues", opened_payload(number), number=number, routes=True),
        delivery("issues", labeled_payload(number), number=number, routes=True),
    ]
    for index in range(COMMENTS):
        body = f"Comment {index} on #{number}"
        comment_id = github.add_comment(body, number=number, author=AUTHORIZED, repository=REPO)
        items.append(
            delivery(
                "issue_comment",
                comment_payload(number, comment_id, body),
                number=number,
                routes=True,
            )
        )
        if index < EDITS:
            edited = comment_payload(number, comment_id, body + " (edited)", action="edited")
            items.append(delivery("issue_comment", edited, number=number, routes=True))
    return items


class TestOutOfOrder:
    def test_each_work_items_dispatches_keep_the_order_they_were_saved_in(
        self, tmp_path: Path, fake_github: FakeGitHub, running: list[Up]
    ) -> None:
        github = fake_github
        github.repositories.add(REPO)
        sent = [d for n in range(1, ISSUES + 1) for d in _issue_deliveries(github, n)]
        seeded_random("out of order").shuffle(sent)
        data_dir = tmp_path / "data"
        up = Up(data_dir, write_config(tmp_path / "looprelay.yaml", github))
        running.append(up)

        assert send_all(up.webhook_url, up.secret, sent) == [202] * len(sent)
        outcomes = wait_settled(data_dir, [d.delivery_id for d in sent])

        rows = {row.delivery_id: row for row in outcomes.ledger}
        assert sorted(rows) == sorted(d.delivery_id for d in sent)
        assert sum(outcomes.settled_events[d.delivery_id] for d in sent) == len(sent)
        for number in range(1, ISSUES + 1):
            mine = [d for d in sent if d.number == number]
            ids = {d.delivery_id for d in mine}
            dispatches = sorted(
                (d for d in outcomes.dispatches if d.delivery_id in ids), key=lambda d: d.seq
            )
            assert len({d.delivery_id for d in dispatches}) == len(dispatches), "one each"
            assert [d.kind for d in dispatches][:1] == ["spawn"], "the spawn comes first"
            assert [d.kind for d in dispatches].count("spawn") == 1
            seqs = [d.seq for d in dispatches]
            assert seqs == sorted(set(seqs)), "unique seqs"
            created = [d.created_at for d in dispatches]
            assert created == sorted(created), "seq follows the order of saving"
            dispatched = {d.delivery_id for d in dispatches}
            for item in mine:
                row = rows[item.delivery_id]
                if item.delivery_id in dispatched:
                    assert row.outcome == "dispatched", row
                    continue
                assert row.outcome == "ignored", row
                if item.event == "issue_comment":
                    assert row.detail == "not-started", row  # it came before the start
            checklists = [
                c for c in github.on(number, REPO) if c.author != AUTHORIZED and "- [" in c.body
            ]
            assert len(checklists) == 1
