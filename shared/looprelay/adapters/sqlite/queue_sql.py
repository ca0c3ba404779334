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
ADDED_COLUMNS = {"lease_expires": "REAL"}
"""Columns a file made before leases expired lacks."""
RELEASE_EXPIRED = (
    "UPDATE tasks SET state = 'pending', lease_expires = NULL"
    " WHERE state = 'leased' AND lease_expires < :now"
)
"""Put back in line every task whose lease expired (its dispatcher died, hung or could not
write its outcome), so that any dispatcher takes it again; run before each claim, in its
transaction, so the claim below sees only live leases."""
CLAIM = """
UPDATE tasks SET state = 'leased', lease_expires = :expires
WHERE name = (
    SELECT name FROM tasks WHERE state = 'pending' AND eta <= :now ORDER BY eta LIMIT 1)
RETURNING name, body, attempts, executions, eta, lease_expires
"""
"""Take the most overdue task; the claim's lease expires at ``:expires``. Order among the
tasks of one issue is the worker's to keep (``service.inbox``), as under Cloud Tasks."""
LEASE_MARGIN_SECONDS = 30.0
"""A claim's lease lasts two dispatch deadlines (a POST and its one resend on a new
connection, ``WorkerConnection``) and this margin; then any dispatcher may take it again."""
