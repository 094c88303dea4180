"""Property-based fuzzing of the record batch parsers: ARROW log batches, KV batches, value batches.

* valid batches round-trip (build, then parse) with every compression and change-type layout;
* mutated batches (their CRC recomputed, so the mutation reaches the parser behind it, or left stale)
  raise CorruptRecordError and nothing else; a log batch that ``read_arrow`` accepts is valid Arrow all
  the way down, so readers of the stored log (projection, tiering, clients) cannot crash on it;
* the native KV record parser and value batch parser (``native/rowcodec.c``) agree with the Python
  references: the same records, or the same error with the same message.
"""

from __future__ import annotations

import random
import struct
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz.common import batches_identical
from fuzz.fuzz_kv_batch import fix_crc as fix_kv_crc
from fuzz.fuzz_log_batch import SCHEMA as LOG_SCHEMA
from fuzz.fuzz_log_batch import fix_crc as fix_log_crc
from strom.errors import CorruptRecordError
from strom.records import kv_batch, log_batch, row_batches
from strom.records.arrow_compression import ArrowCompression
from strom.records.compacted import CompactedRowEncoder
from strom.records.types import to_arrow_schema
from tests.fuzz.mutations import (
    FUZZ_SETTINGS,
    STROM_ERRORS,
    assert_clean_error,
    assert_same_outcome,
    mutated,
    outcome,
)
from tests.records.row_values import random_row, random_row_type

pytestmark = pytest.mark.timeout(120)

_NAMES = st.one_of(st.none(), st.text(max_size=12))
_ROWS = st.lists(
    st.tuples(
        st.integers(-(2**31), 2**31 - 1),
        _NAMES,
        st.one_of(st.none(), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)),
        st.one_of(st.none(), st.integers(-(10**10) + 1, 10**10 - 1).map(lambda n: Decimal(n).scaleb(-2))),
        st.one_of(st.none(), st.binary(max_size=12)),
    ),
    max_size=6,
)


def _record_batch(rows: list[tuple]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in LOG_SCHEMA]
    return pa.RecordBatch.from_arrays(
        [pa.array(list(c), type=f.type) for c, f in zip(columns, LOG_SCHEMA, strict=True)], schema=LOG_SCHEMA
    )


@st.composite
def log_batches(draw: st.DrawFn) -> tuple[pa.RecordBatch, bytes | None, bytes]:
    batch = _record_batch(draw(_ROWS))
    change_types = None
    if draw(st.booleans()):
        change_types = bytes(draw(st.lists(st.integers(1, 4), min_size=batch.num_rows, max_size=batch.num_rows)))
    compression = draw(st.sampled_from((None, "zstd", "lz4")))
    return batch, change_types, log_batch.build_arrow_batch(
        batch, schema_id=1, change_types=change_types, compression=compression
    )


def parse_log(data: bytes) -> list[tuple[bytes | None, list[dict]]]:
    """Everything a reader of the log does with a batch: frame it, decode it, read every value, project."""
    parsed = []
    for position, header in log_batch.iter_batches(data):
        change_types, batch = log_batch.read_arrow(data, position, header, LOG_SCHEMA)
        parsed.append((change_types, batch.to_pylist()))
        log_batch.project(data, position, header, LOG_SCHEMA, [1, 0], "zstd")
    return parsed


# ---- log batches ----


@FUZZ_SETTINGS
@given(log_batches())
def test_log_batches_round_trip(case: tuple[pa.RecordBatch, bytes | None, bytes]) -> None:
    batch, change_types, data = case
    ((position, header),) = list(log_batch.iter_batches(data))
    assert (position, header.record_count, header.is_append_only) == (0, batch.num_rows, change_types is None)
    decoded_types, decoded = log_batch.read_arrow(data, position, header, LOG_SCHEMA)
    assert decoded.equals(batch)
    if change_types is not None:
        assert decoded_types == (change_types if batch.num_rows else b"")


@FUZZ_SETTINGS
@given(st.data(), log_batches(), st.booleans())
def test_mutated_log_batches_raise_corrupt_record_error(
    data: st.DataObject, case: tuple[pa.RecordBatch, bytes | None, bytes], fix_crc: bool
) -> None:
    good = case[2]
    bad = data.draw(mutated(good, protected_prefix_size=log_batch.SCHEMA_ID_OFFSET if fix_crc else 0))
    if fix_crc:
        bad = fix_log_crc(bad)
    result = outcome(lambda: parse_log(bad))
    assert_clean_error(result, STROM_ERRORS, f"batch={bad.hex()}")
    assert result[0] == "ok" or issubclass(result[1][0], CorruptRecordError)
    two = outcome(lambda: parse_log(good + bad))  # a bad batch after a good one fails the whole buffer
    assert two[0] == result[0]


