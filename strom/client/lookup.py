"""Point and prefix lookups on primary-key tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from strom.client import encoding
from strom.errors import PartitionNotExistError, error_for_code
from strom.ids import TableBucket
from strom.records import row_arrow
from strom.records.bucketing import bucket_for_key
from strom.records.compacted import CompactedKeyEncoder
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb

if TYPE_CHECKING:
    from strom.client.table import Table

SCHEMA_ID_SIZE_BYTES = 2


class _KeyedReader:
    def __init__(self, table: Table, key_columns: Sequence[str]) -> None:
        layout = table.layout
        if not layout.primary_key:
            raise ValueError(f"table {layout.info.path} has no primary key")
        self._table = table
        self._key_columns = list(key_columns)
        self._lookup_schema = pa.schema(
            [layout.arrow_schema.field(name).with_nullable(True) for name in layout.column_names]
        )

    def _full_row_batch(self, keys: Sequence[Mapping[str, Any] | Sequence[Any]]) -> pa.RecordBatch:
        rows = []
        for key in keys:
            values = dict(key) if isinstance(key, Mapping) else dict(zip(self._key_columns, key, strict=True))
            missing = [name for name in self._key_columns if values.get(name) is None]
            if missing:
                raise ValueError(f"the lookup key needs the columns {missing}")
            rows.append({name: values[name] for name in self._key_columns})
        return pa.RecordBatch.from_pylist(rows, schema=self._lookup_schema)

    async def _partition_id(self, name: str | None) -> int | None:
        if name is None:
            return None
        return await self._table.connection.metadata.partition_id(self._table.layout.info, name)

    def _decode(self, values: Sequence[bytes]) -> list[dict[str, Any]]:
        if not values:
            return []
        layout = self._table.layout
        rows = [memoryview(value)[SCHEMA_ID_SIZE_BYTES:] for value in values]
        batch = row_arrow.rows_to_record_batch(rows, layout.row_decoder, layout.arrow_schema)
        result: list[dict[str, Any]] = batch.to_pylist()
        return result


class Lookuper(_KeyedReader):
    """``await lookuper.lookup({"id": 1})`` → the row as a dict, or None."""

    def __init__(self, table: Table) -> None:
        super().__init__(table, table.layout.primary_key)

    async def lookup(self, key: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any] | None:
        return (await self.lookup_many([key]))[0]

    async def lookup_many(self, keys: Sequence[Mapping[str, Any] | Sequence[Any]]) -> list[dict[str, Any] | None]:
        """Look up many keys with one request per bucket leader; results in input order."""
        layout = self._table.layout
        batch = self._full_row_batch(keys)
        encoded = encoding.encode(layout, batch, with_rows=False, with_keys=True)
        assert encoded.keys is not None
        partitions = encoding.partition_names(layout, batch)
        groups: dict[TableBucket, list[int]] = {}
        results: list[dict[str, Any] | None] = [None] * len(keys)
        for index in range(len(keys)):
            try:
                partition_id = await self._partition_id(partitions[index] if partitions else None)
            except PartitionNotExistError:
                continue  # a missing partition holds no rows
            bucket = TableBucket(layout.info.table_id, encoded.buckets[index], partition_id)
            groups.setdefault(bucket, []).append(index)
        connection = self._table.connection
        for bucket, indexes in groups.items():
            request = pb.LookupRequest(table_id=bucket.table_id)
            entry = request.buckets_req.add(bucket_id=bucket.bucket, keys=[encoded.keys[i] for i in indexes])
            if bucket.partition_id is not None:
                entry.partition_id = bucket.partition_id
            response = await connection.leader_request(bucket, ApiKey.LOOKUP, request)
            bucket_response = response.buckets_resp[0]
            if bucket_response.HasField("error_code") and bucket_response.error_code != 0:
                raise error_for_code(bucket_response.error_code, bucket_response.error_message)
            found = [(i, v.values) for i, v in zip(indexes, bucket_response.values, strict=True) if v.HasField("values")]
            for (index, _value), row in zip(found, self._decode([v for _i, v in found]), strict=True):
                results[index] = row
        return results


class PrefixLookuper(_KeyedReader):
    """Rows whose key starts with the given prefix columns (the partition keys plus the bucket keys)."""

    def __init__(self, table: Table, columns: Sequence[str]) -> None:
        super().__init__(table, columns)
        layout = table.layout
        bucket_keys = [layout.column_names[i] for i in layout.bucket_key_indexes]
        expected = [*layout.partition_keys, *bucket_keys]
        if sorted(columns) != sorted(expected):
            raise ValueError(f"a prefix lookup must use exactly the partition and bucket key columns {expected}")
        self._prefix_encoder = CompactedKeyEncoder(layout.row_type, layout.bucket_key_indexes)

    async def lookup(self, prefix: Mapping[str, Any] | Sequence[Any]) -> list[dict[str, Any]]:
        layout = self._table.layout
        batch = self._full_row_batch([prefix])
        values = row_arrow.record_batch_to_values(batch, layout.row_type)[0]
        key = self._prefix_encoder.encode(values)
        partitions = encoding.partition_names(layout, batch)
        try:
            partition_id = await self._partition_id(partitions[0] if partitions else None)
        except PartitionNotExistError:
            return []
        bucket = TableBucket(layout.info.table_id, bucket_for_key(key, layout.bucket_count), partition_id)
        request = pb.PrefixLookupRequest(table_id=bucket.table_id)
        entry = request.buckets_req.add(bucket_id=bucket.bucket, keys=[key])
        if partition_id is not None:
            entry.partition_id = partition_id
        response = await self._table.connection.leader_request(bucket, ApiKey.PREFIX_LOOKUP, request)
        bucket_response = response.buckets_resp[0]
        if bucket_response.HasField("error_code") and bucket_response.error_code != 0:
            raise error_for_code(bucket_response.error_code, bucket_response.error_message)
        return self._decode(list(bucket_response.value_lists[0].values))
