"""Replaying a primary-key bucket's changelog into its RocksDB.

Writes skip RocksDB's own WAL: the changelog, fsynced first, is the write-ahead record, and RocksDB records
with every write the changelog offset it reflects (``applied_log_offset``) and the bucket's row count. After
a crash RocksDB comes back at its last flush, and the committed changelog after that offset is replayed.

A replay is a loop of reads of the log, decodes of its Arrow batches and RocksDB writes, ~2 µs a record
here: a bucket that crashed with a full memtable replays for a second or more. :func:`catch_up_opened` lets
it run on the thread that opened the bucket's files (:meth:`ReplicaManager.open_soon`), before the event
loop takes them, so that one bucket's recovery does not stall every other client of the server.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator
from typing import Protocol

from strom.kv.rocksdb import KvDatabase
from strom.kv.row_format import TableRowFormat
from strom.log.log_tablet import LogTablet
from strom.records import log_batch
from strom.records.log_batch import ChangeType

log = logging.getLogger(__name__)

APPLIED_OFFSET_KEY = b"applied_log_offset"
ROW_COUNT_KEY = b"row_count"
META_KEYS = (APPLIED_OFFSET_KEY, ROW_COUNT_KEY)
OFFSET = struct.Struct("<q")
REPLAY_READ_BYTES = 16 << 20


class OpenedDatabase(Protocol):
    """A bucket's RocksDB as its opener hands it over (``kv_tablet.BucketDatabase``)."""

    @property
    def db(self) -> KvDatabase: ...

    @property
    def vector_memtable(self) -> bool: ...


Changes = tuple[log_batch.LogBatchHeader, list[bytes], list[bytes | None], int]


def batch_changes(row_format: TableRowFormat, data: bytes, from_offset: int) -> Iterator[Changes]:
    """Per changelog batch of ``data`` that ends after ``from_offset``: its header, the writes of its records
    at or after that offset (key, value; None deletes; a -U is left out, the +U after it carries the new
    value) and the batch's change of the row count."""
    for position, header in log_batch.iter_batches(data, verify_crc=False):
        if header.next_offset <= from_offset:
            continue
        change_types, batch = row_format.read_log_batch(data, position, header)  # in the current schema
        types = change_types or b""
        keys: list[bytes] = []
        values: list[bytes | None] = []
        if batch.num_rows:
            all_keys, all_values = row_format.changelog_to_kv(batch, types)
            first = max(0, from_offset - header.base_offset)
            for key, value in zip(all_keys[first:], all_values[first:], strict=True):
                if key is not None:
                    keys.append(key)
                    values.append(value)
        yield header, keys, values, types.count(ChangeType.INSERT) - types.count(ChangeType.DELETE)


def read_meta_int(db: KvDatabase, key: bytes) -> int:
    raw = db.get_meta(key)
    return int(OFFSET.unpack(raw)[0]) if raw else 0


class Replayed:
    """Where a replay got to: RocksDB reflects the changelog below ``offset`` and holds ``row_count`` rows."""

    __slots__ = ("offset", "records", "row_count")

    def __init__(self, offset: int, row_count: int) -> None:
        self.offset = offset
        self.row_count = row_count
        self.records = 0
        """Records applied."""


def replay(
    db: KvDatabase, log_tablet: LogTablet, row_format: TableRowFormat, at: Replayed, end_offset: int,
    bytes_max: int | None = None, written: Callable[[list[bytes], list[bytes | None]], None] | None = None,
) -> Replayed:
    """Apply the changelog from ``at.offset`` up to ``end_offset`` (``bytes_max``: stop after about that much
    of the log) to ``db``, each read of the log in one RocksDB write that also records the offset and row
    count reached; ``written`` is told each write's keys and values. Advances and returns ``at``."""
    read = 0
    while at.offset < end_offset and (bytes_max is None or read < bytes_max):
        chunk = REPLAY_READ_BYTES if bytes_max is None else min(REPLAY_READ_BYTES, bytes_max)
        data = log_tablet.read_range(at.offset, end_offset, chunk)
        if not data:
            break
        read += len(data)
        keys: list[bytes] = []
        values: list[bytes | None] = []
        offset, row_count = at.offset, at.row_count
        for header, batch_keys, batch_values, delta in batch_changes(row_format, data, offset):
            row_count += delta
            keys += batch_keys
            values += batch_values
            at.records += len(batch_keys)
            offset = header.next_offset
        db.write(keys, values, META_KEYS, (OFFSET.pack(offset), OFFSET.pack(row_count)))
        at.offset, at.row_count = offset, row_count
        if written is not None:
            written(keys, values)
    return at


def catch_up_opened(database: OpenedDatabase, log_tablet: LogTablet, row_format: TableRowFormat,
                    written: Callable[[list[bytes], list[bytes | None]], None] | None = None) -> int:
    """Replay the committed changelog into a bucket's RocksDB that was just opened with its log, before
    either is handed to the event loop; returns the records applied. Only the plain case: RocksDB within the
    log and behind its high watermark. Whatever else (RocksDB ahead of the log or before its start) is left
    to the tablet's own recovery, which then finds this part done. ``written`` is told each RocksDB write's
    keys and values (the replay collects its rows for the row cache, ``kv_tablet.replayed_database``)."""
    db = database.db
    at = Replayed(read_meta_int(db, APPLIED_OFFSET_KEY), read_meta_int(db, ROW_COUNT_KEY))
    end = log_tablet.high_watermark
    if not log_tablet.log_start_offset <= at.offset < end:
        return 0
    replay(db, log_tablet, row_format, at, end, written=written)
    log.info("%s: replayed %d changelog records up to offset %d before opening", log_tablet.directory, at.records,
             end)
    return at.records
