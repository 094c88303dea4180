"""CompactedRow and compacted keys: golden bytes from the wire, and seeded round trips."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from strom.records.compacted import (
    CompactedKeyEncoder,
    CompactedRowDecoder,
    CompactedRowEncoder,
    field_spans,
    merge_partial,
    null_out,
)
from strom.records.types import (
    ArrayType,
    BigIntType,
    DecimalType,
    IntType,
    MapType,
    RowType,
    StringType,
    TimestampLtzType,
    TimestampType,
    TimeType,
)
from tests.records.row_values import random_row, random_row_type

# The table of the research doc's PutKv capture: id is the primary key.
PEOPLE = RowType.of(("id", IntType(nullable=False)), ("name", StringType()), ("age", BigIntType()))


def test_upsert_sample_from_the_wire_decodes_and_reencodes():
    # value bytes of the captured PutKv record {id:1, name:"alice", age:30}
    wire = bytes.fromhex("00 01 05 616c696365 1e")
    assert CompactedRowDecoder(PEOPLE).decode(wire) == (1, "alice", 30)
    assert CompactedRowEncoder(PEOPLE).encode([1, "alice", 30]) == wire


def test_lookup_value_sample_decodes_negative_numbers_and_null():
    # Lookup of key ff ff ff ff 0f returned "01 00 | 02 ff ff ff ff 0f fe ff ff ff ff ff ff ff ff 01":
    # schema id 1, then null bits 0x02 (name null), id = -1 (5-byte varint), age = -2 (10 bytes).
    row = bytes.fromhex("02 ffffffff0f feffffffffffffffff01")
    assert CompactedRowDecoder(PEOPLE).decode(row) == (-1, None, -2)
    assert CompactedRowEncoder(PEOPLE).encode([-1, None, -2]) == row


def test_key_encoding_matches_captured_keys():
    assert CompactedKeyEncoder(PEOPLE, [0]).encode([-1, "x", 5]) == bytes.fromhex("ff ff ff ff 0f")
    composite = RowType.of(("k", IntType(nullable=False)), ("s", StringType(nullable=False)))
    assert CompactedKeyEncoder(composite, [0, 1]).encode([977, "k1"]) == bytes.fromhex("d1 07 02 6b 31")
    assert CompactedKeyEncoder(composite, [0, 1]).encode_key([977, "k1"]) == bytes.fromhex("d1 07 02 6b 31")


def test_key_encoder_rejects_null_keys_and_map_columns():
    with pytest.raises(ValueError, match="null key"):
        CompactedKeyEncoder(PEOPLE, [1]).encode([1, None, 3])
    with_map = RowType.of(("m", MapType(IntType(), IntType())))
    with pytest.raises(TypeError, match="cannot be a key"):
        CompactedKeyEncoder(with_map, [0])


def test_prefix_key_is_a_byte_prefix_of_the_full_key():
    rt = RowType.of(("a", StringType()), ("b", BigIntType()), ("c", StringType()))
    full = CompactedKeyEncoder(rt, [0, 1, 2]).encode(["tenant-7", 12, "z"])
    prefix = CompactedKeyEncoder(rt, [0, 1]).encode(["tenant-7", 12, "z"])
    assert full.startswith(prefix) and len(prefix) < len(full)


def test_high_precision_timestamps_write_millis_then_nano_of_milli():
    rt = RowType.of(("t9", TimestampType(9)), ("t3", TimestampLtzType(3)), ("t6", TimestampType(6)))
    # -1 ns = millis -1 (10-byte varint) + nano-of-milli 999999 (3-byte varint: 3f 42 0f)
    # 1 ms = varint 01; 1001 us = millis 1 + nano-of-milli 1000 (e8 07)
    encoded = CompactedRowEncoder(rt).encode([-1, 1, 1001])
    assert encoded == bytes.fromhex("00 ffffffffffffffffff01 bf843d 01 01 e807")
    assert CompactedRowDecoder(rt).decode(encoded) == (-1, 1, 1001)


def test_decimals_switch_to_big_endian_bytes_above_precision_18():
    rt = RowType.of(("small", DecimalType(18, 2)), ("big", DecimalType(19, 2)))
    # small: unscaled -1 as a 10-byte varint; big: length 1, byte 0x80 (-128 two's complement)
    encoded = CompactedRowEncoder(rt).encode([Decimal("-0.01"), Decimal("-1.28")])
    assert encoded == bytes.fromhex("00 ffffffffffffffffff01 01 80")
    assert CompactedRowDecoder(rt).decode(encoded) == (Decimal("-0.01"), Decimal("-1.28"))


def test_time_is_stored_as_millis_of_day_and_returned_in_the_arrow_unit():
    rt = RowType.of(("s", TimeType(0)), ("ns", TimeType(9)))
    encoded = CompactedRowEncoder(rt).encode([1, 2_000_000])
    assert encoded == bytes.fromhex("00 e807 02")  # 1000 ms, 2 ms
    assert CompactedRowDecoder(rt).decode(encoded) == (1, 2_000_000)


def test_not_null_field_is_read_even_if_its_null_bit_is_set():
    # Both Fluss readers skip the bit check for NOT NULL fields.
    assert CompactedRowDecoder(PEOPLE).decode(bytes.fromhex("03 05 1e")) == (5, None, 30)


def test_encoder_rejects_null_in_not_null_field_and_wrong_arity():
    encoder = CompactedRowEncoder(PEOPLE)
    with pytest.raises(ValueError, match="NOT NULL"):
        encoder.encode([None, "a", 1])
    with pytest.raises(ValueError, match="2 values for 3 fields"):
        encoder.encode([1, "a"])
    with pytest.raises(ValueError, match="32-bit"):
        encoder.encode([2**31, "a", 1])


def test_truncated_row_raises_value_error():
    with pytest.raises(ValueError, match="truncated"):
        CompactedRowDecoder(PEOPLE).decode(bytes.fromhex("00 01 05 6162"))


@pytest.mark.parametrize("seed", range(300))
def test_random_rows_round_trip(seed):
    rng = random.Random(seed)
    row_type = random_row_type(rng)
    encoder, decoder = CompactedRowEncoder(row_type), CompactedRowDecoder(row_type)
    for _ in range(4):
        values = random_row(rng, row_type)
        encoded = encoder.encode(values)
        assert decoder.decode(encoded) == values, f"seed={seed} type={row_type}"
        assert decoder.decode(memoryview(encoded)) == values, f"seed={seed}"
        spans = field_spans(row_type, encoded)
        assert [s is None for s in spans] == [v is None for v in values], f"seed={seed}"
        assert max((s[1] for s in spans if s), default=0) <= len(encoded)


@pytest.mark.parametrize("seed", range(100))
def test_java_and_rust_decimal_layouts_both_decode(seed):
    rng = random.Random(seed)
    row_type = random_row_type(rng)
    java = CompactedRowEncoder(row_type, java_decimal_layout=True)
    decoder = CompactedRowDecoder(row_type)
    values = random_row(rng, row_type)
    assert decoder.decode(java.encode(values)) == values, f"seed={seed} type={row_type}"
    if "DECIMAL(19" not in str(row_type) and "DECIMAL(38" not in str(row_type):
        assert java.encode(values) == CompactedRowEncoder(row_type).encode(values), f"seed={seed}"


# ---------------------------------------------------------------------------------------
# Partial update at byte level
# ---------------------------------------------------------------------------------------

RICH = RowType.of(
    ("id", IntType(nullable=False)),
    ("name", StringType()),
    ("tags", ArrayType(StringType())),
    ("attrs", MapType(StringType(), RowType.of(("x", IntType()), ("y", DecimalType(20, 3))))),
    ("score", BigIntType()),
)


def test_merge_partial_takes_targets_from_new_and_the_rest_from_old():
    encoder, decoder = CompactedRowEncoder(RICH), CompactedRowDecoder(RICH)
    old = encoder.encode([7, "old", ["a", "bbbbbbbbbbb"], [("k", {"x": 1, "y": Decimal("1.500")})], 10])
    new = encoder.encode([7, None, ["c"], None, 99])
    merged = merge_partial(RICH, old, new, [0, 2, 4])
    assert decoder.decode(merged) == (7, "old", ["c"], [("k", {"x": 1, "y": Decimal("1.500")})], 99)
    assert merged == encoder.encode([7, "old", ["c"], [("k", {"x": 1, "y": Decimal("1.500")})], 99])


def test_null_out_nulls_targets_and_deletes_when_nothing_remains():
    encoder, decoder = CompactedRowEncoder(RICH), CompactedRowDecoder(RICH)
    old = encoder.encode([7, "n", None, None, 5])
    kept = null_out(RICH, old, target_indexes=[0, 4], primary_key_indexes=[0])
    assert kept is not None and decoder.decode(kept) == (7, "n", None, None, None)
    assert null_out(RICH, old, target_indexes=[0, 1, 4], primary_key_indexes=[0]) is None


def test_null_out_refuses_not_null_columns():
    rt = RowType.of(("id", IntType(nullable=False)), ("v", IntType(nullable=False)))
    with pytest.raises(ValueError, match="NOT NULL"):
        null_out(rt, CompactedRowEncoder(rt).encode([1, 2]), [0, 1], [0])


@pytest.mark.parametrize("seed", range(100))
def test_random_partial_merges_equal_field_wise_merges(seed):
    rng = random.Random(seed)
    row_type = random_row_type(rng)
    encoder, decoder = CompactedRowEncoder(row_type), CompactedRowDecoder(row_type)
    old, new = random_row(rng, row_type), random_row(rng, row_type)
    targets = {i for i in range(row_type.field_count) if rng.random() < 0.5}
    merged = merge_partial(row_type, encoder.encode(old), encoder.encode(new), targets)
    expected = tuple(new[i] if i in targets else old[i] for i in range(row_type.field_count))
    assert decoder.decode(merged) == expected, f"seed={seed} targets={targets}"
    assert merged == encoder.encode(expected), f"seed={seed}"

    keys = {0}
    targets = {i for i in targets if row_type.fields[i].type.nullable}
    remaining = null_out(row_type, encoder.encode(old), targets | keys, keys)
    nulled = tuple(None if (i in targets and i not in keys) else v for i, v in enumerate(old))
    if all(v is None for i, v in enumerate(nulled) if i not in keys):
        assert remaining is None, f"seed={seed}"
    else:
        assert remaining is not None and decoder.decode(remaining) == nulled, f"seed={seed}"


def test_decode_columns_transposes_rows_and_rejects_truncation():
    encoder, decoder = CompactedRowEncoder(PEOPLE), CompactedRowDecoder(PEOPLE)
    rows = [encoder.encode([1, "a", None]), memoryview(encoder.encode([2, None, 7]))]
    assert decoder.decode_columns(rows) == [[1, 2], ["a", None], [None, 7]]
    assert decoder.decode_columns([]) == [[], [], []]
    with pytest.raises(ValueError, match="truncated"):
        decoder.decode_columns([bytes.fromhex("00 01 05 6162")])
