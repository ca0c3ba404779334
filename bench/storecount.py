"""Count store operations at the adapter boundary, with no change to production code.

``install(counts)`` wraps every store adapter ``looprelay.app.local.LocalStack`` opens through
``looprelay.app.adapters`` (the ledger/event store, the work-item store, the runner registry) in a
proxy that counts each port call as a read (``get_*``, ``list_*``, ``find_*``) or a write
(anything else). Beneath it:

- SQLite: every statement each adapter's connection runs (``sqlite3`` trace callback), and the
  write transactions (``COMMIT``, or a write statement in autocommit), each one synced to disk;
- Firestore: the documents each client reads (a found or missing ``get`` is one read; a query
  bills its documents, at least one) and writes (every write in a commit), counted by wrapping
  the client's RPC layer.

Run as a script it is a launcher: ``python bench/storecount.py --counts-out FILE -- up ...``
runs the ``looprelay`` CLI with the wrappers installed and writes the counts to FILE (JSON) when
the process exits, so ``bench/load.py`` can count what a real ``looprelay up`` does.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import sqlite3
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_READ_PREFIXES = ("get_", "list_", "find_")
_WRITE_VERBS = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE"})
_FACTORIES = (
    ("open_store", "Store"),
    ("open_work_item_store", "WorkItemStore"),
    ("open_runner_registry", "RunnerRegistry"),
)
"""The store factories of ``looprelay.app.adapters``; wrapped there and wherever imported."""
_IMPORTERS = ("looprelay.app.compose", "looprelay.app.services")


class OpCounts:
    """Thread-safe counters of store operations; ``snapshot`` and ``minus`` compare runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, *keys: str, amount: int = 1) -> None:
        """Add ``amount`` to each of ``keys``."""
        with self._lock:
            for key in keys:
                self._counts[key] += amount

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._counts)

    @staticmethod
    def minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
        """``after - before`` per key, zeroes dropped."""
        keys = set(after) | set(before)
        return {
            k: after.get(k, 0) - before.get(k, 0)
            for k in sorted(keys)
            if after.get(k, 0) - before.get(k, 0)
        }


class CountingAdapter:
    """Wraps one store adapter: every public method call is counted, then delegated."""

    def __init__(self, adapter: Any, *, port: str, counts: OpCounts) -> None:
        self._adapter = adapter
        self._port = port
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._adapter, name)
        if name.startswith("_") or name == "close" or not callable(target):
            return target
        kind = "read" if name.startswith(_READ_PREFIXES) else "write"

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts.add(f"port.{kind}", f"call.{self._port}.{name}")
            return target(*args, **kwargs)

        return counted


def _trace_sqlite(adapter: Any, counts: OpCounts) -> None:
    """Count the statements of a SQLite adapter's connections: the writer
    (``adapter._db._db``) and, where there is one, the reader (``adapter._db._reader``)."""
    database = getattr(adapter, "_db", None)
    for name in ("_db", "_reader"):
        connection = getattr(database, name, None)
        if isinstance(connection, sqlite3.Connection):
            connection.set_trace_callback(_tracer(connection, counts))


def _tracer(connection: sqlite3.Connection, counts: OpCounts) -> Callable[[str], None]:
    def trace(statement: str) -> None:
        verb = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "?"
        if verb == "PRAGMA":
            return  # the synced/unsynced switch around a transaction, not a store operation
        counts.add(f"sql.{verb}")
        if verb == "COMMIT" or (verb in _WRITE_VERBS and not connection.in_transaction):
            counts.add("sql.commits")

    return trace


