"""The FetchLog filter decides per batch from its statistics: a batch it skips never holds a matching row
(checked against filtering every row, over random data and predicates), and it does skip the batches
whose bounds rule a predicate out."""

from __future__ import annotations

import datetime
import decimal
import random
from typing import Any

import pyarrow as pa
import pytest

from strom.client.predicates import Predicate, col
from strom.records import batch_statistics, log_batch
from strom.records.batch_filter import BatchFilter, InvalidPredicateError
from strom.records.schema import Schema
from strom.rpc.messages import pb

ARROW = pa.schema([
    ("id", pa.int32()), ("name", pa.string()), ("score", pa.float64()), ("price", pa.decimal128(10, 2)),
    ("day", pa.date32()), ("at", pa.timestamp("us")), ("flag", pa.bool_()), ("tiny", pa.int8()),
    ("small", pa.int16()), ("big", pa.int64()), ("ratio", pa.float32()), ("clock", pa.time32("ms")),
    ("ltz", pa.timestamp("us", tz="UTC")), ("wide", pa.decimal128(25, 3)),
])
SCHEMA = Schema.from_arrow(ARROW)
ROW_TYPE = SCHEMA.row_type
NAMES = ["ann", "bob", "cy", "dora", "ed", "al"]


def _value(rng: random.Random, column: str) -> Any:
    if column == "id":
        return rng.randint(-50, 50)
    if column == "name":
        return rng.choice(NAMES)
    if column == "score":
        return rng.choice([-1.5, 0.0, 2.25, 10.0, 99.5])
    if column == "price":
        return decimal.Decimal(rng.randint(-999, 999)).scaleb(-2)
    if column == "day":
        return datetime.date(2026, 1, 1) + datetime.timedelta(days=rng.randint(0, 30))
    if column == "at":
        return datetime.datetime(2026, 1, 1) + datetime.timedelta(microseconds=rng.randint(0, 10**9))
    if column == "tiny":
        return rng.randint(-128, 127)
    if column == "small":
        return rng.randint(-300, 300)
    if column == "big":
        return rng.randint(-(2**62), 2**62)
    if column == "ratio":
        return rng.choice([-2.5, -0.25, 0.0, 0.5, 1.75, 3.0])  # exact in float32
    if column == "clock":
        return datetime.time(rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59), rng.randint(0, 999) * 1000)
    if column == "ltz":
        return datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
            microseconds=rng.randint(0, 10**9))
    if column == "wide":
        return decimal.Decimal(rng.randint(-(10**21), 10**21)).scaleb(-3)
    return rng.random() < 0.5


def _batch(rng: random.Random) -> pa.RecordBatch:
    rows = rng.randint(1, 12)
    null_share = rng.choice([0.0, 0.2, 1.0])
    return pa.RecordBatch.from_pydict(
        {f.name: [None if rng.random() < null_share else _value(rng, f.name) for _ in range(rows)] for f in ARROW},
        schema=ARROW,
    )


def _predicate(rng: random.Random, depth: int = 0) -> Predicate:
    if depth < 2 and rng.random() < 0.3:
        left, right = _predicate(rng, depth + 1), _predicate(rng, depth + 1)
        return left & right if rng.random() < 0.5 else left | right
    column = rng.choice(ARROW.names)
    target = col(column)
    kind = rng.choice(["=", "!=", "<", "<=", ">", ">=", "null", "not null", "in", "starts"])
    value = _value(rng, column)
    if kind == "null":
        return target.is_null()
    if kind == "not null":
        return target.is_not_null()
    if kind == "in":
        return target.isin([_value(rng, column) for _ in range(rng.randint(1, 3))])
    if kind == "starts" and column == "name":
        return target.starts_with(rng.choice(["a", "b", "d", "do", "z", ""]))
    return {"=": target == value, "!=": target != value, "<": target < value, "<=": target <= value,
            ">": target > value, ">=": target >= value}.get(kind, target == value)


