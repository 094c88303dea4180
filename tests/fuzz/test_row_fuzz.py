"""Property-based fuzzing of the row codecs: CompactedRow (C and Python decoders), IndexedRow, BinaryArray.

Properties, over random schemas (every Fluss type, nested up to two levels) and random values:

* encode then decode gives the values back (CompactedRow, IndexedRow, BinaryArray/BinaryMap);
* any mutation of an encoded row (bit flips, truncation, insertion, length-field lies) either decodes or
  raises ValueError, the decoders' documented error (the server turns it into MalformedRowError), never
  IndexError, struct.error, OverflowError, SystemError or a crash;
* the native batch decoder (``row_batches.decode_rows``, ``native/rowcodec.c``) and the Python reference give
  the same batch, or raise the same error with the same message, for valid and mutated rows alike.
"""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strom.records import row_arrow, row_batches
from strom.records.binary_array import array_codec, map_codec
from strom.records.compacted import _RUST_NESTING, CompactedRowDecoder, CompactedRowEncoder, field_spans
from strom.records.indexed import IndexedRowDecoder, IndexedRowEncoder
from strom.records.types import ArrayType, MapType, RowType, TimestampType, to_arrow_schema
from tests.fuzz.mutations import (
    FUZZ_SETTINGS,
    ROW_ERRORS,
    assert_clean_error,
    assert_same_outcome,
    mutated,
    outcome,
)
from tests.records.row_values import random_row, random_row_type, random_type, random_value

pytestmark = pytest.mark.timeout(120)


@st.composite
def schema_and_rows(draw: st.DrawFn) -> tuple[RowType, list[tuple]]:
    rng: random.Random = draw(st.randoms(use_true_random=False))
    row_type = random_row_type(rng, depth_max=2)
    rows = [random_row(rng, row_type) for _ in range(draw(st.integers(1, 4)))]
    return row_type, rows


def _decode_both(rows: list[bytes], row_type: RowType, offset: int = 0) -> None:
    context = f"type={row_type} offset={offset} rows={[r.hex() for r in rows]}"
    fast = outcome(lambda: row_batches.decode_rows(rows, row_type, offset=offset))
    reference = outcome(lambda: row_batches.decode_rows_python(rows, row_type, offset=offset))
    assert_clean_error(fast, ROW_ERRORS, context)
    assert_same_outcome(fast, reference, context)
    if row_batches.native is not None:  # the C decoder alone: ValueError or columns, never a crash
        plan = row_batches._plan(row_type)
        if plan is not None:
            with contextlib.suppress(ValueError):
                row_batches.native.decode_columns(rows, offset, plan.specs)


# ---- round trips ----


@FUZZ_SETTINGS
@given(schema_and_rows())
def test_compacted_rows_round_trip_through_both_decoders(case: tuple[RowType, list[tuple]]) -> None:
    row_type, rows = case
    encoder, decoder = CompactedRowEncoder(row_type), CompactedRowDecoder(row_type)
    encoded = [encoder.encode(values) for values in rows]
    for values, data in zip(rows, encoded, strict=True):
        assert decoder.decode(data) == values, f"type={row_type}"
        spans = field_spans(row_type, data)
        assert [s is None for s in spans] == [v is None for v in values]
    reference = row_batches.decode_rows_python(encoded, row_type)
    assert_same_outcome(("ok", row_batches.decode_rows(encoded, row_type)), ("ok", reference), f"type={row_type}")
    prefixed = [b"\x01\x00" + data for data in encoded]  # stored values: schema id, then the row
    _decode_both(prefixed, row_type, offset=2)


@FUZZ_SETTINGS
@given(schema_and_rows())
def test_indexed_rows_round_trip(case: tuple[RowType, list[tuple]]) -> None:
    row_type, rows = case
    encoder, decoder = IndexedRowEncoder(row_type), IndexedRowDecoder(row_type)
    for values in rows:
        assert decoder.decode(encoder.encode(values)) == values, f"type={row_type}"


