"""The native row codec (strom.records._rowcodec via row_batches, kv_batch, bucketing and kv.changelog) against the pure-Python reference.

Every test compares the fast path with the reference on the same input: equal bytes, equal
batches (floats compared bit for bit), equal buckets, or the same exception with the same message.
Random cases are seeded; failures print the seed.
"""

from __future__ import annotations

import contextlib
import random
import struct
from collections.abc import Callable, Iterator
from decimal import Context, Decimal
from typing import Any

import pyarrow as pa
import pytest

from strom.errors import CorruptRecordError
from strom.kv import changelog
from strom.records import bucketing, kv_batch, row_arrow, row_batches
from strom.records.bucketing import bucket_for_key
from strom.records.compacted import CompactedKeyEncoder, CompactedRowDecoder, CompactedRowEncoder
from strom.records.types import (
    ArrayType,
    BigIntType,
    BinaryType,
    BooleanType,
    BytesType,
    CharType,
    DataField,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntType,
    MapType,
    RowType,
    SmallIntType,
    StringType,
    TimestampLtzType,
    TimestampType,
    TimeType,
    TinyIntType,
    to_arrow_schema,
)

pytestmark = pytest.mark.skipif(not row_batches.NATIVE_AVAILABLE, reason="native row codec not built")
native = row_batches.native

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
_WIDE = Context(prec=100)
_TEXT = "abcXYZ019 _-éßΩ漢字€😀"


# ---------------------------------------------------------------------------------------------
# Random flat schemas and values with edge cases
# ---------------------------------------------------------------------------------------------


def flat_types(rng: random.Random) -> list[DataType]:
    p = rng.randint(1, 18)
    return [
        BooleanType(),
        TinyIntType(),
        SmallIntType(),
        IntType(),
        BigIntType(),
        FloatType(),
        DoubleType(),
        CharType(rng.randint(1, 10)),
        StringType(),
        BytesType(),
        BinaryType(rng.randint(1, 12)),
        DecimalType(p, rng.randint(0, p)),
        DateType(),
        TimeType(rng.randint(0, 9)),
        TimestampType(rng.randint(0, 9)),
        TimestampLtzType(rng.randint(0, 9)),
    ]


def random_flat_row_type(rng: random.Random, fields_max: int = 12) -> RowType:
    fields = []
    for i in range(rng.randint(1, fields_max)):
        t = rng.choice(flat_types(rng)).copy(rng.random() < 0.7)
        fields.append(DataField(f"f{i}", t))
    return RowType(tuple(fields))


def _float32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _text(rng: random.Random) -> str:
    length = rng.choice((0, 1, 7, 16, rng.randint(0, 40), 200, rng.choice((0, 5000))))
    return "".join(rng.choice(_TEXT) for _ in range(length))


def _bytes(rng: random.Random) -> bytes:
    return rng.randbytes(rng.choice((0, 1, 127, 128, rng.randint(0, 40), 300)))


def _timestamp(rng: random.Random, precision: int) -> int:
    if precision == 0:  # seconds: millis must stay within int64
        bound = I64_MAX // 1000
        return rng.choice((0, -1, 1, bound, -bound, rng.randint(-bound, bound), -86_400 * 365 * 300))
    # millis, micros and nanos: every int64 survives the millis / nano-of-milli split
    return rng.choice(
        (0, -1, 1, -999, -1001, I64_MIN, I64_MAX, rng.randint(I64_MIN, I64_MAX), rng.randint(-(10**15), 0))
    )


