"""The embedded shape's adapters: SQLite store, runner registry, work items and queue."""