def _arrow_with_lying_string_offset() -> bytes:
    """A CRC-correct log batch whose Arrow message frames correctly but whose string offsets point past
    the data buffer: pyarrow's reader accepts it, and reading the values read out of bounds (a segfault,
    found by the batch fuzzer)."""
    batch = pa.RecordBatch.from_pydict(
        {"id": [1, 2], "name": ["a", "bcd"], "tags": [None, None], "price": [None, None], "raw": [None, None]},
        schema=LOG_SCHEMA,
    )
    data = bytearray(log_batch.build_arrow_batch(batch, schema_id=1))
    offsets = struct.pack("<iii", 0, 1, 4)
    index = data.index(offsets)
    struct.pack_into("<i", data, index + 8, 1 << 30)
    return fix_log_crc(bytes(data))


def test_arrow_offsets_outside_their_buffer_are_corrupt_record_not_a_segfault() -> None:
    data = _arrow_with_lying_string_offset()
    ((position, header),) = list(log_batch.iter_batches(data))
    with pytest.raises(CorruptRecordError, match="no valid Arrow data"):
        log_batch.read_arrow(data, position, header, LOG_SCHEMA)


def test_an_arrow_end_of_stream_marker_as_the_body_is_corrupt_record_not_eof_error() -> None:
    """Found by the atheris log-batch target: pyarrow raises EOFError for a body that is an IPC
    end-of-stream marker, which reached ProduceLog's caller as an unknown server error."""
    data = log_batch.build_batch(
        schema_id=1, record_count=1, records=b"\xff\xff\xff\xff\x00\x00\x00\x00", append_only=True
    )
    ((position, header),) = list(log_batch.iter_batches(data))
    with pytest.raises(CorruptRecordError, match="End of Arrow stream"):
        log_batch.read_arrow(data, position, header, LOG_SCHEMA)


def test_time_values_beyond_one_day_still_read_back() -> None:
    """Full Arrow validation rejects TIMEs outside [0, 1 day); strom's own changelog may hold them (a
    CompactedRow TIME is any int32 of millis), so the KV replay and clients must still read them."""
    schema = pa.schema(
        [
            ("t", pa.time32("ms")),
            ("l", pa.list_(pa.time64("us"))),
            ("m", pa.map_(pa.int32(), pa.time64("ns"))),
            ("s", pa.struct([("a", pa.time32("s")), ("b", pa.string())])),
        ]
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([86_400_000 * 5, -1], pa.time32("ms")),
            pa.array([[10**12], None], pa.list_(pa.time64("us"))),
            pa.array([[(1, 10**15)], []], pa.map_(pa.int32(), pa.time64("ns"))),
            pa.array([{"a": 10**6, "b": "x"}, None], schema.field("s").type),
        ],
        schema=schema,
    )
    data = log_batch.build_arrow_batch(batch, schema_id=1, change_types=b"\x01\x03")
    ((position, header),) = list(log_batch.iter_batches(data))
    change_types, decoded = log_batch.read_arrow(data, position, header, schema)
    assert (change_types, decoded.equals(batch)) == (b"\x01\x03", True)


@FUZZ_SETTINGS
@given(st.randoms(use_true_random=False))
def test_changelog_batches_of_every_fluss_type_round_trip(rng: random.Random) -> None:
    """What the KV tablet writes (rows decoded to Arrow) reads back through the validating reader."""
    row_type = random_row_type(rng, depth_max=2)
    encoder = CompactedRowEncoder(row_type)
    rows = [encoder.encode(random_row(rng, row_type)) for _ in range(rng.randint(1, 4))]
    batch = row_batches.decode_rows(rows, row_type)
    data = log_batch.build_arrow_batch(batch, schema_id=1, change_types=b"\x01" * batch.num_rows)
    ((position, header),) = list(log_batch.iter_batches(data))
    _change_types, decoded = log_batch.read_arrow(data, position, header, to_arrow_schema(row_type))
    assert batches_identical(decoded, batch), f"type={row_type}"


def test_compressed_arrow_claiming_a_huge_uncompressed_size_is_corrupt_record() -> None:
    """The fuzzer's ArrowMemoryError: an lz4/zstd body whose declared size cannot be allocated."""
    batch = _record_batch([(i, "x" * 40, [1], None, b"y" * 40) for i in range(200)])
    assert batch.nbytes >= log_batch.COMPRESSION_MIN_BYTES  # so its body is compressed
    data = bytearray(log_batch.build_arrow_batch(batch, schema_id=1, compression=ArrowCompression("zstd")))
    # each compressed buffer starts with its uncompressed length (int64); make the strings' and bytes' lie
    packed = struct.pack("<q", 200 * 40)
    index = data.find(packed, log_batch.HEADER_SIZE_BYTES)
    assert index >= 0
    while index >= 0:
        struct.pack_into("<q", data, index, 0x6000000000000000)
        index = data.find(packed, index + 8)
    data = bytearray(fix_log_crc(bytes(data)))
    result = outcome(lambda: parse_log(bytes(data)))
    assert result[0] != "ok" and issubclass(result[1][0], CorruptRecordError), result