def _time(rng: random.Random, precision: int) -> int:
    millis = rng.choice((0, 86_399_999, rng.randrange(0, 86_400_000), -1, I32_MAX, I32_MIN))
    if precision == 0:
        return max(-2_147_483, min(2_147_483, millis // 1000))
    if precision <= 3:
        return millis
    if precision <= 6:  # sub-millisecond digits are dropped on write
        return millis * 1000 + rng.randint(0, 999)
    return millis * 1_000_000 + rng.randint(0, 999_999)


def edge_value(rng: random.Random, t: DataType, null_rate: float = 0.2) -> Any:
    """A value of ``t`` in the codecs' internal representation, favouring edges."""
    if t.nullable and rng.random() < null_rate:
        return None
    if isinstance(t, BooleanType):
        return rng.random() < 0.5
    if isinstance(t, TinyIntType):
        return rng.choice((-128, 127, 0, -1, rng.randint(-128, 127)))
    if isinstance(t, SmallIntType):
        return rng.choice((-32768, 32767, 0, -1, rng.randint(-32768, 32767)))
    if isinstance(t, (IntType, DateType)):
        return rng.choice((I32_MIN, I32_MAX, -1, 0, 127, 128, -200_000, rng.randint(I32_MIN, I32_MAX)))
    if isinstance(t, BigIntType):
        return rng.choice((I64_MIN, I64_MAX, -1, 0, 300, rng.randint(I64_MIN, I64_MAX)))
    if isinstance(t, FloatType):
        special = (float("nan"), float("inf"), float("-inf"), -0.0, 1e-45, 3.4028234663852886e38)
        return rng.choice((*special, _float32(rng.uniform(-1e30, 1e30)), _float32(rng.random())))
    if isinstance(t, DoubleType):
        special = (float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, 1.7976931348623157e308)
        return rng.choice((*special, rng.uniform(-1e300, 1e300), rng.random()))
    if isinstance(t, CharType):
        return "".join(rng.choice("abcé漢") for _ in range(rng.randint(0, t.length)))
    if isinstance(t, StringType):
        return _text(rng)
    if isinstance(t, BytesType):
        return _bytes(rng)
    if isinstance(t, BinaryType):  # Fluss does not enforce the length; Arrow pads or cuts
        return rng.randbytes(rng.choice((t.length, t.length, 0, 1, t.length + 5)))
    if isinstance(t, DecimalType):
        bound = 10**t.precision
        unscaled = rng.choice((bound - 1, -(bound - 1), 0, -1, rng.randrange(-bound + 1, bound)))
        return Decimal(unscaled).scaleb(-t.scale, _WIDE)
    if isinstance(t, TimeType):
        return _time(rng, t.precision)
    if isinstance(t, (TimestampType, TimestampLtzType)):
        return _timestamp(rng, t.precision)
    raise TypeError(t)


def edge_row(rng: random.Random, row_type: RowType, null_rate: float = 0.2) -> tuple[Any, ...]:
    return tuple(edge_value(rng, f.type, null_rate) for f in row_type.fields)


# ---------------------------------------------------------------------------------------------
# Comparison helpers
# ---------------------------------------------------------------------------------------------


def assert_identical(fast: pa.RecordBatch, reference: pa.RecordBatch, context: str) -> None:
    """Equal schemas and values; floats compared by bit pattern (NaN != NaN under equals)."""
    fast.validate()
    try:  # out-of-day TIME values fail full validation in both paths; pyarrow accepts them otherwise
        reference.validate(full=True)
    except pa.ArrowInvalid:
        pass
    else:
        fast.validate(full=True)
    assert fast.schema == reference.schema, context
    assert fast.num_rows == reference.num_rows, context
    for index, (a, b) in enumerate(zip(fast.columns, reference.columns, strict=True)):
        if pa.types.is_float32(a.type):
            a, b = a.view(pa.int32()), b.view(pa.int32())
        elif pa.types.is_float64(a.type):
            a, b = a.view(pa.int64()), b.view(pa.int64())
        assert a.equals(b), f"{context} column {index} ({fast.schema.field(index)}):\n{a}\n!=\n{b}"


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as e:
        return "error", (type(e), str(e))


def assert_same_outcome(fast: Callable[[], Any], reference: Callable[[], Any], context: str) -> None:
    """Both return equal results, or both raise the same exception type with the same message."""
    f_kind, f_value = outcome(fast)
    r_kind, r_value = outcome(reference)
    assert f_kind == r_kind, (
        f"{context}: fast {f_kind} {f_value!r:.300} vs reference {r_kind} {r_value!r:.300}"
    )
    if f_kind == "error":
        assert f_value == r_value, context
    elif isinstance(f_value, pa.RecordBatch):
        assert_identical(f_value, r_value, context)
    else:
        assert f_value == r_value, context


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the fast path fell back to the pure-Python reference")


@contextlib.contextmanager
def native_only() -> Iterator[None]:
    """Fail if the fast path hands a batch to the reference (valid data must stay native)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(row_batches, "decode_rows_python", _refuse)
        patch.setattr(row_batches, "_encode_python", _refuse)
        yield


@pytest.fixture
def no_fallback() -> Iterator[None]:
    """``native_only`` for a whole test that calls no pure-Python encode reference."""
    with native_only():
        yield


def reference_decode(rows: list[Any], row_type: RowType, offset: int = 0) -> pa.RecordBatch:
    return row_arrow.rows_to_record_batch_python(rows, CompactedRowDecoder(row_type), offset=offset)


# ---------------------------------------------------------------------------------------------
# Decode
# ---------------------------------------------------------------------------------------------


def random_case(seed: int) -> tuple[RowType, list[tuple[Any, ...]], list[bytes]]:
    rng = random.Random(seed)
    row_type = random_flat_row_type(rng)
    values = [edge_row(rng, row_type) for _ in range(rng.choice((0, 1, 2, rng.randint(3, 60))))]
    encoder = CompactedRowEncoder(row_type)
    return row_type, values, [encoder.encode(v) for v in values]


@pytest.mark.parametrize("seed", range(300))
def test_decode_equals_reference_for_random_flat_rows(seed, no_fallback):
    row_type, _, rows = random_case(seed)
    expected = reference_decode(rows, row_type)
    context = f"seed={seed} type={row_type}"
    assert_identical(row_batches.decode_rows(rows, row_type), expected, context)
    assert_identical(row_arrow.rows_to_record_batch(rows, row_type), expected, context)
    assert_identical(row_arrow.rows_to_record_batch(rows, CompactedRowDecoder(row_type)), expected, context)
    # stored values: a 2-byte schema id before each row, skipped rather than sliced off
    stored = [b"\x07\x00" + row for row in rows]
    assert_identical(row_batches.decode_rows(stored, row_type, offset=2), expected, context)
    assert_identical(row_arrow.rows_to_record_batch(stored, row_type, offset=2), expected, context)
    # every buffer-protocol flavour
    views = [memoryview(bytearray(b"xyz" + row))[3:] for row in rows]
    assert_identical(row_batches.decode_rows(views, row_type), expected, context)
    assert_identical(row_batches.decode_rows([bytearray(r) for r in rows], row_type), expected, context)
    assert_identical(row_batches.decode_rows(iter(rows), row_type), expected, context)


def test_decode_of_float_bit_patterns_matches_reference(no_fallback):
    row_type = RowType.of(("f", FloatType()), ("d", DoubleType()))
    floats = [0x7F800001, 0x7FC00123, 0xFFC00000, 0xFF800001, 0x7F800000, 0x80000000, 0x00000001, 0x3F800000]
    doubles = [
        0x7FF0000000000001,
        0x7FF8000000000123,
        0xFFF8000000000000,
        0x8000000000000000,
        1,
        0x3FF0000000000000,
    ]
    rows = [
        b"\x00" + struct.pack("<I", f) + struct.pack("<Q", d) for f in floats for d in doubles
    ]  # fmt: skip
    assert_identical(row_batches.decode_rows(rows, row_type), reference_decode(rows, row_type), "float bits")


def test_not_null_fields_ignore_their_null_bit(no_fallback):
    row_type = RowType.of(
        ("k", BigIntType(nullable=False)), ("s", StringType(nullable=False)), ("n", IntType())
    )
    rows = [b"\x07\x05\x02hi", b"\x00\x2a\x00\x05"]  # first: every null bit set
    expected = reference_decode(rows, row_type)
    assert expected.to_pylist() == [{"k": 5, "s": "hi", "n": None}, {"k": 42, "s": "", "n": 5}]
    assert_identical(row_batches.decode_rows(rows, row_type), expected, "not null")


def test_binary_values_are_padded_and_cut_like_the_reference(no_fallback):
    row_type = RowType.of(("b", BinaryType(4)))
    rows = [
        CompactedRowEncoder(row_type).encode([v])
        for v in (b"", b"\x01", b"\x01\x02\x03\x04", b"abcdefgh", None)
    ]
    batch = row_batches.decode_rows(rows, row_type)
    assert batch.column(0).to_pylist() == [b"\0\0\0\0", b"\x01\0\0\0", b"\x01\x02\x03\x04", b"abcd", None]
    assert_identical(batch, reference_decode(rows, row_type), "binary")


def test_values_only_python_represents_fall_back_to_identical_results():
    ts6 = RowType.of(("t", TimestampType(6)))
    ts9 = RowType.of(("t", TimestampLtzType(9)))
    dec = RowType.of(("d", DecimalType(4, 2)))
    text = RowType.of(("s", StringType()))
    cases = [
        (ts6, [b"\x00" + _uvarint(I64_MAX) + b"\x00"]),  # millis * 1000 overflows int64
        (ts6, [b"\x00" + _uvarint((I64_MAX // 1000 + 1) & (2**64 - 1)) + _uvarint(2**32 - 5000)]),
        (ts9, [b"\x00" + _uvarint(I64_MIN & (2**64 - 1)) + b"\x00"]),
        (dec, [b"\x00" + _uvarint(12345)]),  # more digits than the precision
        (text, [b"\x00\x02\xff\xfe", b"\x00\x03\xed\xa0\x80", b"\x00\x02\xc0\xaf"]),  # invalid UTF-8
    ]
    for row_type, rows in cases:
        assert_same_outcome(
            lambda rows=rows, row_type=row_type: row_batches.decode_rows(rows, row_type),
            lambda rows=rows, row_type=row_type: reference_decode(rows, row_type),
            f"{row_type} {rows}",
        )
    # invalid UTF-8 decodes with replacement characters, as the reference does
    assert row_batches.decode_rows(cases[-1][1], text).column(0).to_pylist()[0] == "\ufffd\ufffd"


def test_nested_columns_decode_in_python_alongside_native_columns(no_fallback):
    row_type = RowType.of(
        ("id", BigIntType(nullable=False)),
        ("tags", ArrayType(StringType())),
        ("name", StringType()),
        ("price", DecimalType(30, 4)),
        ("attrs", MapType(StringType(), RowType.of(("n", IntType()), ("b", BinaryType(2))))),
        ("inner", RowType.of(("x", DoubleType()), ("y", ArrayType(BinaryType(3))))),
    )
    encoder = CompactedRowEncoder(row_type)
    rows = [
        encoder.encode([1, ["a", None, "bcdefghijk"], "x", Decimal("-123456789012345678901.2345"),
                        [("k", {"n": 5, "b": b"\x01"})], {"x": 0.5, "y": [b"ab", None, b"abcdef"]}]),
        encoder.encode([2, None, None, None, None, None]),
        encoder.encode([3, [], "", Decimal(0), [], {"x": None, "y": []}]),
    ]  # fmt: skip
    expected = reference_decode(rows, row_type)
    assert_identical(row_batches.decode_rows(rows, row_type), expected, "nested")
    stored = [b"\x01\x00" + row for row in rows]
    assert_identical(row_batches.decode_rows(stored, row_type, offset=2), expected, "nested, offset")


@pytest.mark.parametrize("seed", range(60))
def test_random_nested_schemas_still_match_the_reference(seed):
    from tests.records.row_values import random_row, random_row_type

    rng = random.Random(seed)
    row_type = random_row_type(rng)
    encoder = CompactedRowEncoder(row_type)
    rows = [encoder.encode(random_row(rng, row_type)) for _ in range(rng.randint(0, 8))]
    expected = reference_decode(rows, row_type)
    assert_identical(row_batches.decode_rows(rows, row_type), expected, f"seed={seed} type={row_type}")
    reencoded = row_arrow.record_batch_to_rows(expected, encoder)
    assert reencoded == row_arrow.record_batch_to_rows_python(expected, encoder), f"seed={seed}"
    assert row_batches.encode_batch(expected, row_type) == row_batches.encode_batch_python(expected, row_type)


def test_decode_falls_back_when_the_caller_asks_for_other_arrow_types():
    row_type = RowType.of(("s", StringType()))
    schema = pa.schema([pa.field("s", pa.large_string())])
    rows = [b"\x00\x01a"]
    batch = row_batches.decode_rows(rows, row_type, arrow_schema=schema)
    assert batch.schema == schema and batch.column(0).to_pylist() == ["a"]


def test_decode_without_the_native_module_is_the_reference(monkeypatch):
    row_type, _, rows = random_case(7)
    monkeypatch.setattr(row_batches, "native", None)
    row_batches._plan.cache_clear()
    try:
        assert_identical(row_batches.decode_rows(rows, row_type), reference_decode(rows, row_type), "no native")
    finally:
        row_batches._plan.cache_clear()


# ---------------------------------------------------------------------------------------------
# Malformed rows: same outcome as the reference, and never a crash
# ---------------------------------------------------------------------------------------------


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def mutations(rng: random.Random, row: bytes) -> list[bytes]:
    cuts = [row[:i] for i in sorted({0, 1, len(row) // 2, max(0, len(row) - 1), rng.randint(0, len(row))})]
    flipped = bytearray(row)
    for _ in range(rng.randint(1, 4)):
        if flipped:
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
    position = rng.randint(0, len(row))
    return [
        *cuts,
        bytes(flipped),
        row + rng.randbytes(rng.randint(1, 5)),  # trailing bytes are allowed by both
        row[:position] + b"\xff" * rng.randint(1, 12) + row[position:],  # over-long varints
        row[:position] + _uvarint(rng.choice((2**31 - 1, 2**32 - 1, 2**35, 127, 128))) + row[position:],
        rng.randbytes(rng.randint(0, 30)),
    ]


@pytest.mark.parametrize("seed", range(150))
def test_malformed_rows_raise_like_the_reference(seed):
    rng = random.Random(seed)
    row_type, _, rows = random_case(seed)
    specs = row_batches._plan(row_type).specs
    for row in rows[:4] or [b"\x00" * 4]:
        for bad in mutations(rng, row):
            context = f"seed={seed} type={row_type} row={bad.hex()}"
            assert_same_outcome(
                lambda bad=bad: row_batches.decode_rows([bad], row_type),
                lambda bad=bad: reference_decode([bad], row_type),
                context,
            )
            # the C decoder itself only ever raises ValueError (never crashes or reads past the end)
            with contextlib.suppress(ValueError):
                native.decode_columns([memoryview(bad)], 0, specs)


def test_rows_shorter_than_their_prefix_or_bitset_raise():
    row_type = RowType.of(*((f"f{i}", IntType()) for i in range(9)))
    for rows, offset in (([b""], 0), ([b"\x00"], 0), ([b"\x00"], 2), ([b"\x00\x00"], 3)):
        with pytest.raises(ValueError):
            native.decode_columns(rows, offset, row_batches._plan(row_type).specs)
        with pytest.raises(ValueError):
            row_batches.decode_rows(rows, row_type, offset=offset)


def test_native_decode_rejects_bad_arguments_cleanly():
    with pytest.raises(ValueError):
        native.decode_columns([b"\x00\x00"], 0, ((99, 0, True),))
    with pytest.raises(ValueError):
        native.decode_columns([b"\x00\x00"], 0, ((row_batches._DECIMAL, 19, True),))
    with pytest.raises(ValueError):
        native.decode_columns([b"\x00\x00"], -1, ((row_batches._INT, 0, True),))
    with pytest.raises(TypeError):
        native.decode_columns([b"\x00\x00"], 0, ("nope",))
    with pytest.raises(TypeError):
        native.decode_columns(["not bytes"], 0, ((row_batches._INT, 0, True),))
    with pytest.raises(TypeError):
        native.decode_columns(None, 0, ((row_batches._INT, 0, True),))
    assert (
        row_batches.decode_rows(
            [memoryview(b"\x00\x00\x01\x00\x05")[::2]], RowType.of(("i", IntType()))
        ).num_rows
        == 1
    )


# ---------------------------------------------------------------------------------------------
# Encode
# ---------------------------------------------------------------------------------------------


def random_encode_case(seed: int) -> tuple[RowType, pa.RecordBatch, list[int], list[int], int]:
    rng = random.Random(seed)
    row_type = random_flat_row_type(rng)
    # primary-key columns are NOT NULL
    key_count = rng.randint(1, min(3, row_type.field_count))
    key_indexes = sorted(rng.sample(range(row_type.field_count), key_count))
    fields = tuple(
        DataField(f.name, f.type.copy(False)) if i in key_indexes else f
        for i, f in enumerate(row_type.fields)
    )
    row_type = RowType(fields)
    values = [edge_row(rng, row_type) for _ in range(rng.choice((0, 1, rng.randint(2, 60))))]
    batch = row_arrow.values_to_record_batch(values, row_type)
    bucket_key_indexes = rng.choice((key_indexes, key_indexes[:1], key_indexes[::-1]))
    return row_type, batch, key_indexes, bucket_key_indexes, rng.choice((1, 3, 16, 128, rng.randint(1, 1000)))


@pytest.mark.parametrize("seed", range(300))
def test_encode_equals_reference_for_random_flat_batches(seed):
    row_type, batch, keys, bucket_keys, buckets = random_encode_case(seed)
    context = f"seed={seed} type={row_type} keys={keys} bucket_keys={bucket_keys}"
    sliced = batch.slice(3, max(0, batch.num_rows - 4))  # non-zero Arrow offsets, validity mid-byte
    with native_only():
        fast = row_batches.encode_batch(batch, row_type, keys, bucket_keys, buckets)
        prefixed = row_batches.encode_batch(batch, row_type, value_prefix=b"\x03\x00")[0]
        via_row_arrow = row_arrow.record_batch_to_rows(batch, CompactedRowEncoder(row_type))
        fast_sliced = row_batches.encode_batch(sliced, row_type, keys, bucket_keys, buckets)
    assert fast == row_batches.encode_batch_python(batch, row_type, keys, bucket_keys, buckets), context
    # the reference of the reference: the row and key encoders themselves
    values = row_arrow.record_batch_to_values(batch, row_type)
    assert fast[0] == [CompactedRowEncoder(row_type).encode(v) for v in values], context
    assert fast[1] == [CompactedKeyEncoder(row_type, keys).encode(v) for v in values], context
    bucket_encoder = CompactedKeyEncoder(row_type, bucket_keys)
    assert fast[2] == [bucket_for_key(bucket_encoder.encode(v), buckets) for v in values], context
    assert via_row_arrow == fast[0], context
    assert prefixed == [b"\x03\x00" + r for r in fast[0]], context
    assert fast_sliced == row_batches.encode_batch_python(sliced, row_type, keys, bucket_keys, buckets), context
    # and the round trip through the fast decoder
    assert_identical(row_batches.decode_rows(fast[0], row_type), reference_decode(fast[0], row_type), context)


def test_encode_of_float_bit_patterns_matches_reference():
    row_type = RowType.of(("f", FloatType()), ("d", DoubleType()))
    floats = [0x7F800001, 0x7FC00123, 0xFFC00000, 0xFF800001, 0x7F800000, 0x80000000, 0x00000001]
    doubles = [0x7FF0000000000001, 0x7FF8000000000123, 0xFFF8000000000000, 0x8000000000000000, 1, 0]
    n = len(floats)
    f = pa.Array.from_buffers(pa.float32(), n, [None, pa.py_buffer(struct.pack(f"<{n}I", *floats))])
    d = pa.Array.from_buffers(pa.float64(), n, [None, pa.py_buffer(struct.pack(f"<{n}Q", *doubles, 0))])
    batch = pa.RecordBatch.from_arrays([f, d], schema=to_arrow_schema(row_type))
    with native_only():
        fast = row_batches.encode_batch(batch, row_type)
    assert fast == row_batches.encode_batch_python(batch, row_type)


def test_encode_casts_other_arrow_types_like_the_reference():
    row_type = RowType.of(("s", StringType()), ("d", DateType()), ("t", TimestampType(6)), ("i", IntType()))
    batch = pa.record_batch(
        [
            pa.array(["x", None, "yz"], pa.large_string()),
            pa.array([86_400_000, None, 0], pa.date64()),
            pa.array([5, -1, None], pa.timestamp("ms")),
            pa.array([1, 2, None], pa.int64()),
        ],
        names=["s", "d", "t", "i"],
    )
    with native_only():
        fast = row_batches.encode_batch(batch, row_type)
    assert fast == row_batches.encode_batch_python(batch, row_type)


def test_encode_of_nested_columns_splices_python_encodings():
    row_type = RowType.of(
        ("id", IntType(nullable=False)),
        ("tags", ArrayType(StringType())),
        ("row", RowType.of(("a", DecimalType(25, 3)), ("b", ArrayType(DecimalType(20, 1))))),
    )
    values = [(1, ["a", None], {"a": Decimal("1.5"), "b": [Decimal("2.0")]}), (2, [], None)]
    batch = row_arrow.values_to_record_batch(values, row_type)
    for java in (False, True):
        encoder = CompactedRowEncoder(row_type, java_decimal_layout=java)
        with native_only():  # ARRAY keys are allowed; MAP keys are not
            fast = row_batches.encode_batch(batch, row_type, [0, 1], [1], 5, java_decimal_layout=java)
            rows = row_arrow.record_batch_to_rows(batch, encoder)
        assert fast == row_batches.encode_batch_python(batch, row_type, [0, 1], [1], 5, java_decimal_layout=java)
        assert rows == [encoder.encode(v) for v in values]


def test_encode_errors_are_the_reference_errors():
    def check(batch: pa.RecordBatch, row_type: RowType, *args: Any) -> None:
        assert_same_outcome(
            lambda: row_batches.encode_batch(batch, row_type, *args),
            lambda: row_batches.encode_batch_python(batch, row_type, *args),
            f"{row_type} {batch}",
        )
        with pytest.raises(Exception):  # noqa: B017 - whatever the reference raises
            row_batches.encode_batch(batch, row_type, *args)

    not_null = RowType.of(("k", IntType(nullable=False)))
    check(pa.record_batch([pa.array([1, None], pa.int32())], names=["k"]), not_null)
    nullable = RowType.of(("k", IntType()), ("v", StringType()))
    both = pa.record_batch([pa.array([1, None], pa.int32()), pa.array(["a", "b"])], names=["k", "v"])
    check(both, nullable, [0])  # null key
    check(both, nullable, [1], [0], 4)  # null bucket key
    check(both, nullable, [1], [1], 0)  # bad bucket count
    check(both, nullable, [1], [], 4)  # empty bucket key
    check(both, RowType.of(("k", IntType())))  # column count
    seconds = RowType.of(("t", TimestampType(0)))
    check(pa.record_batch([pa.array([I64_MAX], pa.timestamp("s"))], names=["t"]), seconds)
    time_us = RowType.of(("t", TimeType(6)))
    check(pa.record_batch([pa.array([2**50], pa.time64("us"))], names=["t"]), time_us)
    time_s = RowType.of(("t", TimeType(0)))
    check(pa.record_batch([pa.array([3_000_000], pa.time32("s"))], names=["t"]), time_s)
    # a decimal128 holding more digits than its precision (only reachable without validation)
    dec = RowType.of(("d", DecimalType(3, 0)))
    data = pa.py_buffer(struct.pack("<qq", 12345, 0))
    check(
        pa.RecordBatch.from_arrays([pa.Array.from_buffers(pa.decimal128(3, 0), 1, [None, data])], ["d"]), dec
    )
    bad_utf8 = pa.Array.from_buffers(
        pa.utf8(), 1, [None, pa.py_buffer(struct.pack("<ii", 0, 2)), pa.py_buffer(b"\xff\xfe")]
    )
    check(pa.RecordBatch.from_arrays([bad_utf8], ["v"]), RowType.of(("v", StringType())))
    check(both, RowType.of(("k", IntType()), ("v", MapType(IntType(), IntType()))))  # cast fails


def test_native_encode_rejects_buffers_that_do_not_cover_the_array():
    long_ = row_batches._BIGINT, 0, True
    with pytest.raises(ValueError, match="data buffer"):
        native.encode_rows(3, ((*long_, None, 0, b"\x00" * 16, None),), None, None, 0, b"")
    with pytest.raises(ValueError, match="data buffer"):
        native.encode_rows(2, ((*long_, None, 1, b"\x00" * 16, None),), None, None, 0, b"")
    with pytest.raises(ValueError, match="validity buffer"):
        native.encode_rows(9, ((*long_, b"\xff", 0, b"\x00" * 72, None),), None, None, 0, b"")
    string = row_batches._STRING, 0, True
    with pytest.raises(ValueError, match="offsets buffer"):
        native.encode_rows(2, ((*string, None, 0, b"ab", struct.pack("<ii", 0, 1)),), None, None, 0, b"")
    for offsets in ((0, 3), (2, 1), (-1, 1)):
        with pytest.raises(ValueError, match="offsets outside"):
            native.encode_rows(
                1, ((*string, None, 0, b"ab", struct.pack("<ii", *offsets)),), None, None, 0, b""
            )
    with pytest.raises(ValueError, match="field index"):
        native.encode_rows(0, ((*long_, None, 0, b"", None),), (1,), None, 0, b"")
    with pytest.raises(ValueError):
        native.encode_rows(1, ((*long_, None, -1, b"\x00" * 8, None),), None, None, 0, b"")
    with pytest.raises(TypeError):
        native.encode_rows(
            1, ((row_batches._OPAQUE, 0, True, None, 0, ["not bytes"], None),), None, None, 0, b""
        )
    rows, keys, buckets = native.encode_rows(
        1, ((*string, None, 0, None, struct.pack("<ii", 0, 0)),), (0,), (0,), 3, b""
    )
    assert rows == [b"\x00\x00"] and keys == [b"\x00"] and buckets == [bucket_for_key(b"\x00", 3)]


# ---------------------------------------------------------------------------------------------
# KV records and buckets
# ---------------------------------------------------------------------------------------------


def _records(rng: random.Random, count: int) -> bytes:
    keys = [rng.randbytes(rng.choice((0, 1, 5, 130))) for _ in range(count)]
    values = [rng.choice((None, b"", rng.randbytes(rng.randint(1, 40)))) for _ in range(count)]
    batch = kv_batch.build_kv_batch(1, keys, values)
    return batch[kv_batch.KV_HEADER_SIZE_BYTES :]


def _parse_both(body: bytes, position: int, end: int, count: int, context: str) -> None:
    def reference() -> Any:
        return kv_batch._parse_records_python(memoryview(body), position, end, count)

    assert_same_outcome(
        lambda: kv_batch.parse_kv_records(memoryview(body), position, end, count), reference, context
    )
    assert_same_outcome(
        lambda: kv_batch._parse_records(memoryview(body), position, end, count), reference, context
    )


@pytest.mark.parametrize("seed", range(80))
def test_kv_records_parse_like_the_reference(seed):
    rng = random.Random(seed)
    count = rng.randint(0, 12)
    body = _records(rng, count)
    _parse_both(body, 0, len(body), count, f"seed={seed}")
    padded = b"\x00" * 3 + body + b"\x01" * 2
    _parse_both(padded, 3, 3 + len(body), count, f"seed={seed} padded")
    # wrong counts, truncations, corrupted bytes
    for bad_count in (count + 1, max(0, count - 1), -1, 2**31 - 1):
        _parse_both(body, 0, len(body), bad_count, f"seed={seed} count={bad_count}")
    for cut in {0, 1, 3, 4, 5, len(body) // 2, len(body) - 1} & set(range(len(body))):
        _parse_both(body[:cut], 0, cut, count, f"seed={seed} cut={cut}")
    for _ in range(10):
        mutated = bytearray(body)
        if mutated:
            mutated[rng.randrange(len(mutated))] = rng.choice((0x00, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        _parse_both(bytes(mutated), 0, len(mutated), count, f"seed={seed} mutated={bytes(mutated).hex()}")


def test_kv_record_errors_carry_the_reference_messages():
    cases = [
        (b"\x01\x00", 1, "truncated kv record size"),
        (b"\x00\x00\x00\x00", 1, "kv record of 0 bytes overruns its batch"),
        (b"\x02\x00\x00\x00\x80\x80", 1, "malformed kv record key length"),
        (
            b"\x06\x00\x00\x00\xff\xff\xff\xff\x7f\x00",
            1,
            "kv record key of 34359738367 bytes overruns its record",
        ),
        (b"\x01\x00\x00\x00\x00\x09", 1, "kv batch has 1 trailing bytes after 1 records"),
    ]
    for body, count, message in cases:
        with pytest.raises(CorruptRecordError, match=f"^{message}$"):
            kv_batch.parse_kv_records(body, 0, len(body), count)
        with pytest.raises(CorruptRecordError, match=f"^{message}$"):
            kv_batch._parse_records_python(memoryview(body), 0, len(body), count)
    assert kv_batch.parse_kv_records(b"\x02\x00\x00\x00\x01k", 0, 6, 1) == ([b"k"], [None])


@pytest.mark.parametrize("seed", range(40))
def test_kv_records_build_like_the_reference(seed):
    rng = random.Random(seed)
    count = rng.randint(0, 40)
    keys = [rng.randbytes(rng.choice((0, 1, 5, 127, 128, 300))) for _ in range(count)]
    values = [rng.choice((None, b"", rng.randbytes(rng.randint(1, 200)))) for _ in range(count)]
    built = native.build_kv_records(keys, values)
    assert built == kv_batch._kv_records_python(keys, values)
    expected_values = [value or None for value in values]  # an empty value is a delete on the wire
    assert kv_batch.parse_kv_records(built, 0, len(built), count) == (keys, expected_values)


def test_kv_records_refuse_what_is_not_bytes():
    with pytest.raises(TypeError, match="must be bytes"):
        native.build_kv_records(["k"], [None])
    with pytest.raises(TypeError, match="must be bytes"):
        native.build_kv_records([b"k"], [bytearray(b"v")])
    with pytest.raises(ValueError, match="differ in length"):
        native.build_kv_records([b"k"], [])
    with pytest.raises(ValueError, match="differ in length"):
        kv_batch.build_kv_batch(1, [b"k"], [])


def test_whole_kv_batches_parse_through_the_native_records_parser():
    batch = kv_batch.build_kv_batch(3, [b"a", b"bb"], [b"\x00\x01", None], writer_id=9, batch_sequence=4)
    (parsed,) = kv_batch.parse_kv_batches(batch + b"")
    assert (parsed.keys, parsed.values, parsed.writer_id, parsed.batch_sequence) == (
        [b"a", b"bb"],
        [b"\x00\x01", None],
        9,
        4,
    )


def test_bucket_ids_match_bucketing():
    rng = random.Random(5)
    keys = [rng.randbytes(rng.randint(1, 40)) for _ in range(500)]
    for count in (1, 2, 7, 16, 1000, 2**31 - 1):
        assert bucketing.bucket_ids(keys, count) == [bucket_for_key(k, count) for k in keys]
    # vectors from the Rust client, via the bucketing docs
    assert bucketing.bucket_ids([b"The quick brown fox jumps over the lazy dog"], 8) == [6]
    for keys, count in (([b""], 3), ([b"a"], 0), ([b"a"], -2)):
        assert_same_outcome(
            lambda keys=keys, count=count: bucketing.bucket_ids(keys, count),
            lambda keys=keys, count=count: [bucket_for_key(k, count) for k in keys],
            f"{keys} {count}",
        )


@pytest.mark.parametrize("seed", range(30))
def test_full_rows_in_c_equal_the_one_emitter(seed: int) -> None:
    """Batches that write keys several times, and (every third seed) batches of distinct keys, the common
    case that the C planner handles without a dict of the batch's own writes."""
    rng = random.Random(seed)
    if seed % 3:
        pool = [bytes([k]) for k in range(8)]
        keys = [rng.choice(pool) for _ in range(rng.randint(0, 60))]
    else:
        pool = [rng.randbytes(rng.randint(0, 9)) for _ in range(rng.randint(0, 3000))]
        keys = list(dict.fromkeys(pool))
        if seed % 2 and keys:
            keys.append(rng.choice(keys))  # one repeat, after thousands of distinct keys
    values = [None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 12)) for _ in keys]
    state = {k: (None if rng.random() < 0.5 else b"\x01\x00" + rng.randbytes(3)) for k in pool}
    olds = [state[k] for k in keys]
    for ignore_deletes in (False, True):
        expected = changelog.emit(keys, values, olds, b"\x01\x00", changelog.LAST_WRITE_WINS,
                                  ignore_deletes=ignore_deletes, wal_image=False)
        assert changelog.emit_full_rows(keys, values, olds, b"\x01\x00", ignore_deletes) == expected, f"seed {seed}"


