"""Body compression of ARROW log batches: the table's codec for batches worth it, none for tiny ones."""

from __future__ import annotations

import pyarrow as pa
import pytest

from strom.records import log_batch
from strom.records.arrow_compression import ArrowCompression

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def batch_of(rows: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(rows), pa.int64()), pa.array(["abcdefgh" * 8] * rows)], schema=SCHEMA)


def read_back(data: bytes) -> pa.RecordBatch:
    ((position, header),) = list(log_batch.iter_batches(data))
    change_types, batch = log_batch.read_arrow(data, position, header, SCHEMA)
    assert change_types is None
    return batch


@pytest.mark.parametrize("codec", [ArrowCompression("zstd"), ArrowCompression("lz4")])
def test_a_tiny_batch_goes_uncompressed_and_a_large_one_compressed(codec: ArrowCompression) -> None:
    small, large = batch_of(10), batch_of(5_000)
    assert small.nbytes < log_batch.COMPRESSION_MIN_BYTES <= large.nbytes
    # an uncompressed message is exactly what Arrow writes without body compression
    assert log_batch.arrow_message(small, codec) == small.serialize().to_pybytes()
    assert len(log_batch.arrow_message(large, codec)) < len(large.serialize().to_pybytes()) / 4
    for batch in (small, large):
        data = log_batch.build_arrow_batch(batch, schema_id=1, compression=codec)
        assert read_back(data).equals(batch)
