"""The embedded queue's table and the statements whose shape matters (``queue``)."""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    name TEXT PRIMARY KEY,
    body BLOB NOT NULL,
    state TEXT NOT NULL,          -- pending | leased | done | dead
    attempts INTEGER NOT NULL DEFAULT 0,
    executions INTEGER NOT NULL DEFAULT 0,
    eta REAL NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    last_status INTEGER,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS tasks_due ON tasks (state, eta);
"""
ADDED_COLUMNS = {
    "grp": "TEXT NOT NULL DEFAULT ''",
    "order_key": "TEXT NOT NULL DEFAULT ''",
    "first_tried_at": "REAL",
    "lease_expires": "REAL",
}
"""Columns a file made before order was kept, or before leases expired, lacks; its tasks get
group '' (no order)."""
ORDER_INDEX = "CREATE INDEX IF NOT EXISTS tasks_by_group ON tasks (grp, state, order_key, name);"
RELEASE_EXPIRED = (
    "UPDATE tasks SET state = 'pending', lease_expires = NULL"
    " WHERE state = 'leased' AND lease_expires < :now"
)
"""Put back in line every task whose lease expired (its dispatcher died, hung or could not
write its outcome), so that any dispatcher takes it again; run before each claim, in its
transaction, so the claim below sees only live leases."""
CLAIM = """
UPDATE tasks SET state = 'leased', lease_expires = :expires,
    first_tried_at = COALESCE(first_tried_at, :now)
WHERE name = (
    SELECT t.name FROM tasks t WHERE t.state = 'pending' AND t.eta <= :now
    AND (t.grp = '' OR (
        NOT EXISTS (SELECT 1 FROM tasks o WHERE o.grp = t.grp AND o.state = 'leased')
        AND NOT EXISTS (
            SELECT 1 FROM tasks o WHERE o.grp = t.grp AND o.state = 'pending'
            AND (o.order_key, o.name) < (t.order_key, t.name)
            AND (o.first_tried_at IS NULL OR o.first_tried_at > :now - :wait))))
    ORDER BY t.eta LIMIT 1)
RETURNING name, body, attempts, executions, eta, lease_expires
"""
"""Take the most overdue task whose group lets it start: none of the group in flight, and no
earlier-keyed one waiting, unless that one has failed for longer than the wait (poison). The
claim's lease expires at ``:expires``. Each hold is its own ``NOT EXISTS`` with the state
as an equality, so both walk ``tasks_by_group`` (grp, state, order_key) straight to their
answer: one test with ``state = 'leased' OR state = 'pending'`` walked every row of the group,
done ones included, for every candidate (370 ms a claim with 2,000 tasks on one issue, 3.7 ms
now: issue 24's drain of a few tasks a second)."""
LEASE_MARGIN_SECONDS = 30.0
"""A claim's lease lasts two dispatch deadlines (a POST and its one resend on a new
connection, ``WorkerConnection``) and this margin; then any dispatcher may take it again."""
