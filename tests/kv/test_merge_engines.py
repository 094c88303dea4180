"""Merge engines on a real KvTablet: stored rows and changelogs per Fluss's rowmerger rules, every
aggregate function, deletes and partial updates, the replay after a reopen, and the option checks."""

from __future__ import annotations

import decimal
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyroaring
import pytest

from strom.errors import (
    BitmapFormatError,
    DeletionDisabledError,
    InvalidConfigError,
    InvalidTableError,
    InvalidTargetColumnError,
    UnsupportedMergeOperationError,
)
from strom.records.types import (
    BigIntType,
    BooleanType,
    BytesType,
    CharType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntType,
    SmallIntType,
    StringType,
    TimestampLtzType,
    TimestampType,
    TinyIntType,
)
from tests.kv.merge_support import MergeBucket, table_info

FIRST_ROW = {"table.merge-engine": "first_row"}
VERSIONED = {"table.merge-engine": "versioned", "table.merge-engine.versioned.ver-column": "ver"}
VERSIONED_COLUMNS = [("id", IntType()), ("ver", BigIntType()), ("v", StringType())]
AGG_COLUMNS = [("id", IntType()), ("total", BigIntType()), ("tags", StringType()), ("note", StringType())]
AGG = {"table.merge-engine": "aggregation", "fields.total.agg": "sum", "fields.tags.agg": "listagg"}


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    opened: list[MergeBucket] = []

    def open_bucket(columns: list[tuple[str, DataType]], properties: dict[str, str]) -> MergeBucket:
        bucket = MergeBucket(tmp_path / f"b{len(opened)}", columns, ["id"], properties)
        opened.append(bucket)
        return bucket

    yield open_bucket
    for bucket in opened:
        bucket.close()


# ---- first_row ----


@pytest.mark.asyncio
async def test_first_row_keeps_the_first_row_and_writes_no_update_changelog(make: Any) -> None:
    bucket = make([("id", IntType()), ("v", StringType())], FIRST_ROW)
    await bucket.put([{"id": 1, "v": "first"}, {"id": 2, "v": "other"}])
    await bucket.put([{"id": 1, "v": "second"}, {"id": 1, "v": "third"}])
    assert bucket.lookup({"id": 1}) == {"id": 1, "v": "first"}
    assert bucket.changelog() == [("+I", {"id": 1, "v": "first"}), ("+I", {"id": 2, "v": "other"})]


@pytest.mark.asyncio
async def test_first_row_ignores_deletes_by_default(make: Any) -> None:
    bucket = make([("id", IntType()), ("v", StringType())], FIRST_ROW)
    await bucket.put([{"id": 1, "v": "kept"}, ("delete", {"id": 1})])
    assert bucket.lookup({"id": 1}) == {"id": 1, "v": "kept"}
    assert [change for change, _row in bucket.changelog()] == ["+I"]


@pytest.mark.asyncio
async def test_first_row_with_delete_behavior_disable_refuses_deletes(make: Any) -> None:
    bucket = make([("id", IntType()), ("v", StringType())], {**FIRST_ROW, "table.delete.behavior": "disable"})
    await bucket.put([{"id": 1, "v": "kept"}])
    with pytest.raises(DeletionDisabledError):
        await bucket.put([("delete", {"id": 1})])
    assert bucket.lookup({"id": 1}) == {"id": 1, "v": "kept"}


@pytest.mark.asyncio
async def test_first_row_refuses_partial_updates(make: Any) -> None:
    bucket = make([("id", IntType()), ("v", StringType())], FIRST_ROW)
    with pytest.raises(UnsupportedMergeOperationError, match="Partial update is not supported for the first_row"):
        await bucket.put([{"id": 1, "v": "x"}], target_columns=["id", "v"])


# ---- versioned ----


@pytest.mark.asyncio
async def test_versioned_replaces_a_row_only_with_a_greater_or_equal_version(make: Any) -> None:
    bucket = make(VERSIONED_COLUMNS, VERSIONED)
    await bucket.put([{"id": 1, "ver": 5, "v": "five"}])
    await bucket.put([{"id": 1, "ver": 3, "v": "late"}])  # older: ignored, no changelog
    await bucket.put([{"id": 1, "ver": 5, "v": "again"}])  # equal: replaces
    await bucket.put([{"id": 1, "ver": 9, "v": "nine"}])
    assert bucket.lookup({"id": 1}) == {"id": 1, "ver": 9, "v": "nine"}
    assert bucket.changelog() == [
        ("+I", {"id": 1, "ver": 5, "v": "five"}),
        ("-U", {"id": 1, "ver": 5, "v": "five"}),
        ("+U", {"id": 1, "ver": 5, "v": "again"}),
        ("-U", {"id": 1, "ver": 5, "v": "again"}),
        ("+U", {"id": 1, "ver": 9, "v": "nine"}),
    ]


