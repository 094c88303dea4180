"""ZSTD-compressed Arrow IPC messages made by strom: readable by Arrow as pyarrow's own, for every column type
strom stores, at the table's ZSTD level, from any thread."""

from __future__ import annotations

import datetime
import decimal
import struct
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
import zstandard

from strom.records.arrow_compression import ArrowCompression, compressed_message

ROWS = 300


def _column(kind: str) -> pa.Array:
    every = range(ROWS)
    arrays = {
        "int64": pa.array([i * 7 if i % 5 else None for i in every], pa.int64()),
        "int8": pa.array([i % 100 for i in every], pa.int8()),
        "bool": pa.array([i % 3 == 0 if i % 4 else None for i in every], pa.bool_()),
        "double": pa.array([float(i) / 3 if i % 6 else float("-inf") for i in every], pa.float64()),
        "string": pa.array([f"name-{i}" * (i % 4) if i % 7 else None for i in every], pa.string()),
        "binary": pa.array([bytes([i % 256]) * (i % 9) for i in every], pa.binary()),
        "fixed": pa.array([i.to_bytes(4, "big") for i in every], pa.binary(4)),
        "decimal": pa.array([decimal.Decimal(i) / 100 for i in every], pa.decimal128(10, 2)),
        "date": pa.array([datetime.date(2026, 1, 1) + datetime.timedelta(days=i) for i in every], pa.date32()),
        "timestamp_tz": pa.array([i * 1_000_003 for i in every], pa.timestamp("us", tz="UTC")),
        "list": pa.array([list(range(i % 5)) if i % 8 else None for i in every], pa.list_(pa.int32())),
        "struct": pa.array([{"a": i, "b": str(i)} if i % 9 else None for i in every],
                           pa.struct([("a", pa.int64()), ("b", pa.string())])),
        "map": pa.array([[(str(i), i)] for i in every], pa.map_(pa.string(), pa.int64())),
        "all_null": pa.array([None] * ROWS, pa.int64()),
        "empty_strings": pa.array([""] * ROWS, pa.string()),
    }
    return arrays[kind]


KINDS = ["int64", "int8", "bool", "double", "string", "binary", "fixed", "decimal", "date", "timestamp_tz", "list",
         "struct", "map", "all_null", "empty_strings"]


def read(message: bytes, schema: pa.Schema) -> pa.RecordBatch:
    batch = pa.ipc.read_record_batch(pa.py_buffer(message), schema)
    batch.validate(full=True)
    return batch


def body_compression(message: bytes) -> pa.ipc.Message:
    return pa.ipc.read_message(pa.py_buffer(message))


@pytest.mark.parametrize("kind", KINDS)
def test_every_column_type_reads_back_as_written(kind: str) -> None:
    column = _column(kind)
    batch = pa.record_batch([pa.array(range(ROWS), pa.int64()), column], names=["id", kind])
    message = compressed_message(batch, ArrowCompression("zstd"))
    assert read(message, batch.schema).equals(batch)
    # compressed: smaller than the uncompressed message whenever the column repeats itself
    if kind in ("int8", "empty_strings", "all_null"):
        assert len(message) < len(batch.serialize())


def test_a_slice_and_a_second_shape_of_one_schema_read_back() -> None:
    """The metadata template made for the schema's first batch serves its later batches, whatever their
    length, nulls and offsets."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("tags", pa.list_(pa.string()))])
    first = pa.record_batch([pa.array(range(ROWS)), pa.array([f"n{i}" for i in range(ROWS)]),
                             pa.array([[str(i)] * (i % 3) for i in range(ROWS)])], schema=schema)
    other = pa.record_batch([pa.array([None, *range(1, 2_000)], pa.int64()),
                             pa.array([None if i % 2 else "x" * (i % 50) for i in range(2_000)]),
                             pa.array([None] * 1_000 + [["a", None]] * 1_000, pa.list_(pa.string()))], schema=schema)
    for batch in (first, other, other.slice(333, 1_001), first.slice(1, 1)):
        assert read(compressed_message(batch, ArrowCompression("zstd")), schema).equals(batch)


@pytest.mark.parametrize("level", [1, 3, 9, 19])
def test_each_buffer_is_one_zstd_frame_at_the_tables_level(level: int) -> None:
    ids = pa.array([i // 10 for i in range(5_000)], pa.int64())
    batch = pa.record_batch([ids], names=["id"])
    message = compressed_message(batch, ArrowCompression("zstd", level))
    body = body_compression(message).body
    assert body is not None
    uncompressed_size = struct.unpack_from("<q", body, 0)[0]
    assert uncompressed_size == 5_000 * 8
    values = ids.buffers()[1].to_pybytes()
    # the id column's only non-empty buffer (no validity bitmap): its length, then the frame the level gives
    assert body.to_pybytes()[8:].rstrip(b"\0") == zstandard.ZstdCompressor(level=level).compress(values).rstrip(b"\0")
    assert read(message, batch.schema).equals(batch)


def test_the_metadata_is_what_pyarrows_compressing_writer_writes() -> None:
    """Apart from the buffers' places in the body (the frames differ), the message's metadata is pyarrow's."""
    batch = pa.record_batch([pa.array(range(ROWS), pa.int64()), _column("string"), _column("struct")],
                            names=["id", "name", "nested"])
    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", 3), use_threads=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    reader.read_next_message()
    theirs = reader.read_next_message()
    ours = body_compression(compressed_message(batch, ArrowCompression("zstd", 3)))
    assert (ours.type, ours.metadata_version) == (theirs.type, theirs.metadata_version)
    assert ours.metadata.size == theirs.metadata.size
    # pyarrow reads our body through their metadata's structure: only the buffer entries differ
    assert pa.ipc.read_record_batch(ours, batch.schema).equals(pa.ipc.read_record_batch(theirs, batch.schema))


def test_view_types_go_through_pyarrows_writer() -> None:
    """A string view's variadic buffers do not fit the template's shape: pyarrow's writer compresses it."""
    batch = pa.record_batch([pa.array([f"value-{i}" * 3 for i in range(ROWS)], pa.string_view())], names=["v"])
    assert read(compressed_message(batch, ArrowCompression("zstd")), batch.schema).equals(batch)


def test_lz4_reads_back() -> None:
    batch = pa.record_batch([pa.array(range(ROWS), pa.int64()), _column("string")], names=["id", "name"])
    assert read(compressed_message(batch, ArrowCompression("lz4")), batch.schema).equals(batch)


def test_threads_compress_at_once() -> None:
    """Each thread has its own ZSTD compressor: batches compressed at the same time read back whole."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    batches = [pa.record_batch([pa.array(range(n, n + ROWS)), pa.array([f"{n}-{i}" for i in range(ROWS)])],
                               schema=schema) for n in range(64)]
    with ThreadPoolExecutor(4) as pool:
        messages = list(pool.map(lambda b: compressed_message(b, ArrowCompression("zstd", 5)), batches * 4))
    for batch, message in zip(batches * 4, messages, strict=True):
        assert read(message, schema).equals(batch)


def test_a_tables_options_name_the_compression() -> None:
    assert ArrowCompression.of_table("ZSTD") == ArrowCompression("zstd", 3)
    assert ArrowCompression.of_table("zstd", 9) == ArrowCompression("zstd", 9)
    assert ArrowCompression.of_table("LZ4_FRAME", 9) == ArrowCompression("lz4")
    assert ArrowCompression.of_table("NONE", 9) is None
