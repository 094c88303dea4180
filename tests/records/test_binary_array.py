"""BinaryArray / BinaryMap golden bytes, derived by hand from Java's BinaryArrayWriter.

Each case is a one-column CompactedRow: null bitset byte 00, varint byte length, then the
container. Words are written little-endian; comments name each 4- or 8-byte word.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from strom.records.binary_array import header_size, round_to_word, slot_size
from strom.records.compacted import CompactedRowDecoder, CompactedRowEncoder
from strom.records.indexed import IndexedRowDecoder, IndexedRowEncoder
from strom.records.types import (
    ArrayType,
    BigIntType,
    BooleanType,
    DataType,
    DecimalType,
    DoubleType,
    IntType,
    MapType,
    RowType,
    SmallIntType,
    StringType,
    TimestampType,
    TimeType,
)


def _one_column(t: DataType) -> RowType:
    return RowType.of(("c", t))


def _container(hex_words: str) -> bytes:
    body = bytes.fromhex(hex_words)
    assert len(body) < 128  # one-byte varint length
    return bytes([0, len(body)]) + body


def _check(t: DataType, value: object, hex_words: str, **encoder_options: bool) -> None:
    expected = _container(hex_words)
    assert CompactedRowEncoder(_one_column(t), **encoder_options).encode([value]) == expected
    assert CompactedRowDecoder(_one_column(t)).decode(expected) == (value,)


def test_header_and_slot_arithmetic():
    assert [header_size(n) for n in (0, 1, 32, 33, 64, 65)] == [4, 8, 8, 12, 12, 16]
    assert [round_to_word(n) for n in (0, 1, 8, 9)] == [0, 8, 8, 16]
    widths = [BooleanType(), SmallIntType(), IntType(), TimeType(9), BigIntType(), StringType()]
    assert [slot_size(t) for t in widths] == [1, 2, 4, 4, 8, 8]


def test_empty_array_is_one_word():
    _check(ArrayType(BigIntType()), [], "00000000 00000000")  # count 0 | padding


def test_int_array_with_null():
    _check(
        ArrayType(IntType()),
        [1, None, 3],
        "03000000"  # count 3
        "02000000"  # null bits: element 1
        "01000000 00000000 03000000"  # slots 0..2 (the null slot stays zero)
        "00000000",  # pad the fixed part to 24 bytes
    )


def test_strings_up_to_seven_bytes_are_inline():
    _check(
        ArrayType(StringType()),
        ["hi", "hello world!", None, "1234567"],
        "04000000"  # count 4
        "04000000"  # null bits: element 2
        "6869000000000082"  # "hi" inline, byte 7 = 0x80 | 2
        "0c00000028000000"  # 12 bytes at offset 40: (40 << 32) | 12
        "0000000000000000"  # null
        "3132333435363787"  # "1234567" inline, 0x80 | 7
        "68656c6c6f20776f726c6421 00000000",  # "hello world!" padded to 16
    )


def test_high_precision_timestamp_keeps_millis_outside_the_slot():
    _check(
        ArrayType(TimestampType(6)),
        [1_000_001],  # 1000 ms + 1 us
        "01000000 00000000"  # count 1 | null bits
        "e803000010000000"  # (offset 16 << 32) | nano-of-milli 1000
        "e803000000000000",  # epoch millis 1000
    )


def test_big_decimal_reserves_16_bytes_in_java_layout_and_a_word_in_rust_layout():
    t = ArrayType(DecimalType(20, 2))
    _check(
        t,
        [Decimal("1.00")],
        "01000000 00000000"  # count 1 | null bits
        "0100000010000000"  # (offset 16 << 32) | 1 byte
        "6400000000000000 0000000000000000",  # unscaled 100, 16 bytes reserved
        java_decimal_layout=True,
    )
    _check(t, [Decimal("1.00")], "01000000 00000000 0100000010000000 6400000000000000")


def test_compact_decimal_and_double_sit_in_their_slots():
    _check(
        ArrayType(DecimalType(10, 2)),
        [Decimal("-0.01")],
        "01000000 00000000 ffffffffffffffff",  # unscaled -1 as i64
    )
    _check(ArrayType(DoubleType()), [1.0], "01000000 00000000 000000000000f03f")


def test_row_elements_are_compacted_rows():
    _check(
        ArrayType(RowType.of(("x", IntType()), ("s", StringType()))),
        [{"x": 5, "s": "ab"}],
        "01000000 00000000"  # count 1 | null bits
        "0500000010000000"  # 5 bytes at offset 16
        "0005026162 000000",  # CompactedRow: no nulls, varint 5, "ab"; padded
    )


def test_nested_array_is_a_whole_binary_array():
    _check(
        ArrayType(ArrayType(SmallIntType())),
        [[7]],
        "01000000 00000000"  # outer count 1 | null bits
        "1000000010000000"  # 16 bytes at offset 16
        "01000000 00000000 0700 000000000000",  # inner: count | nulls | 7 | pad
    )


def test_map_is_key_array_size_then_both_arrays():
    _check(
        MapType(StringType(), IntType()),
        [("a", 1), ("b", None)],
        "18000000"  # key array is 24 bytes
        "02000000 00000000 6100000000000081 6200000000000081"  # keys "a", "b" inline
        "02000000 02000000 01000000 00000000",  # values 1, null
    )


def test_empty_map():
    _check(MapType(IntType(), IntType()), [], "08000000 00000000 00000000 00000000 00000000")


def test_boolean_array_with_33_elements_has_a_two_word_bitset():
    values = [True] * 32 + [None]
    _check(
        ArrayType(BooleanType()),
        values,
        "21000000"  # count 33
        "00000000 01000000"  # null bits: element 32
        + "01" * 32
        + "00"  # the null element's slot
        + "000000",  # fixed part 12 + 33 = 45, padded to 48
    )


def test_indexed_rows_nest_indexed_rows_in_arrays():
    t = _one_column(ArrayType(RowType.of(("x", IntType()), ("s", StringType()))))
    encoded = IndexedRowEncoder(t).encode([[{"x": 5, "s": "ab"}]])
    assert encoded == bytes.fromhex(
        "00 20000000"  # null bits | length of the only variable field: 32
        "01000000 00000000 0b00000010000000"  # count | nulls | 11 bytes at offset 16
        "00 02000000 05000000 6162 0000000000"  # IndexedRow: nulls | len("ab") | 5 | "ab" | pad
    )
    assert IndexedRowDecoder(t).decode(encoded) == ([{"x": 5, "s": "ab"}],)


@pytest.mark.parametrize("corrupt", ["ffffffff 00000000", "05000000 00000000"])
def test_corrupt_array_header_raises(corrupt):
    with pytest.raises(ValueError):
        CompactedRowDecoder(_one_column(ArrayType(IntType()))).decode(_container(corrupt))
