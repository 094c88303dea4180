"""Lookups of partitions that expired from the cluster but live in the lake (Fluss's historical partitions,
``table.datalake.historical-partition.enabled``).

A client that finds a key's partition gone (and in the past) sends the lookup to the same bucket of the
table's system partition ``__historical__`` with ``original_partition_name`` naming the expired one. Its
leader answers from the lake table: it reads that partition's bucket at the lake's latest snapshot (the
lake format's own reader), indexes the rows by the table's key encoding — the same key bytes a client sends —
and keeps the index for further lookups (``server.historical-partition.lookup-cache.max-entries`` buckets,
least recently used out, dropped after ``…lookuper-cache.expire-after-access`` unused, and replaced when the
lake has a newer snapshot). Reads run on a pool of their own, and past
``netty.server.max-queued-historical-requests`` lookups at once a lookup is refused with
HistoricalPartitionThrottled (73, retriable).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from strom.config import (
    NETTY_SERVER_MAX_QUEUED_HISTORICAL_REQUESTS,
    SERVER_HISTORICAL_PARTITION_LOOKUP_CACHE_MAX_ENTRIES,
    SERVER_HISTORICAL_PARTITION_LOOKUPER_CACHE_EXPIRE,
    SERVER_HISTORICAL_PARTITION_THREAD_POOL_MAX_SIZE,
    Configuration,
)
from strom.errors import HistoricalPartitionThrottledError
from strom.kv.row_format import TableRowFormat
from strom.lake.formats import lake_format
from strom.metadata.table_info import TableInfo
from strom.records.arrow_python import record_batch_to_values
from strom.records.kv_batch import SCHEMA_ID


@dataclass
class _BucketIndex:
    snapshot_id: int | None
    values: dict[bytes, bytes]
    """Key bytes → the stored value (schema id + row) of the current schema."""
    used_at: float


class HistoricalLookups:
    """A tablet server's reads of expired partitions from the lake. Lookups come from the event loop; the
    reads run on the pool."""

    def __init__(self, config: Configuration, clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = ThreadPoolExecutor(config.get(SERVER_HISTORICAL_PARTITION_THREAD_POOL_MAX_SIZE),
                                        thread_name_prefix="strom-historical")
        self._permits = config.get(NETTY_SERVER_MAX_QUEUED_HISTORICAL_REQUESTS)
        self._in_flight = 0
        self._entries_max = config.get(SERVER_HISTORICAL_PARTITION_LOOKUP_CACHE_MAX_ENTRIES)
        self._expire_s = config.get(SERVER_HISTORICAL_PARTITION_LOOKUPER_CACHE_EXPIRE).total_seconds()
        self._clock = clock
        self._lock = threading.Lock()
        self._indexes: OrderedDict[tuple[int, int, str, int], _BucketIndex] = OrderedDict()
        self.lake_reads = 0
        """Buckets read from the lake (a lookup answered from the index reads none)."""

    async def lookup(self, table: TableInfo, row_format: TableRowFormat, partition_name: str, bucket: int,
                     keys: Sequence[bytes]) -> list[bytes | None]:
        """The stored values of ``keys`` in the lake's ``partition_name`` bucket ``bucket`` (None: no row).

        Raises:
            HistoricalPartitionThrottledError: too many historical lookups at once here.
        """
        if self._in_flight >= self._permits:
            raise HistoricalPartitionThrottledError(
                f"{self._in_flight} historical lookups are in progress on this tablet server "
                f"(netty.server.max-queued-historical-requests = {self._permits}); retry later"
            )
        self._in_flight += 1
        try:
            loop = asyncio.get_running_loop()
            values = await loop.run_in_executor(self._pool, self._index, table, row_format, partition_name, bucket)
        finally:
            self._in_flight -= 1
        return [values.get(bytes(key)) for key in keys]

    def _index(self, table: TableInfo, row_format: TableRowFormat, partition_name: str, bucket: int) -> dict[bytes, bytes]:
        """The bucket's keys and values at the lake's latest snapshot, read once per snapshot (on the pool)."""
        lake_table = lake_format(table).table(table)
        snapshot_id = lake_table.latest_snapshot_id()
        key = (table.table_id, table.schema_id, partition_name, bucket)
        now = self._clock()
        with self._lock:
            self._expire(now)
            known = self._indexes.get(key)
            if known is not None and known.snapshot_id == snapshot_id:
                known.used_at = now
                self._indexes.move_to_end(key)
                return known.values
        values: dict[bytes, bytes] = {}
        if snapshot_id is not None:
            prefix = SCHEMA_ID.pack(row_format.schema_id)
            for batch in lake_table.read_bucket(snapshot_id, bucket, partition_name):
                for row in record_batch_to_values(batch, row_format.row_type):
                    values[row_format.encode_key(row)] = prefix + row_format.encode_row(row)
        with self._lock:
            self.lake_reads += 1
            self._indexes[key] = _BucketIndex(snapshot_id, values, now)
            self._indexes.move_to_end(key)
            while len(self._indexes) > self._entries_max:
                self._indexes.popitem(last=False)
        return values

    def _expire(self, now: float) -> None:
        for key in [k for k, index in self._indexes.items() if now - index.used_at > self._expire_s]:
            del self._indexes[key]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._indexes.clear()


__all__ = ["HistoricalLookups"]
