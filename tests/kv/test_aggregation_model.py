"""Property: the aggregation engine on a real KvTablet agrees with a plain in-memory model of Fluss's rules
over random sequences of full and partial upserts and deletes, batch by batch and after a reopen."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strom.records.types import BigIntType, BooleanType, IntType, StringType
from tests.kv.merge_support import MergeBucket, Row

COLUMNS = [
    ("id", IntType()),
    ("total", BigIntType()),
    ("top", IntType()),
    ("tags", StringType()),
    ("seen", BooleanType()),
    ("status", StringType()),
    ("origin", IntType()),
    ("note", StringType()),
]
PROPERTIES = {
    "table.merge-engine": "aggregation",
    "table.delete.behavior": "allow",
    "fields.total.agg": "sum",
    "fields.top.agg": "max",
    "fields.tags.agg": "listagg",
    "fields.tags.listagg.delimiter": "|",
    "fields.seen.agg": "bool_or",
    "fields.status.agg": "last_value",
    "fields.origin.agg": "first_value",
    # note: no function, so last_value_ignore_nulls
}
VALUE_NAMES = [name for name, _type in COLUMNS[1:]]


def _non_null(combine: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda old, new: new if old is None else old if new is None else combine(old, new)


MODEL: dict[str, Callable[[Any, Any], Any]] = {
    "total": _non_null(lambda a, b: a + b),
    "top": _non_null(max),
    "tags": _non_null(lambda a, b: f"{a}|{b}"),
    "seen": _non_null(lambda a, b: a or b),
    "status": lambda old, new: new,
    "origin": lambda old, new: new if old is None else old,
    "note": lambda old, new: old if new is None else new,
}


class Model:
    """Fluss's aggregation rules, written out plainly."""

    def __init__(self) -> None:
        self.rows: dict[int, Row] = {}

    def upsert(self, row: Row, targets: list[str] | None) -> None:
        old = self.rows.get(row["id"])
        if old is None:
            self.rows[row["id"]] = {name: row.get(name) for name in ["id", *VALUE_NAMES]}
            return
        merged = dict(old)
        for name in VALUE_NAMES:
            if targets is None or name in targets:
                merged[name] = MODEL[name](old[name], row.get(name))
        self.rows[row["id"]] = merged

    def delete(self, key: int, targets: list[str] | None) -> None:
        old = self.rows.get(key)
        if old is None:
            return
        if targets is None or all(old[name] is None for name in VALUE_NAMES if name not in targets):
            del self.rows[key]
            return
        self.rows[key] = {name: None if name in targets and name != "id" else value for name, value in old.items()}


values = st.fixed_dictionaries(
    {
        "total": st.none() | st.integers(-1000, 1000),
        "top": st.none() | st.integers(-50, 50),
        "tags": st.none() | st.sampled_from(["a", "b", "c"]),
        "seen": st.none() | st.booleans(),
        "status": st.none() | st.sampled_from(["on", "off"]),
        "origin": st.none() | st.integers(0, 9),
        "note": st.none() | st.sampled_from(["x", "y"]),
    }
)
targets = st.none() | st.lists(st.sampled_from(VALUE_NAMES), min_size=1, unique=True)
operation = st.tuples(st.sampled_from(["upsert", "upsert", "upsert", "delete"]), st.integers(0, 3), values)
batches = st.lists(st.tuples(targets, st.lists(operation, min_size=1, max_size=6)), min_size=1, max_size=8)


async def run(directory: Path, plan: list[tuple[list[str] | None, list[tuple[str, int, Row]]]]) -> None:
    bucket = MergeBucket(directory, COLUMNS, ["id"], PROPERTIES)
    model = Model()
    try:
        for target_names, operations in plan:
            target_columns = None if target_names is None else ["id", *target_names]
            writes: list[Row | tuple[str, Row]] = []
            for kind, key, row_values in operations:
                if kind == "delete":
                    writes.append(("delete", {"id": key}))
                    model.delete(key, target_columns)
                else:
                    sent = {"id": key, **{n: v for n, v in row_values.items() if target_names is None or n in target_names}}
                    writes.append(sent)
                    model.upsert(sent, target_columns)
            await bucket.put(writes, target_columns)
            assert {k: bucket.lookup({"id": k}) for k in range(4)} == {k: model.rows.get(k) for k in range(4)}
        bucket.reopen()  # RocksDB rebuilt from its last flush plus the changelog replay
        assert {k: bucket.lookup({"id": k}) for k in range(4)} == {k: model.rows.get(k) for k in range(4)}
    finally:
        bucket.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=batches)
def test_aggregation_engine_matches_the_model(plan: list[tuple[list[str] | None, list[tuple[str, int, Row]]]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(run(Path(directory), plan))