def test_full_rows_follow_the_changelog_rules() -> None:
    change_types, rows, keys, values = changelog.emit_full_rows(
        [b"a", b"b", b"a", b"c", b"d"], [b"1", b"2", b"3", None, None],
        [None, b"\x01\x00old", None, b"\x01\x00c", None], b"\x01\x00", False,
    )
    assert change_types == bytes([1, 2, 3, 2, 3, 4])  # +I a, -U/+U b, -U/+U a (sees its own write), -D c
    assert rows == [b"\x01\x001", b"\x01\x00old", b"\x01\x002", b"\x01\x001", b"\x01\x003", b"\x01\x00c"]
    assert keys == [b"a", b"b", b"a", b"c"] and values == [b"\x01\x001", b"\x01\x002", b"\x01\x003", None]


def test_a_wal_image_of_full_rows_reads_old_values_for_deletes_alone() -> None:
    stored = {b"b": b"\x01\x00old", b"c": b"\x01\x00c"}
    read: list[list[bytes]] = []

    def read_old(keys: list[bytes]) -> list[bytes | None]:
        read.append(keys)
        return [stored.get(key) for key in keys]

    change_types, rows, keys, values = changelog.emit_wal_full_rows(
        [b"a", b"b", b"c", b"a", b"d", b"c"], [b"1", b"2", None, None, None, None], b"\x01\x00", False, read_old
    )
    # one read, of each key once: an upsert reads nothing, a delete of a key written in the batch neither
    assert read == [[b"c", b"d"]]
    assert change_types == bytes([3, 3, 4, 4])  # +U a, +U b (new or not), -D c, -D a (its own write)
    assert rows == [b"\x01\x001", b"\x01\x002", b"\x01\x00c", b"\x01\x001"]
    assert keys == [b"a", b"b", b"c", b"a"] and values == [b"\x01\x001", b"\x01\x002", None, None]
    upserts_only = changelog.emit_wal_full_rows([b"a", b"a"], [b"1", b"2"], b"\x01\x00", False, read_old)
    assert upserts_only == (bytes([3, 3]), [b"\x01\x001", b"\x01\x002"], [b"a", b"a"], [b"\x01\x001", b"\x01\x002"])


