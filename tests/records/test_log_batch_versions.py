"""Log batches of magic V1 (statistics) and V2 (statistics and the leader's epoch), checked against the
layout of Fluss's ``LogRecordBatchFormat`` written out field by field here, independently of the builder:

    V1: base_offset i64 | length i32 | magic i8 | commit_timestamp i64 | crc u32 | schema_id i16 |
        attributes i8 | last_offset_delta i32 | writer_id i64 | batch_sequence i32 | record_count i32 |
        statistics_length i32 | statistics | records            (CRC-32C from schema_id to the end)
    V2: the same with leader_epoch i32 after commit_timestamp (the CRC then covers byte 29 on)
"""

from __future__ import annotations

import struct

import crc32c
import pyarrow as pa
import pytest

from strom.errors import CorruptRecordError
from strom.records import log_batch

SCHEMA = pa.schema([("id", pa.int32()), ("name", pa.string())])
STATISTICS = bytes(range(23))  # opaque to the framing: whatever bytes the writer put there


def _records(ids: list[int]) -> bytes:
    return log_batch.arrow_message(pa.RecordBatch.from_pydict({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA))


def spec_batch(magic: int, records: bytes, count: int, statistics: bytes, *, leader_epoch: int = 7,
               writer_id: int = 42, batch_sequence: int = 3, schema_id: int = 1) -> bytes:
    """A batch laid out from the format's field list, not from strom's builder."""
    after_crc = struct.pack("<hbiqiii", schema_id, 1, max(count - 1, 0), writer_id, batch_sequence, count,
                            len(statistics)) + statistics + records
    crc = crc32c.crc32c(after_crc)
    before_crc = struct.pack("<bq", magic, 1_700_000_000_000)
    if magic == log_batch.MAGIC_V2:
        before_crc += struct.pack("<i", leader_epoch)
    body = before_crc + struct.pack("<I", crc) + after_crc
    return struct.pack("<qi", 100, len(body)) + body


@pytest.mark.parametrize("magic", [log_batch.MAGIC_V1, log_batch.MAGIC_V2], ids=["V1", "V2"])
def test_a_batch_of_each_version_reads_as_the_format_lays_it_out(magic: int) -> None:
    records = _records([1, 2, 3])
    data = spec_batch(magic, records, 3, STATISTICS)
    [(position, header)] = list(log_batch.iter_batches(data))
    assert position == 0 and header.magic == magic and header.size_bytes == len(data)
    assert (header.base_offset, header.schema_id, header.writer_id, header.batch_sequence, header.record_count) == (
        100, 1, 42, 3, 3)
    assert header.is_append_only and header.next_offset == 103
    assert header.statistics_length == len(STATISTICS)
    assert header.leader_epoch == (7 if magic == log_batch.MAGIC_V2 else log_batch.NO_LEADER_EPOCH)
    assert header.header_size == (52 if magic == log_batch.MAGIC_V1 else 56)
    assert data[header.header_size : header.records_offset] == STATISTICS
    change_types, batch = log_batch.read_arrow(data, 0, header, SCHEMA)
    assert change_types is None and batch.to_pydict() == {"id": [1, 2, 3], "name": ["n1", "n2", "n3"]}


@pytest.mark.parametrize("magic", [log_batch.MAGIC_V1, log_batch.MAGIC_V2], ids=["V1", "V2"])
def test_the_builder_writes_what_the_format_says(magic: int) -> None:
    records = _records([5])
    built = log_batch.build_batch(
        schema_id=1, record_count=1, records=records, append_only=True, writer_id=42, batch_sequence=3,
        base_offset=100, commit_timestamp=1_700_000_000_000, magic=magic, statistics=STATISTICS, leader_epoch=7,
    )
    assert built == spec_batch(magic, records, 1, STATISTICS)


@pytest.mark.parametrize("magic", [log_batch.MAGIC_V1, log_batch.MAGIC_V2], ids=["V1", "V2"])
def test_the_crc_covers_the_statistics_and_the_stamped_fields_stay_outside_it(magic: int) -> None:
    data = bytearray(spec_batch(magic, _records([1]), 1, STATISTICS))
    header = log_batch.read_header(data)
    log_batch.stamp(data, 0, 555, 123)  # base offset and commit timestamp: outside the CRC'd range
    if magic == log_batch.MAGIC_V2:
        struct.pack_into("<i", data, log_batch.LEADER_EPOCH_OFFSET, 9)  # the leader's epoch too
    [(_, stamped)] = list(log_batch.iter_batches(data))
    assert (stamped.base_offset, stamped.commit_timestamp) == (555, 123)
    data[header.header_size + 2] ^= 0x10  # a statistics byte
    with pytest.raises(CorruptRecordError, match="CRC"):
        list(log_batch.iter_batches(data))


def test_statistics_that_do_not_fit_and_an_unknown_magic_are_corrupt() -> None:
    records = _records([1])
    too_long = bytearray(spec_batch(log_batch.MAGIC_V1, records, 1, STATISTICS))
    struct.pack_into("<i", too_long, 48, len(too_long))  # statistics_length beyond the batch
    negative = bytearray(spec_batch(log_batch.MAGIC_V1, records, 1, STATISTICS))
    struct.pack_into("<i", negative, 48, -1)
    unknown = bytearray(spec_batch(log_batch.MAGIC_V1, records, 1, STATISTICS))
    unknown[log_batch.MAGIC_OFFSET] = 3
    truncated = spec_batch(log_batch.MAGIC_V2, records, 1, STATISTICS)[:50]  # shorter than V2's header
    for data, message in ((too_long, "statistics"), (negative, "statistics"), (unknown, "magic"),
                          (truncated, "truncated")):
        with pytest.raises(CorruptRecordError, match=message):
            list(log_batch.iter_batches(data))


def test_versions_mix_in_one_buffer_and_a_projection_is_a_v0_batch() -> None:
    v0 = log_batch.build_arrow_batch(pa.RecordBatch.from_pydict({"id": [1], "name": ["a"]}, schema=SCHEMA), schema_id=1)
    v1 = spec_batch(log_batch.MAGIC_V1, _records([2]), 1, STATISTICS)
    v2 = spec_batch(log_batch.MAGIC_V2, _records([3]), 1, b"")
    data = v0 + v1 + v2
    found = list(log_batch.iter_batches(data))
    assert [header.magic for _, header in found] == [0, 1, 2]
    assert [log_batch.read_arrow(data, p, h, SCHEMA)[1].column(0).to_pylist() for p, h in found] == [[1], [2], [3]]
    position, header = found[1]
    projected = log_batch.project(data, position, header, SCHEMA, [1], None)
    [(_, projected_header)] = list(log_batch.iter_batches(projected))
    assert projected_header.magic == log_batch.MAGIC_V0 and projected_header.base_offset == 100
    assert log_batch.read_arrow(projected, 0, projected_header, SCHEMA.remove(0))[1].to_pydict() == {"name": ["n2"]}