@pytest.mark.parametrize("seed", range(60))
def test_a_skipped_batch_never_holds_a_matching_row(seed: int) -> None:
    rng = random.Random(seed)
    columns = rng.sample(range(len(ARROW)), rng.randint(1, len(ARROW)))
    predicate = _predicate(rng)
    batch_filter = BatchFilter.from_pb(predicate.to_pb(ROW_TYPE), ROW_TYPE, 1)
    for _ in range(25):
        batch = _batch(rng)
        data = log_batch.build_arrow_batch(batch, schema_id=1, statistics=batch_statistics.collect(batch, ROW_TYPE, columns))
        [(position, header)] = list(log_batch.iter_batches(data))
        if not batch_filter.may_match(data, position, header):
            assert predicate.filter(batch).num_rows == 0, f"skipped a batch with matching rows: {batch.to_pydict()}"


def _ids_batch(first: int, count: int) -> bytes:
    batch = pa.RecordBatch.from_pydict({f.name: [None] * count for f in ARROW} | {"id": list(range(first, first + count))},
                                       schema=ARROW)
    return log_batch.build_arrow_batch(batch, schema_id=1, statistics=batch_statistics.collect(batch, ROW_TYPE, [0, 1]))


@pytest.mark.parametrize(("predicate", "kept"), [
    (col("id") == 25, [20]),
    (col("id") >= 35, [30]),
    (col("id") < 10, [0]),
    (col("id").isin([5, 33]), [0, 30]),
    ((col("id") > 12) & (col("id") < 18), [10]),
    ((col("id") < 3) | (col("id") > 38), [0, 30]),
    (col("id").is_null(), []),
    (col("name").is_null(), [0, 10, 20, 30]),  # every name is null
    (col("name") == "x", []),  # no non-null name: no comparison holds
    (col("score") > 1.0, [0, 10, 20, 30]),  # no statistics for score: every batch may match
])
def test_the_filter_skips_the_batches_whose_bounds_rule_the_predicate_out(predicate: Predicate, kept: list[int]) -> None:
    data = b"".join(_ids_batch(first, 10) for first in (0, 10, 20, 30))
    batch_filter = BatchFilter.from_pb(predicate.to_pb(ROW_TYPE), ROW_TYPE, 1)
    matching, end = batch_filter.select(data)
    assert end == 10  # the offset after the last batch (unstamped batches all start at 0)
    firsts = [log_batch.read_arrow(b, 0, log_batch.read_header(b), ARROW)[1].column(0)[0].as_py() for b in matching]
    assert firsts == kept


def test_a_batch_of_another_schema_or_without_statistics_always_may_match() -> None:
    batch = pa.RecordBatch.from_pydict({f.name: [None] for f in ARROW} | {"id": [1]}, schema=ARROW)
    statistics = batch_statistics.collect(batch, ROW_TYPE, [0])
    batch_filter = BatchFilter.from_pb((col("id") > 5).to_pb(ROW_TYPE), ROW_TYPE, 1)
    for data in (log_batch.build_arrow_batch(batch, schema_id=1),  # V0: no statistics
                 log_batch.build_arrow_batch(batch, schema_id=2, statistics=statistics)):  # another schema
        assert batch_filter.may_match(data, 0, log_batch.read_header(data))
    data = log_batch.build_arrow_batch(batch, schema_id=1, statistics=statistics)
    assert not batch_filter.may_match(data, 0, log_batch.read_header(data))


def test_a_predicate_that_does_not_fit_the_schema_is_refused() -> None:
    unknown_field = pb.PbPredicate(type=0)
    unknown_field.leaf.function = 0
    unknown_field.leaf.field_id = 99
    unknown_field.leaf.literals.add(literal_type=3, is_null=False, int_value=1)
    wrong_type = (col("id") == 1).to_pb(ROW_TYPE)
    wrong_type.leaf.literals[0].literal_type = 8  # a string literal for an INT column
    for predicate in (unknown_field, wrong_type, pb.PbPredicate(type=7)):
        with pytest.raises(InvalidPredicateError):
            BatchFilter.from_pb(predicate, ROW_TYPE, 1)