def test_a_strategy_that_keeps_the_old_row_writes_no_changelog() -> None:
    class KeepOld:
        def merge(self, old: bytes, new: bytes) -> bytes:
            return old

        def delete(self, old: bytes) -> bytes | None:
            return old[:2] + b"kept"

    change_types, rows, keys, values = changelog.emit(
        [b"a", b"b", b"b"], [b"1", b"2", None], [b"\x01\x00a", None, None], b"\x01\x00", KeepOld(),
        ignore_deletes=False, wal_image=False,
    )
    assert change_types == bytes([1, 2, 3])  # a unchanged: nothing; +I b; a delete keeping a row: -U/+U
    assert rows == [b"\x01\x002", b"\x01\x002", b"\x01\x00kept"]
    assert keys == [b"b", b"b"] and values == [b"\x01\x002", b"\x01\x00kept"]


@pytest.mark.parametrize("seed", range(20))
def test_fill_value_batch_in_c_equals_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(0, 50))]
    size = rng.choice([1, 10, 64, 1000, 1 << 20])
    limit = rng.choice([-1, 0, 1, 3, 17, 100])
    native_iter, python_iter = iter(values), iter(values)
    native_next = python_next = None
    while True:
        native_batch = kv_batch.fill_value_batch(native_iter, native_next, size, limit)
        python_batch = kv_batch.fill_value_batch_python(python_iter, python_next, size, limit)
        assert native_batch == python_batch, f"seed {seed}"
        _records, _count, native_next = native_batch
        python_next = python_batch[2]
        if native_next is None:
            break
        limit = -1 if limit < 0 else max(0, limit - native_batch[1])
    assert kv_batch.parse_value_batch(native_batch[0]) is not None