@pytest.mark.asyncio
async def test_versioned_treats_a_null_version_as_the_smallest(make: Any) -> None:
    bucket = make(VERSIONED_COLUMNS, VERSIONED)
    await bucket.put([{"id": 1, "ver": None, "v": "null first"}])
    await bucket.put([{"id": 1, "ver": None, "v": "null again"}])  # null >= null: replaces
    await bucket.put([{"id": 1, "ver": -(2**63), "v": "min"}])
    await bucket.put([{"id": 1, "ver": None, "v": "null late"}])  # below every version: ignored
    assert bucket.lookup({"id": 1}) == {"id": 1, "ver": -(2**63), "v": "min"}
    assert [change for change, _row in bucket.changelog()] == ["+I", "-U", "+U", "-U", "+U"]


@pytest.mark.asyncio
@pytest.mark.parametrize("version_type", [IntType(), TimestampType(3), TimestampLtzType(6)])
async def test_versioned_orders_int_and_timestamp_versions(make: Any, version_type: DataType) -> None:
    bucket = make([("id", IntType()), ("ver", version_type), ("v", StringType())], VERSIONED)
    await bucket.put([{"id": 1, "ver": 200, "v": "new"}, {"id": 1, "ver": 100, "v": "old"}])
    assert bucket.lookup({"id": 1}) == {"id": 1, "ver": 200, "v": "new"}


@pytest.mark.asyncio
async def test_versioned_with_a_wal_image_writes_only_update_after(make: Any) -> None:
    bucket = make(VERSIONED_COLUMNS, {**VERSIONED, "table.changelog.image": "WAL"})
    await bucket.put([{"id": 1, "ver": 1, "v": "a"}, {"id": 1, "ver": 2, "v": "b"}, {"id": 1, "ver": 0, "v": "c"}])
    assert bucket.changelog() == [("+I", {"id": 1, "ver": 1, "v": "a"}), ("+U", {"id": 1, "ver": 2, "v": "b"})]


@pytest.mark.asyncio
async def test_versioned_ignores_deletes_and_refuses_partial_updates(make: Any) -> None:
    bucket = make(VERSIONED_COLUMNS, VERSIONED)
    await bucket.put([{"id": 1, "ver": 1, "v": "a"}, ("delete", {"id": 1})])
    assert bucket.lookup({"id": 1}) == {"id": 1, "ver": 1, "v": "a"}
    with pytest.raises(UnsupportedMergeOperationError, match="versioned merge engine"):
        await bucket.put([{"id": 1, "ver": 2, "v": "b"}], target_columns=["id", "ver"])


# ---- aggregation: every function ----

D = decimal.Decimal


def bitmap32(*values: int) -> bytes:
    return bytes(pyroaring.BitMap(values).serialize())


def bitmap64(*values: int) -> bytes:
    return bytes(pyroaring.BitMap64(values).serialize())


