"""Every query shape the Firestore adapters issue, and the composite index each one needs.

The emulator answers any query, indexed or not, while production answers FailedPrecondition
for a query no composite index serves. So the shapes are derived, not typed: the query methods
of the adapters are found in their source (a method that builds a query with ``where`` or
``order_by``, or calls one that does), each is run on the emulator with every combination of
its optional filters while the client records the structured query it sends, and each shape is
reduced to the index Firestore's rules ask for (docs: "Index types in Cloud Firestore").
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from google.cloud.firestore_v1 import query as firestore_query
from google.cloud.firestore_v1.types import StructuredQuery

from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry
from looprelay.adapters.firestore.store import FirestoreStore
from looprelay.adapters.firestore.work_items import FirestoreWorkItemStore

ADAPTERS = (FirestoreStore, FirestoreWorkItemStore, FirestoreRunnerRegistry)
SAMPLES: dict[str, tuple[Any, ...]] = {
    # A value for each parameter a query method takes (optional ones: also left out).
    "delivery_id": ("d-1",),
    "work_item": ("github:octo/demo#1",),
    "name": ("delivery.settled",),
    "after": ("0" * 20 + "/e-1",),
    "since": (datetime(2026, 11, 30, tzinfo=UTC),),
    "newest": (True,),
    "outcome": ("failed", "refused"),
    "statuses": (("queued",), ("queued", "leased")),
    "pr_ref": ("github:octo/demo#9",),
    "repositories": (("octo/demo",), [f"octo/r{n}" for n in range(40)]),
    "group": ("github:octo/demo#1",),
    "from_key": ("00000001",),
    "runner_id": ("r-1",),
    "endpoint": ("github:octo/demo#1",),
}
NOT_FILTERS = frozenset({"self", "limit"})
_Op = StructuredQuery.FieldFilter.Operator
_EQUALITY = {_Op.EQUAL, _Op.IN, _Op.ARRAY_CONTAINS, _Op.ARRAY_CONTAINS_ANY}
_DIRECTIONS = {
    StructuredQuery.Direction.ASCENDING: "ASCENDING",
    StructuredQuery.Direction.DESCENDING: "DESCENDING",
}


@dataclass(frozen=True)
class QueryShape:
    """What decides a query's index: collection, equality fields, then the ordering."""

    collection: str
    equalities: frozenset[str]
    ordering: tuple[tuple[str, str], ...]
    method: str

    def needs_composite(self) -> bool:
        """Firestore serves one ordered field, or equalities alone (merging single-field
        indexes), from its automatic indexes; anything more needs a composite one."""
        return (bool(self.equalities) and bool(self.ordering)) or len(self.ordering) > 1

    def served_by(self, declared: set[tuple[str, tuple[tuple[str, str], ...]]]) -> bool:
        """Whether ``declared`` (collection, fields) serves it: one index with the equality
        fields first (any order) and then the ordering, or one such index per equality field,
        which Firestore merges."""
        ours = {fields for collection, fields in declared if collection == self.collection}

        def exact(equalities: frozenset[str]) -> bool:
            return any(
                {f for f, _ in fields[: len(equalities)]} == equalities
                and fields[len(equalities) :] == self.ordering
                for fields in ours
            )

        return exact(self.equalities) or all(exact(frozenset({f})) for f in self.equalities)

    def could_use(self, index: tuple[str, tuple[tuple[str, str], ...]]) -> bool:
        """Whether ``index`` serves this query, alone or merged with others."""
        collection, fields = index
        if collection != self.collection or not self.needs_composite():
            return False
        split = len(fields) - len(self.ordering)
        head, tail = fields[:split], fields[split:]
        equalities = {f for f, _ in head}
        fits = equalities == self.equalities or (len(head) == 1 and equalities <= self.equalities)
        return tail == self.ordering and fits


def query_methods(adapter: type) -> list[str]:
    """The adapter's public methods that send a query, found in its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(adapter)))
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    bodies = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    queries = {name for name, f in bodies.items() if _builds_query(f)}
    while True:
        calling = {name for name, f in bodies.items() if _calls(f) & queries} - queries
        if not calling:
            break
        queries |= calling
    return sorted(name for name in queries if not name.startswith("_"))


def _builds_query(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(node, ast.Attribute) and node.attr in ("where", "order_by")
        for node in ast.walk(function)
    )


def _calls(function: ast.FunctionDef) -> set[str]:
    return {
        node.func.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    }


def argument_sets(method: Callable[..., Any]) -> Iterator[dict[str, Any]]:
    """Every combination of ``method``'s filters: required ones from ``SAMPLES``, optional
    ones left out or set to each sample. Raises ``KeyError`` naming a parameter without one."""
    choices: list[list[tuple[str, Any]]] = []
    for name, parameter in inspect.signature(method).parameters.items():
        if name in NOT_FILTERS:
            continue
        if name not in SAMPLES:
            raise KeyError(f"tests/firestore_queries.py: add SAMPLES[{name!r}]")
        values = [(name, value) for value in SAMPLES[name]]
        optional = parameter.default is not inspect.Parameter.empty
        choices.append([(name, None), *values] if optional else values)
    for combination in itertools.product(*choices):
        yield {name: value for name, value in combination if value is not None}


def shape_of(query: firestore_query.Query, method: str) -> QueryShape:
    """Reduce ``query`` to its ``QueryShape`` (the collection without the test's prefix)."""
    proto = query._to_protobuf()
    collection = proto.from_[0].collection_id.split("_", 1)[-1]
    filters = _field_filters(proto.where)
    equalities = frozenset(f.field.field_path for f in filters if f.op in _EQUALITY)
    ordering = [(o.field.field_path, _DIRECTIONS[o.direction]) for o in proto.order_by]
    for f in filters:  # an inequality orders by its field first when not ordered already
        if f.op not in _EQUALITY and all(field != f.field.field_path for field, _ in ordering):
            ordering.insert(0, (f.field.field_path, "ASCENDING"))
    ordering = [(field, direction) for field, direction in ordering if field != "__name__"]
    return QueryShape(collection, equalities, tuple(ordering), method)


def _field_filters(where: StructuredQuery.Filter) -> list[StructuredQuery.FieldFilter]:
    if "composite_filter" in where:
        return [f for sub in where.composite_filter.filters for f in _field_filters(sub)]
    return [where.field_filter] if "field_filter" in where else []


@pytest.fixture
def record_queries(monkeypatch: pytest.MonkeyPatch) -> list[firestore_query.Query]:
    """Every query the client runs from now on, as sent."""
    sent: list[firestore_query.Query] = []
    prepare = firestore_query.Query._prep_stream

    def recording(self: firestore_query.Query, *args: Any, **kwargs: Any) -> Any:
        sent.append(self)
        return prepare(self, *args, **kwargs)

    monkeypatch.setattr(firestore_query.Query, "_prep_stream", recording)
    return sent
