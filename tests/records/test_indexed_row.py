"""IndexedRow: hand-derived golden bytes (Java IndexedRowWriter) and seeded round trips."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from strom.records.indexed import IndexedRowDecoder, IndexedRowEncoder
from strom.records.types import (
    BigIntType,
    BinaryType,
    BytesType,
    CharType,
    DecimalType,
    IntType,
    RowType,
    StringType,
    TimestampLtzType,
    TimestampType,
)
from tests.records.row_values import random_row, random_row_type

PEOPLE = RowType.of(("id", IntType(nullable=False)), ("name", StringType()), ("age", BigIntType()))


def test_values_follow_the_variable_length_list():
    encoded = IndexedRowEncoder(PEOPLE).encode([1, "alice", 30])
    assert encoded == bytes.fromhex(
        "00"  # null bits
        "05000000"  # length of the one variable-length field (name)
        "01000000"  # id
        "616c696365"  # "alice"
        "1e00000000000000"  # age
    )
    assert IndexedRowDecoder(PEOPLE).decode(encoded) == (1, "alice", 30)


def test_null_fields_take_no_space_and_leave_the_length_list_zero():
    encoded = IndexedRowEncoder(PEOPLE).encode([-1, None, -2])
    assert encoded == bytes.fromhex("02 00000000 ffffffff feffffffffffffff")
    assert IndexedRowDecoder(PEOPLE).decode(encoded) == (-1, None, -2)


def test_fixed_width_char_binary_and_timestamps():
    rt = RowType.of(
        ("c", CharType(4)),
        ("b", BinaryType(3)),
        ("t", TimestampType(9)),
        ("l", TimestampLtzType(3)),
        ("d", DecimalType(20, 0)),
        ("raw", BytesType()),
    )
    values = ("ab", b"\x01\x00\x00", 1_000_000_001, -5, Decimal(-129), b"\x00")
    encoded = IndexedRowEncoder(rt).encode(list(values))
    assert encoded == bytes.fromhex(
        "00"  # null bits
        "02000000 01000000"  # lengths of the variable fields: d (2 bytes), raw (1 byte)
        "61620000"  # CHAR(4) zero-padded
        "010000"  # BINARY(3) as given
        "e803000000000000 01000000"  # 1000 ms, nano-of-milli 1
        "fbffffffffffffff"  # -5 ms
        "ff7f"  # -129 two's complement
        "00"  # BYTES keep their trailing zero
    )
    assert IndexedRowDecoder(rt).decode(encoded) == values


def test_char_and_binary_longer_than_their_length_are_rejected():
    with pytest.raises(ValueError, match="CHAR"):
        IndexedRowEncoder(RowType.of(("c", CharType(2)))).encode(["abc"])
    with pytest.raises(ValueError, match="BINARY"):
        IndexedRowEncoder(RowType.of(("b", BinaryType(2)))).encode([b"abc"])


def test_truncated_row_raises_value_error():
    with pytest.raises(ValueError):
        IndexedRowDecoder(PEOPLE).decode(bytes.fromhex("00 05000000 01000000 6162"))


@pytest.mark.parametrize("seed", range(300))
def test_random_rows_round_trip(seed):
    rng = random.Random(seed)
    row_type = random_row_type(rng)
    encoder, decoder = IndexedRowEncoder(row_type), IndexedRowDecoder(row_type)
    for _ in range(4):
        values = random_row(rng, row_type)
        assert decoder.decode(encoder.encode(values)) == values, f"seed={seed} type={row_type}"