# (function, parameters, column type, inputs in order, the stored value after them)
FUNCTION_CASES: list[tuple[str, dict[str, str], DataType, list[Any], Any]] = [
    ("sum", {}, BigIntType(), [5, None, 7, -2], 10),
    ("sum", {}, IntType(), [2**31 - 1, 1], -(2**31)),  # Java int arithmetic wraps
    ("sum", {}, TinyIntType(), [100, 100], -56),
    ("sum", {}, SmallIntType(), [30_000, 10_000], -25_536),
    ("sum", {}, DoubleType(), [0.1, 0.2], 0.1 + 0.2),
    ("sum", {}, FloatType(), [0.5, 0.25], 0.75),
    ("sum", {}, DecimalType(10, 2), [D("100.50"), D("200.75")], D("301.25")),
    ("sum", {}, DecimalType(4, 2), [D("60.00"), D("50.00")], None),  # beyond the precision: null
    ("sum", {}, BigIntType(), [None, None], None),
    ("product", {}, DoubleType(), [0.9, 0.8], 0.9 * 0.8),
    ("product", {}, BigIntType(), [3, None, -4], -12),
    ("product", {}, DecimalType(10, 2), [D("1.10"), D("1.15")], D("1.27")),  # 1.265 rounds half up
    ("max", {}, DoubleType(), [25.5, 28.3, 1.0], 28.3),
    ("max", {}, StringType(), ["b", "c", None, "a"], "c"),
    ("max", {}, TimestampType(3), [1_000, 3_000, 2_000], 3_000),
    ("max", {}, DateType(), [19_000, 18_000], 19_000),
    ("min", {}, DecimalType(10, 2), [D("99.99"), D("79.99"), D("89.99")], D("79.99")),
    ("min", {}, CharType(3), ["bb", "ab", None], "ab"),
    ("last_value", {}, StringType(), ["online", "offline", None], None),
    ("last_value_ignore_nulls", {}, StringType(), ["a@x", None, "b@x", None], "b@x"),
    ("first_value", {}, StringType(), ["first", "second", None], "first"),
    ("first_value", {}, StringType(), [None, "second", "third"], "second"),  # as Fluss's server does
    ("first_value_ignore_nulls", {}, StringType(), [None, "x", "y"], "x"),
    ("listagg", {}, StringType(), ["developer", "java", None, "flink"], "developer,java,flink"),
    ("listagg", {"delimiter": ";"}, StringType(), ["a", "b"], "a;b"),
    ("string_agg", {"delimiter": " | "}, StringType(), ["a", "b", "c"], "a | b | c"),
    ("bool_and", {}, BooleanType(), [True, None, True, False], False),
    ("bool_or", {}, BooleanType(), [False, None, False, True], True),
    ("rbm32", {}, BytesType(), [bitmap32(1, 2), None, bitmap32(2, 3)], bitmap32(1, 2, 3)),
    ("rbm64", {}, BytesType(), [bitmap64(10, 2**40), bitmap64(20, 30)], bitmap64(10, 20, 30, 2**40)),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("function", "parameters", "column_type", "inputs", "expected"),
    FUNCTION_CASES,
    ids=[f"{case[0]}-{case[2]}-{index}" for index, case in enumerate(FUNCTION_CASES)],
)
async def test_each_aggregate_function_folds_writes_of_a_key(
    make: Any, function: str, parameters: dict[str, str], column_type: DataType, inputs: list[Any], expected: Any
) -> None:
    options = {"table.merge-engine": "aggregation", "fields.value.agg": function}
    options.update({f"fields.value.{function}.{name}": value for name, value in parameters.items()})
    bucket = make([("id", IntType()), ("value", column_type)], options)
    for value in inputs[:2]:  # across batches (the stored row is decoded) ...
        await bucket.put([{"id": 1, "value": value}])
    await bucket.put([{"id": 1, "value": value} for value in inputs[2:]])  # ... and within one batch
    stored = bucket.lookup({"id": 1})
    assert stored is not None
    if isinstance(expected, float):
        assert stored["value"] == pytest.approx(expected, rel=1e-6)
    else:
        assert stored["value"] == expected
    changes = [change for change, _row in bucket.changelog()]
    assert changes == ["+I"] + ["-U", "+U"] * (len(inputs) - 1)  # every update is logged, changed or not


@pytest.mark.asyncio
async def test_an_aggregate_column_without_a_function_keeps_the_last_non_null_value(make: Any) -> None:
    bucket = make(AGG_COLUMNS, AGG)
    await bucket.put([{"id": 1, "total": 1, "tags": "a", "note": "first"}])
    await bucket.put([{"id": 1, "total": 2, "tags": "b", "note": None}])
    assert bucket.lookup({"id": 1}) == {"id": 1, "total": 3, "tags": "a,b", "note": "first"}
    assert bucket.changelog()[1:] == [
        ("-U", {"id": 1, "total": 1, "tags": "a", "note": "first"}),
        ("+U", {"id": 1, "total": 3, "tags": "a,b", "note": "first"}),
    ]


@pytest.mark.asyncio
async def test_a_bad_bitmap_fails_the_write_and_writes_nothing(make: Any) -> None:
    bucket = make([("id", IntType()), ("seen", BytesType())], {"table.merge-engine": "aggregation", "fields.seen.agg": "rbm32"})
    await bucket.put([{"id": 1, "seen": bitmap32(1)}])
    with pytest.raises(BitmapFormatError):
        await bucket.put([{"id": 1, "seen": b"not a bitmap"}])
    assert bucket.lookup({"id": 1}) == {"id": 1, "seen": bitmap32(1)}
    assert len(bucket.changelog()) == 1


