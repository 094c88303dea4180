"""A KvTablet of any schema and table options, written and read with Python values (for merge engines)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from strom.ids import TablePath
from strom.kv.kv_tablet import KvConfig, KvTablet
from strom.kv.merge import options as merge_options
from strom.kv.rocksdb import RocksDbOptions
from strom.kv.row_format import TableRowFormat
from strom.log.log_tablet import LogConfig, LogTablet
from strom.metadata.table_info import TableInfo
from strom.records import log_batch
from strom.records.schema import Schema, TableDescriptor
from strom.records.types import DataType

LOG_CONFIG = LogConfig(segment_size_bytes_max=1 << 30, flush_interval_messages=1, writer_expiration_ms=60_000)
T0_MS = 1_700_000_000_000
Row = dict[str, Any]


def table_info(columns: Sequence[tuple[str, DataType]], primary_key: Sequence[str], properties: dict[str, str]) -> TableInfo:
    """A table as the coordinator stores it: ``fields.<column>.agg`` options folded into the schema."""
    descriptor = TableDescriptor(Schema.of(columns, primary_key=list(primary_key)), bucket_count=1, properties=properties)
    document = json.loads(descriptor.to_json())
    merge_options.fold_field_options(document)
    folded = TableDescriptor.from_json(document)
    merge_options.validate(folded.schema, folded.properties)
    return TableInfo(7, TablePath("db", "merged"), 1, folded.to_json(), T0_MS, T0_MS)


class MergeBucket:
    """One bucket of a table with a merge engine, reopenable like a restarted server does it."""

    def __init__(
        self,
        directory: Path,
        columns: Sequence[tuple[str, DataType]],
        primary_key: Sequence[str],
        properties: dict[str, str],
    ) -> None:
        self.directory = directory
        self.table = table_info(columns, primary_key, properties)
        self.names = [name for name, _type in columns]
        self.key_names = list(primary_key)
        self.format = TableRowFormat(self.table)
        self.config = KvConfig.for_table(self.table, RocksDbOptions(block_cache_size_bytes=1 << 20))
        self.kv = self.open()

    def open(self) -> KvTablet:
        return KvTablet(self.directory / "kv", LogTablet.open(self.directory / "log", LOG_CONFIG), self.format, self.config)

    def close(self) -> None:
        self.kv.close()
        self.kv.log.close()

    def reopen(self) -> None:
        self.close()
        self.kv = self.open()

    def _values(self, row: Row) -> list[Any]:
        return [row.get(name) for name in self.names]

    def key(self, row: Row) -> bytes:
        return self.format.encode_key(self._values(row))

    async def put(self, rows: Sequence[Row | tuple[str, Row]], target_columns: Sequence[str] | None = None) -> None:
        """Upsert ``rows``; a ``("delete", key row)`` item deletes. Prepare, wait for the fsync, apply."""
        keys, values = [], []
        for item in rows:
            if isinstance(item, tuple):
                keys.append(self.key(item[1]))
                values.append(None)
            else:
                keys.append(self.key(item))
                values.append(self.format.encode_row(self._values(item)))
        targets = None if target_columns is None else [self.names.index(n) for n in target_columns]
        result = self.kv.prepare_put(keys, values, 1, targets, -1, -1, T0_MS)
        await self.kv.log.wait_durable(result.next_offset)
        self.kv.apply_durable()

    def lookup(self, key: Row) -> Row | None:
        (value,) = self.kv.lookup([self.key(key)])
        return None if value is None else dict(zip(self.names, self.format.decode_stored(value), strict=True))

    def changelog(self) -> list[tuple[str, Row]]:
        """``(short change type, row)`` of every durable changelog record."""
        log = self.kv.log
        data = log.read_range(0, log.high_watermark, 1 << 30)
        entries = []
        short = {0: "+A", 1: "+I", 2: "-U", 3: "+U", 4: "-D"}
        for position, header in log_batch.iter_batches(data):
            change_types, batch = log_batch.read_arrow(data, position, header, self.format.arrow_schema)
            for index, row in enumerate(batch.to_pylist()):
                entries.append((short[change_types[index]], row))  # type: ignore[index]
        return entries
