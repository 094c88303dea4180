"""Rows of an earlier schema upgraded to the current one: the byte-level COMPACTED widening must equal
encoding the row with nulls appended, for every column count (null bitsets grow a byte at a time)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strom.errors import SchemaNotExistError
from strom.records.compacted import CompactedRowDecoder, CompactedRowEncoder
from strom.records.indexed import IndexedRowDecoder, IndexedRowEncoder
from strom.records.kv_batch import SCHEMA_ID
from strom.records.schema import Column, Schema
from strom.records.schema_evolution import RowUpgrader, column_mapping, widen_compacted_row
from strom.records.types import DataField, IntType, RowType, StringType


def schema_of(columns: int) -> Schema:
    return Schema.of([(f"c{i}", IntType() if i % 2 else StringType()) for i in range(columns)])


def value_of(index: int, seed: int) -> object:
    if (index + seed) % 3 == 0:
        return None
    return index * 7 + seed if index % 2 else f"s{index}-{seed}"


@settings(max_examples=200, deadline=None)
@given(old_count=st.integers(1, 20), added=st.integers(1, 12), seed=st.integers(0, 50))
def test_widening_a_compacted_row_equals_encoding_it_with_trailing_nulls(old_count: int, added: int, seed: int) -> None:
    old, new = schema_of(old_count), schema_of(old_count + added)
    values = [value_of(i, seed) for i in range(old_count)]
    row = CompactedRowEncoder(old.row_type).encode(values)
    widened = widen_compacted_row(row, old_count, old_count + added)
    assert widened == CompactedRowEncoder(new.row_type).encode(values + [None] * added)
    upgraded = RowUpgrader({1: old, 2: new}, 2).value(SCHEMA_ID.pack(1) + row)  # the table-driven paths too
    assert upgraded == SCHEMA_ID.pack(2) + widened
    assert list(CompactedRowDecoder(new.row_type).decode(widened)) == values + [None] * added


@pytest.mark.parametrize("kv_format", ["COMPACTED", "INDEXED"])
def test_stored_values_of_every_earlier_schema_come_out_in_the_current_one(kv_format: str) -> None:
    first = schema_of(3)
    second = first.with_columns_appended([Column("email", StringType())])
    third = second.with_columns_appended([Column("age", IntType())])
    assert [c.column_id for c in third.columns] == [0, 1, 2, 3, 4]
    upgrader = RowUpgrader({1: first, 2: second, 3: third}, 3, kv_format)
    encoder = {"COMPACTED": CompactedRowEncoder, "INDEXED": IndexedRowEncoder}[kv_format]
    decoder = {"COMPACTED": CompactedRowDecoder, "INDEXED": IndexedRowDecoder}[kv_format](third.row_type)

    stored = [
        SCHEMA_ID.pack(1) + encoder(first.row_type).encode(["a", 1, "x"]),
        SCHEMA_ID.pack(2) + encoder(second.row_type).encode(["b", None, "y", "b@x"]),
        SCHEMA_ID.pack(3) + encoder(third.row_type).encode(["c", 3, None, None, 30]),
        None,
    ]
    upgraded = upgrader.values(stored)
    assert upgraded[2] is stored[2] and upgraded[3] is None, "current rows are passed through untouched"
    assert RowUpgrader({1: first}, 1, kv_format).values(stored) is stored, "one schema: nothing to look at"
    assert [None if v is None else (v[:2], decoder.decode(memoryview(v)[2:])) for v in upgraded] == [
        (SCHEMA_ID.pack(3), ("a", 1, "x", None, None)),
        (SCHEMA_ID.pack(3), ("b", None, "y", "b@x", None)),
        (SCHEMA_ID.pack(3), ("c", 3, None, None, 30)),
        None,
    ]
    with pytest.raises(SchemaNotExistError, match="schema id 9"):
        upgrader.value(SCHEMA_ID.pack(9) + b"\x00")


def test_arrow_batches_gain_null_columns_matched_by_column_id() -> None:
    first = Schema.of([("id", IntType()), ("name", StringType())])
    second = first.with_columns_appended([Column("tags", RowType((DataField("a", IntType()),)))])
    assert column_mapping(first, second) == [0, 1, None]
    upgrader = RowUpgrader({1: first, 2: second}, 2)
    batch = pa.RecordBatch.from_pydict({"id": [1, 2], "name": ["a", None]}, schema=first.arrow_schema)
    upgraded = upgrader.batch(batch, 1)
    assert upgraded.schema == second.arrow_schema
    assert upgraded.to_pylist() == [{"id": 1, "name": "a", "tags": None}, {"id": 2, "name": None, "tags": None}]
    assert upgrader.batch(upgraded, 2) is upgraded
    with pytest.raises(SchemaNotExistError):
        upgrader.batch(batch, 7)


def test_appended_columns_never_reuse_an_id_even_of_nested_fields() -> None:
    first = Schema.of([("id", IntType()), ("nested", RowType((DataField("x", IntType()), DataField("y", IntType()))))])
    assert first.highest_field_id == 3
    second = first.with_columns_appended([Column("late", RowType((DataField("z", IntType()),)))])
    late = second.columns[-1]
    assert late.column_id == 4 and [f.field_id for f in late.data_type.fields] == [5]  # type: ignore[attr-defined]
    assert second.highest_field_id == 5
    assert Schema.from_json(second.to_json()) == second