# ---------------------------------------------------------------------------------------------
# One row, one key as Python values (a single lookup's client side)
# ---------------------------------------------------------------------------------------------

PLAIN_TYPES = (BooleanType, TinyIntType, SmallIntType, IntType, BigIntType, FloatType, DoubleType, StringType,
               BytesType)


def random_plain_row_type(rng: random.Random) -> RowType:
    fields = [DataField(f"f{i}", rng.choice(PLAIN_TYPES)().copy(rng.random() < 0.7)) for i in range(rng.randint(1, 10))]
    return RowType(tuple(fields))


def bitwise(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Floats by bit pattern, so NaNs compare equal to themselves."""
    return tuple(struct.pack("<d", v) if isinstance(v, float) else (type(v), v) for v in values)


@pytest.mark.parametrize("seed", range(200))
def test_single_rows_decode_to_the_reference_values(seed):
    rng = random.Random(seed)
    row_type = random_plain_row_type(rng)
    specs = row_batches._row_specs(row_type)
    assert specs is not None
    for _ in range(5):
        row = CompactedRowEncoder(row_type).encode(edge_row(rng, row_type))
        expected = bitwise(CompactedRowDecoder(row_type).decode(row))
        stored = b"\x07\x00" + row
        assert bitwise(native.decode_plain_row(stored, 2, specs)) == expected, f"seed={seed} row={row.hex()}"
        assert bitwise(row_batches.RowReader(row_type).decode(stored, 2)) == expected
        assert bitwise(native.decode_plain_row(bytearray(row), 0, specs)) == expected


@pytest.mark.parametrize("seed", range(100))
def test_malformed_single_rows_raise_like_the_reference(seed):
    rng = random.Random(seed)
    row_type = random_plain_row_type(rng)
    specs = row_batches._row_specs(row_type)
    row = CompactedRowEncoder(row_type).encode(edge_row(rng, row_type))
    for bad in mutations(rng, row):
        assert_same_outcome(
            lambda bad=bad: bitwise(row_batches.RowReader(row_type).decode(b"\x00\x00" + bad, 2)),
            lambda bad=bad: bitwise(CompactedRowDecoder(row_type).decode(bad)),
            f"seed={seed} type={row_type} row={bad.hex()}",
        )
        with contextlib.suppress(ValueError):  # the C decoder only ever raises ValueError
            native.decode_plain_row(bad, 0, specs)


def test_single_rows_of_other_types_or_invalid_text_decode_through_the_reference():
    text = RowType.of(("s", StringType()))
    invalid = b"\x00\x02\xff\xfe"  # no nulls, a 2-byte string that is not UTF-8
    assert row_batches.RowReader(text).decode(invalid) == CompactedRowDecoder(text).decode(invalid)
    with pytest.raises(ValueError):
        native.decode_plain_row(invalid, 0, row_batches._row_specs(text))
    char = RowType.of(("c", CharType(4)), ("i", IntType()))
    assert row_batches._row_specs(char) is None
    row = CompactedRowEncoder(char).encode(("ab", 7))
    assert row_batches.RowReader(char).decode(b"xy" + row, 2) == CompactedRowDecoder(char).decode(row)
    with pytest.raises(ValueError):
        native.decode_plain_row(b"\x00", 5, row_batches._row_specs(text))  # offset past the end


@pytest.mark.parametrize("seed", range(200))
def test_single_keys_encode_to_the_reference_bytes(seed):
    rng = random.Random(seed)
    row_type = random_plain_row_type(rng)
    key_indexes = sorted(rng.sample(range(row_type.field_count), rng.randint(1, row_type.field_count)))
    encoder = CompactedKeyEncoder(row_type, key_indexes)
    specs = row_batches._key_specs(row_type, tuple(key_indexes))
    assert specs is not None
    for _ in range(5):
        row = edge_row(rng, row_type, null_rate=0)
        expected = encoder.encode(row)
        assert native.encode_plain_key([row[i] for i in key_indexes], specs) == expected, f"seed={seed} row={row}"
        assert row_batches.KeyWriter(encoder).encode(row) == expected
        key_values = [row[i] for i in key_indexes]  # a lookup's key alone, in key order
        assert row_batches.KeyWriter(encoder).encode_values(key_values, row_type.field_count) == expected


@pytest.mark.parametrize(("data_type", "value"), [
    (TinyIntType(), 128), (SmallIntType(), -32769), (IntType(), 1 << 31), (BigIntType(), 1 << 63),
    (BigIntType(), 1.5), (IntType(), True), (BooleanType(), 1), (FloatType(), 1e300), (FloatType(), 3),
    (DoubleType(), 2), (StringType(), "\ud800"), (StringType(), b"x"), (BytesType(), "x"),
    (BytesType(), bytearray(b"x")), (BigIntType(), None),
])
def test_key_values_the_c_code_does_not_take_get_the_reference_outcome(data_type, value):
    row_type = RowType.of(("k", data_type))
    encoder = CompactedKeyEncoder(row_type, [0])
    assert_same_outcome(lambda: row_batches.KeyWriter(encoder).encode([value]), lambda: encoder.encode([value]), repr(value))
    assert_same_outcome(lambda: row_batches.KeyWriter(encoder).encode_values([value], 1), lambda: encoder.encode([value]),
                        repr(value))
    with pytest.raises(ValueError):
        native.encode_plain_key([value], row_batches._key_specs(row_type, (0,)))


def test_key_values_of_a_key_the_c_code_does_not_take_are_placed_in_a_full_row_for_the_reference():
    """A key of a second column whose type the C code lacks (CHAR): the reference encoder gets a row with
    the key's values at their columns."""
    row_type = RowType.of(("a", IntType()), ("c", CharType(4)), ("b", BigIntType()))
    encoder = CompactedKeyEncoder(row_type, [1, 2])
    writer = row_batches.KeyWriter(encoder)
    assert writer.encode_values(["ab", 7], 3) == encoder.encode([None, "ab", 7]) == writer.encode([1, "ab", 7])