@FUZZ_SETTINGS
@given(st.randoms(use_true_random=False), st.booleans())
def test_binary_arrays_and_maps_round_trip(rng: random.Random, as_map: bool) -> None:
    if as_map:
        t = MapType(random_type(rng, 1, 3), random_type(rng, 1, 3))
        codec = map_codec(t.key, t.value, _RUST_NESTING)
    else:
        t = ArrayType(random_type(rng, 1, 3))
        codec = array_codec(t.element, _RUST_NESTING)
    value = random_value(rng, t.copy(False))
    data = codec.encode(value)
    assert codec.decode(data, 0, len(data)) == value, f"type={t}"


# ---- mutated input ----


@FUZZ_SETTINGS
@given(st.data(), schema_and_rows())
def test_mutated_compacted_rows_raise_value_error_alike_in_c_and_python(
    data: st.DataObject, case: tuple[RowType, list[tuple]]
) -> None:
    row_type, rows = case
    encoder, decoder = CompactedRowEncoder(row_type), CompactedRowDecoder(row_type)
    bad = [data.draw(mutated(encoder.encode(values))) for values in rows]
    for row in bad:
        context = f"type={row_type} row={row.hex()}"
        assert_clean_error(outcome(lambda row=row: decoder.decode(row)), ROW_ERRORS, context)
        assert_clean_error(outcome(lambda row=row: field_spans(row_type, row)), ROW_ERRORS, context)
    _decode_both(bad, row_type)
    _decode_both([b"\x00\x00" + row for row in bad], row_type, offset=2)


@FUZZ_SETTINGS
@given(st.data(), schema_and_rows())
def test_mutated_indexed_rows_raise_value_error(data: st.DataObject, case: tuple[RowType, list[tuple]]) -> None:
    row_type, rows = case
    encoder, decoder = IndexedRowEncoder(row_type), IndexedRowDecoder(row_type)
    bad = [data.draw(mutated(encoder.encode(values))) for values in rows]
    for row in bad:
        assert_clean_error(outcome(lambda row=row: decoder.decode(row)), ROW_ERRORS, f"type={row_type} row={row.hex()}")
    batch = outcome(lambda: row_arrow.rows_to_record_batch(bad, decoder, to_arrow_schema(row_type)))
    assert_clean_error(batch, ROW_ERRORS, f"type={row_type} rows={[r.hex() for r in bad]}")


@FUZZ_SETTINGS
@given(st.data(), st.randoms(use_true_random=False), st.booleans())
def test_mutated_binary_arrays_and_maps_raise_value_error(
    data: st.DataObject, rng: random.Random, as_map: bool
) -> None:
    if as_map:
        t = MapType(random_type(rng, 1, 3), random_type(rng, 1, 3))
        codec = map_codec(t.key, t.value, _RUST_NESTING)
    else:
        t = ArrayType(random_type(rng, 1, 3))
        codec = array_codec(t.element, _RUST_NESTING)
    bad = data.draw(mutated(codec.encode(random_value(rng, t.copy(False)))))
    # the codecs are called inside a row decoder, which turns IndexError and struct.error into ValueError
    row_type = RowType.of(("f0", t))
    compacted_row = b"\x00" + _uvarint(len(bad)) + bad
    indexed_row = b"\x00" + len(bad).to_bytes(4, "little") + bad
    context = f"type={t} value={bad.hex()}"
    assert_clean_error(outcome(lambda: CompactedRowDecoder(row_type).decode(compacted_row)), ROW_ERRORS, context)
    assert_clean_error(outcome(lambda: IndexedRowDecoder(row_type).decode(indexed_row)), ROW_ERRORS, context)
    _decode_both([compacted_row], row_type)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# ---- regressions found by the fuzzers ----


def test_a_timestamp_beyond_the_arrow_range_is_a_value_error_not_overflow_error() -> None:
    """TIMESTAMP(4) millis near int64's limit times 1000 overflowed pyarrow's int64: OverflowError escaped
    ``rows_to_record_batch`` (and MalformedRowError at the server) in both the C and the Python path."""
    row_type = RowType.of(("f0", TimestampType(4)))
    row = bytes.fromhex("008ea2b7bce9b8a05ef63494a4dd29b0a219")
    with pytest.raises(ValueError, match="does not fit"):
        row_batches.decode_rows_python([row], row_type)
    with pytest.raises(ValueError, match="does not fit"):
        row_batches.decode_rows([row], row_type)
    _decode_both([row], row_type)