# ---- kv batches ----

_KEYS = st.binary(min_size=0, max_size=150)
_VALUES = st.one_of(st.none(), st.binary(min_size=1, max_size=300))


@st.composite
def kv_batches(draw: st.DrawFn) -> tuple[list[bytes], list[bytes | None], bytes]:
    records = draw(st.lists(st.tuples(_KEYS, _VALUES), max_size=6))
    keys = [k for k, _ in records]
    values = [v for _, v in records]
    return keys, values, kv_batch.build_kv_batch(
        draw(st.integers(0, 2**15 - 1)), keys, values, writer_id=draw(st.integers(-1, 2**40)), batch_sequence=7
    )


def _parse_records_both(data: bytes, context: str) -> None:
    """The native record parser against the Python reference, over the body of a (maybe bad) batch."""
    if len(data) < kv_batch.KV_HEADER_SIZE_BYTES:
        return
    (count,) = struct.unpack_from("<i", data, 24)
    view = memoryview(data)
    for end in {len(data), max(kv_batch.KV_HEADER_SIZE_BYTES, len(data) - 1)}:
        fast = outcome(lambda end=end: kv_batch.parse_kv_records(view, kv_batch.KV_HEADER_SIZE_BYTES, end, count))
        reference = outcome(
            lambda end=end: kv_batch._parse_records_python(view, kv_batch.KV_HEADER_SIZE_BYTES, end, count)
        )
        assert_clean_error(fast, STROM_ERRORS, context)
        assert_same_outcome(fast, reference, context)


@FUZZ_SETTINGS
@given(kv_batches())
def test_kv_batches_round_trip(case: tuple[list[bytes], list[bytes | None], bytes]) -> None:
    keys, values, data = case
    (batch,) = kv_batch.parse_kv_batches(data)
    assert batch.keys == keys
    assert batch.values == values
    assert (batch.batch_sequence, kv_batch.parse_kv_batches(data + data)[1].keys) == (7, keys)
    _parse_records_both(data, f"batch={data.hex()}")


@FUZZ_SETTINGS
@given(st.data(), kv_batches(), st.booleans())
@example(data=None, case=([], [], bytes.fromhex("18000000" "00" "00000000" "0100" "00" + "ff" * 8 + "07000000" + "ffffff7f")), fix_crc=True).via("count 2**31-1 with no records")
def test_mutated_kv_batches_raise_corrupt_record_error_alike_in_c_and_python(
    data: st.DataObject | None, case: tuple[list[bytes], list[bytes | None], bytes], fix_crc: bool
) -> None:
    bad = case[2] if data is None else data.draw(mutated(case[2], protected_prefix_size=9 if fix_crc else 0))
    if fix_crc:
        bad = fix_kv_crc(bad)
    context = f"batch={bad.hex()}"
    assert_clean_error(outcome(lambda: kv_batch.parse_kv_batches(bad)), STROM_ERRORS, context)
    _parse_records_both(bad, context)


# ---- value batches (LimitScan / ScanKv responses) ----


def _parse_value_batch_python(data: bytes) -> list[bytes]:
    saved = kv_batch.native
    kv_batch.native = None
    try:
        return kv_batch.parse_value_batch(data)
    finally:
        kv_batch.native = saved


@FUZZ_SETTINGS
@given(st.data(), st.lists(st.binary(max_size=40), max_size=6))
@example(data=None, values=[]).via("value batch with a negative length: the same error in C and Python")
def test_value_batches_round_trip_and_mutations_agree_in_c_and_python(
    data: st.DataObject | None, values: list[bytes]
) -> None:
    good = kv_batch.build_value_batch(values)
    assert kv_batch.parse_value_batch(good) == values
    assert _parse_value_batch_python(good) == values
    # the regression: length 0xeb000009 (negative) made the Python path report a different error
    bad = bytes.fromhex("090000eb0b0133000000000000") if data is None else data.draw(mutated(good))
    fast = outcome(lambda: kv_batch.parse_value_batch(bad))
    reference = outcome(lambda: _parse_value_batch_python(bad))
    assert_clean_error(fast, STROM_ERRORS, f"batch={bad.hex()}")
    assert_same_outcome(fast, reference, f"batch={bad.hex()}")


def test_a_hostile_value_record_count_allocates_nothing_and_fails_cleanly() -> None:
    bad = struct.pack("<ibi", 5, 0, 2**31 - 1)
    with pytest.raises(CorruptRecordError, match="claims 2147483647 records but ends after 0"):
        kv_batch.parse_value_batch(bad)
    with pytest.raises(CorruptRecordError, match="claims 2147483647 records but ends after 0"):
        _parse_value_batch_python(bad)