# ---- aggregation: deletes and partial updates ----


@pytest.mark.asyncio
async def test_aggregation_ignores_deletes_by_default(make: Any) -> None:
    bucket = make(AGG_COLUMNS, AGG)
    await bucket.put([{"id": 1, "total": 4}, ("delete", {"id": 1})])
    assert bucket.lookup({"id": 1}) == {"id": 1, "total": 4, "tags": None, "note": None}


@pytest.mark.asyncio
async def test_aggregation_with_delete_allowed_removes_the_row_and_starts_over(make: Any) -> None:
    bucket = make(AGG_COLUMNS, {**AGG, "table.delete.behavior": "allow"})
    await bucket.put([{"id": 1, "total": 4}, {"id": 1, "total": 5}])
    await bucket.put([("delete", {"id": 1}), {"id": 1, "total": 1}])
    assert bucket.lookup({"id": 1}) == {"id": 1, "total": 1, "tags": None, "note": None}
    assert [change for change, _row in bucket.changelog()] == ["+I", "-U", "+U", "-D", "+I"]
    assert bucket.changelog()[3] == ("-D", {"id": 1, "total": 9, "tags": None, "note": None})


@pytest.mark.asyncio
async def test_partial_aggregation_folds_the_target_columns_and_keeps_the_others(make: Any) -> None:
    bucket = make(AGG_COLUMNS, AGG)
    await bucket.put([{"id": 1, "total": 10, "tags": "a", "note": "kept"}])
    await bucket.put([{"id": 1, "total": 5, "tags": "b", "note": "not a target"}], target_columns=["id", "total"])
    assert bucket.lookup({"id": 1}) == {"id": 1, "total": 15, "tags": "a", "note": "kept"}
    # a new key is inserted with the row as the client sent it (Fluss's PartialAggregateRowMerger)
    await bucket.put([{"id": 2, "total": 5}], target_columns=["id", "total"])
    assert bucket.lookup({"id": 2}) == {"id": 2, "total": 5, "tags": None, "note": None}


@pytest.mark.asyncio
async def test_partial_delete_nulls_the_targets_and_removes_the_row_once_nothing_else_is_left(make: Any) -> None:
    bucket = make(AGG_COLUMNS, {**AGG, "table.delete.behavior": "allow"})
    await bucket.put([{"id": 1, "total": 10, "tags": "a", "note": None}])
    await bucket.put([("delete", {"id": 1})], target_columns=["id", "total"])
    assert bucket.lookup({"id": 1}) == {"id": 1, "total": None, "tags": "a", "note": None}
    await bucket.put([("delete", {"id": 1})], target_columns=["id", "tags"])  # no non-target value is left
    assert bucket.lookup({"id": 1}) is None
    assert [change for change, _row in bucket.changelog()] == ["+I", "-U", "+U", "-D"]


@pytest.mark.asyncio
async def test_partial_aggregation_needs_the_key_and_nullable_columns(make: Any) -> None:
    bucket = make(AGG_COLUMNS, AGG)
    with pytest.raises(InvalidTargetColumnError, match="must contain the primary key columns"):
        await bucket.put([{"id": 1, "total": 1}], target_columns=["total"])
    strict = make([("id", IntType()), ("total", BigIntType(nullable=False))], {"table.merge-engine": "aggregation"})
    with pytest.raises(InvalidTargetColumnError, match="column total is NOT NULL"):
        await strict.put([{"id": 1, "total": 1}], target_columns=["id", "total"])


@pytest.mark.asyncio
async def test_merged_state_survives_a_reopen_by_changelog_replay(make: Any) -> None:
    bucket = make(AGG_COLUMNS, AGG)
    await bucket.put([{"id": 1, "total": 1, "tags": "a"}, {"id": 1, "total": 2, "tags": "b"}])
    bucket.reopen()
    assert bucket.lookup({"id": 1}) == {"id": 1, "total": 3, "tags": "a,b", "note": None}
    await bucket.put([{"id": 1, "total": 3, "tags": "c"}])  # merging goes on from the replayed state
    assert bucket.lookup({"id": 1}) == {"id": 1, "total": 6, "tags": "a,b,c", "note": None}