class _CountingFirestoreApi:
    """Stands in for a Firestore client's RPC layer, counting billed document operations."""

    def __init__(self, api: Any, counts: OpCounts) -> None:
        self._api = api
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def batch_get_documents(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for response in self._api.batch_get_documents(*args, **kwargs):
            self._counts.add("doc.reads")  # found or missing, a get bills one read
            yield response

    def run_query(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        self._counts.add("doc.queries")
        found = 0
        for response in self._api.run_query(*args, **kwargs):
            if response._pb.HasField("document"):
                found += 1
                self._counts.add("doc.reads")
            yield response
        if not found:
            self._counts.add("doc.reads")  # an empty query still bills one read

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        request = kwargs.get("request") or (args[0] if args else {})
        writes = request.get("writes", []) if isinstance(request, dict) else request.writes
        self._counts.add("doc.commits")
        self._counts.add("doc.writes", amount=len(writes))
        return self._api.commit(*args, **kwargs)


def _count_firestore(adapter: Any, counts: OpCounts) -> None:
    client = getattr(adapter, "_client", None)
    if client is not None and hasattr(client, "_firestore_api_internal"):
        count_client(client, counts)


def count_client(client: Any, counts: OpCounts) -> None:
    """Count the documents ``client`` (a ``firestore.Client``) reads and writes from now on,
    in ``counts`` (``doc.reads``, ``doc.writes``, ``doc.queries``, ``doc.commits``). Reads
    of real-time listeners are not RPCs of this layer: ``FirestoreDispatchFeed.reads``."""
    client._firestore_api_internal = _CountingFirestoreApi(client._firestore_api, counts)


def _wrapping(opener: Callable[..., Any], port: str, counts: OpCounts) -> Callable[..., Any]:
    def open_counted(*args: Any, **kwargs: Any) -> Any:
        adapter = opener(*args, **kwargs)
        _trace_sqlite(adapter, counts)
        _count_firestore(adapter, counts)
        return CountingAdapter(adapter, port=port, counts=counts)

    return open_counted


def _wrapping_all(opener: Callable[..., Any], counts: OpCounts) -> Callable[..., Any]:
    """Wrap ``open_stores``: each of the three adapters it returns is counted."""

    def open_counted(*args: Any, **kwargs: Any) -> Any:
        opened = opener(*args, **kwargs)
        for adapter in (opened.store, opened.work_items, opened.runners):
            _trace_sqlite(adapter, counts)
            _count_firestore(adapter, counts)
        return dataclasses.replace(
            opened,
            store=CountingAdapter(opened.store, port="Store", counts=counts),
            work_items=CountingAdapter(opened.work_items, port="WorkItemStore", counts=counts),
            runners=CountingAdapter(opened.runners, port="RunnerRegistry", counts=counts),
        )

    return open_counted


def install(counts: OpCounts) -> Callable[[], None]:
    """Wrap the store factories ``LocalStack`` uses; returns a function that unwraps them.

    ``looprelay.app.adapters.open_stores`` (all three adapters at once) is wrapped where it is
    defined and where it was imported; the single factories only where they were imported by name
    (``open_stores`` calls them for Firestore, and must not count twice). Raises
    ``RuntimeError`` when the factories moved (the wrapping would count nothing)."""
    import importlib

    stores = importlib.import_module("looprelay.app.adapters")
    importers = [importlib.import_module(name) for name in _IMPORTERS]
    undo: list[Callable[[], None]] = []

    def patch(modules: list[Any], attribute: str, wrapped: Callable[..., Any]) -> None:
        original = getattr(stores, attribute)
        for module in modules:
            if getattr(module, attribute, None) is original:
                setattr(module, attribute, wrapped)
                undo.append(functools.partial(setattr, module, attribute, original))

    if not hasattr(stores, "open_stores") or not all(hasattr(stores, a) for a, _ in _FACTORIES):
        raise RuntimeError(
            "looprelay.app.adapters changed its factories; update bench/storecount.py"
        )
    patch([stores, *importers], "open_stores", _wrapping_all(stores.open_stores, counts))
    for attribute, port in _FACTORIES:
        patch(importers, attribute, _wrapping(getattr(stores, attribute), port, counts))

    def uninstall() -> None:
        for step in undo:
            step()

    return uninstall


def main() -> None:
    """``storecount.py --counts-out FILE -- <looprelay arguments>``: run the CLI, counted."""
    args = sys.argv[1:]
    if len(args) < 3 or args[0] != "--counts-out" or args[2] != "--":
        sys.exit("usage: storecount.py --counts-out FILE -- <looprelay arguments>")
    out, cli_args = Path(args[1]), args[3:]
    counts = OpCounts()
    install(counts)
    atexit.register(lambda: out.write_text(json.dumps(counts.snapshot(), indent=1)))
    from looprelay.cli import main as cli_main

    sys.argv = ["looprelay", *cli_args]
    cli_main()


if __name__ == "__main__":
    main()