@pytest.mark.asyncio
async def test_merged_state_is_restored_from_a_kv_snapshot_plus_the_changelog_after_it(
    make: Any, tmp_path: Path
) -> None:
    bucket = make(AGG_COLUMNS, AGG)
    await bucket.put([{"id": 1, "total": 1, "tags": "a"}])
    checkpoint = bucket.kv.create_checkpoint(tmp_path / "checkpoint")
    await bucket.put([{"id": 1, "total": 2, "tags": "b"}, {"id": 2, "total": 7}])
    bucket.close()
    rocksdb_dir = bucket.directory / "kv" / "rocksdb"
    shutil.rmtree(rocksdb_dir)
    shutil.copytree(checkpoint.directory, rocksdb_dir)  # what a replica does with a downloaded snapshot
    bucket.kv = bucket.open()  # replays the changelog from the snapshot's offset
    assert bucket.lookup({"id": 1}) == {"id": 1, "total": 3, "tags": "a,b", "note": None}
    assert bucket.lookup({"id": 2}) == {"id": 2, "total": 7, "tags": None, "note": None}


# ---- option checks at table creation (Fluss's messages) ----

INVALID_OPTIONS: list[tuple[list[tuple[str, DataType]], dict[str, str], type[Exception], str]] = [
    (AGG_COLUMNS, {"table.merge-engine": "last_row"}, InvalidConfigError, "Could not parse value 'last_row'"),
    (VERSIONED_COLUMNS, {"table.merge-engine": "versioned"}, InvalidConfigError, "must be set for versioned"),
    (VERSIONED_COLUMNS, {**VERSIONED, "table.merge-engine.versioned.ver-column": "nope"}, InvalidConfigError,
     "doesn't exist in schema"),
    (VERSIONED_COLUMNS, {**VERSIONED, "table.merge-engine.versioned.ver-column": "v"}, InvalidConfigError,
     r"must be one type of \[INT, BIGINT, TIMESTAMP, TIMESTAMP_LTZ\]"),
    (AGG_COLUMNS, {**FIRST_ROW, "table.delete.behavior": "allow"}, InvalidConfigError,
     "Table with 'FIRST_ROW' merge engine does not support delete operations"),
    (VERSIONED_COLUMNS, {**VERSIONED, "table.delete.behavior": "ALLOW"}, InvalidConfigError,
     "'VERSIONED' merge engine does not support delete"),
    (AGG_COLUMNS, {**AGG, "table.changelog.image": "WAL"}, InvalidConfigError, "does not support 'WAL' changelog image"),
    (AGG_COLUMNS, {**AGG, "fields.total.agg": "median"}, InvalidConfigError, "Unknown aggregation function for column 'total'"),
    (AGG_COLUMNS, {**AGG, "fields.tags.agg": "sum"}, InvalidConfigError, "Invalid aggregation function for column 'tags'"),
    (AGG_COLUMNS, {**AGG, "fields.total.agg": "bool_or"}, InvalidConfigError, "Data type for bool_or column"),
    (AGG_COLUMNS, {**AGG, "fields.total.sum.delimiter": ";"}, InvalidConfigError, "Parameter 'delimiter' is not supported"),
    (AGG_COLUMNS, {**AGG, "fields.tags.listagg.delimiter": ""}, InvalidConfigError, "must be a non-empty string"),
    (AGG_COLUMNS, {**AGG, "fields.missing.agg": "sum"}, InvalidConfigError, "names no column"),
    (AGG_COLUMNS, {"fields.total.agg": "sum"}, InvalidConfigError, "only supported for aggregation merge engine"),
    (AGG_COLUMNS, {**AGG, "fields.id.agg": "sum"}, InvalidTableError, "Cannot set aggregation function for primary key"),
    (AGG_COLUMNS, {"table.delete.behavior": "sometimes"}, InvalidConfigError, "Could not parse value 'sometimes'"),
]


@pytest.mark.parametrize(("columns", "properties", "error", "message"), INVALID_OPTIONS)
def test_invalid_merge_options_are_refused_with_flusss_error(
    columns: list[tuple[str, DataType]], properties: dict[str, str], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        table_info(columns, ["id"], properties)


def test_function_names_are_case_and_dash_insensitive_and_stored_in_the_schema() -> None:
    table = table_info(AGG_COLUMNS, ["id"], {"table.merge-engine": "AGGREGATION", "fields.note.agg": "Last-Value"})
    assert table.schema.columns[3].agg_function == {"type": "last_value"}
    assert "fields.note.agg" not in table.properties
