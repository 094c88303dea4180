"""Point and prefix lookups on primary-key tables."""

from __future__ import annotations

import asyncio
import itertools
import random
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from strom.client import encoding
from strom.client.rpc_client import LEADERSHIP_MOVED
from strom.client.table_handle import TableHandle
from strom.errors import (
    CorruptMessageError,
    HistoricalPartitionThrottledError,
    PartitionNotExistError,
    StromError,
    error_for_code,
)
from strom.ids import TableBucket
from strom.metadata.auto_partition import AutoPartitionStrategy
from strom.records import bucketing, positions, row_arrow, types
from strom.records.compacted import CompactedKeyEncoder
from strom.rpc import lookup_wire
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import EncodedRequest, pb
from strom.table_properties import HISTORICAL_PARTITION_VALUE

SCHEMA_ID_SIZE_BYTES = 2
# Types whose internal row values are already what Arrow's to_pylist would return, so single keys and
# rows of them are encoded and decoded without building Arrow arrays. CHAR is not here: Arrow pads it.
_PLAIN_TYPES = (
    types.BooleanType, types.TinyIntType, types.SmallIntType, types.IntType, types.BigIntType,
    types.FloatType, types.DoubleType, types.StringType, types.BytesType,
)
_PLAIN_PYTHON = (bool, int, float, str, bytes)


HISTORICAL_BACKOFF_S = 0.1
HISTORICAL_BACKOFF_MAX_S = 5.0
HISTORICAL_RETRY_S = 60.0
"""A lookup of an expired partition refused as throttled (73) is retried, backing off from 0.1 s to 5 s
(Fluss's client's bounds), for at most a minute."""
INSERT_TIMEOUT_MS = 30_000
"""How long a lookup that inserts missing keys lets the server take to make them durable."""
_INSERTING = pb.LookupRequest(insert_if_not_exists=True, acks=-1, timeout_ms=INSERT_TIMEOUT_MS).SerializePartialToString()
"""The LookupRequest fields that make a lookup insert its missing keys, appended to a request's bytes."""

class _KeyedReader:
    def __init__(self, table: TableHandle, key_columns: Sequence[str]) -> None:
        layout = table.layout
        if not layout.primary_key:
            raise ValueError(f"table {layout.info.path} has no primary key")
        self._table = table
        self._key_columns = list(key_columns)
        self._lookup_schema = pa.schema(
            [layout.arrow_schema.field(name).with_nullable(True) for name in layout.column_names]
        )
        types = [f.type for f in layout.row_type.fields]
        self._key_positions = [layout.column_names.index(name) for name in self._key_columns]
        self._plain_key = all(isinstance(types[i], _PLAIN_TYPES) for i in self._key_positions)
        self._plain_rows = all(isinstance(t, _PLAIN_TYPES) for t in types)
        self._bucket_key_is_key = layout.bucket_key_indexes == layout.key_indexes
        self._key_lane = (self._plain_key and self._bucket_key_is_key and not layout.partition_keys
                          and layout.key_lake_format is None and self._key_positions == layout.key_indexes)
        """A key of plain values is encoded from its own values, in key order (a single lookup's hot path):
        the bucket is the key's, and no partition is named by the row."""

    def _full_row_batch(self, keys: Sequence[Mapping[str, Any] | Sequence[Any]]) -> pa.RecordBatch:
        """A batch of the table's schema holding the keys' columns (the others null), built column by
        column: one Arrow conversion per key column instead of one per key."""
        columns: dict[str, list[Any]] = {name: [] for name in self._key_columns}
        for key in keys:
            if isinstance(key, Mapping):
                for name, column in columns.items():
                    column.append(key.get(name))
            else:
                if len(key) != len(self._key_columns):
                    raise ValueError(f"a lookup key needs {len(self._key_columns)} values {self._key_columns}")
                for column, value in zip(columns.values(), key, strict=True):
                    column.append(value)
        arrays = []
        for field in self._lookup_schema:
            values = columns.get(field.name)
            if values is None:
                arrays.append(pa.nulls(len(keys), field.type))
                continue
            if any(value is None for value in values):
                raise ValueError(f"the lookup key needs the column {field.name!r}")
            arrays.append(pa.array(values, field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self._lookup_schema)

    def _simple_key(self, key: Mapping[str, Any] | Sequence[Any]) -> tuple[bytes, int, str | None] | None:
        """Key bytes, bucket and partition of a key of plain Python values (ints, strings, bytes…),
        encoded directly; None sends the key through the general Arrow path (dates, decimals, …)."""
        layout = self._table.layout
        if not self._plain_key:
            return None
        get = key.get if type(key) is dict or isinstance(key, Mapping) else dict(zip(self._key_columns, key, strict=True)).get
        values = [get(name) for name in self._key_columns]
        for value in values:
            if type(value) not in _PLAIN_PYTHON:  # None included
                return None
        try:
            if self._key_lane:  # no row of every column to build: the key's values are all it needs
                key_bytes = layout.key_writer.encode_values(values, len(layout.column_names))
                return key_bytes, bucketing.bucket_ids([key_bytes], layout.bucket_count)[0], None
            row = [get(name) for name in layout.column_names]
            key_bytes = layout.key_writer.encode(row)
            bucket_key = key_bytes if self._bucket_key_is_key else layout.bucket_key_writer.encode(row)
        except (TypeError, ValueError, OverflowError, struct.error):
            return None
        partition = "$".join(str(row[i]) for i in layout.partition_key_indexes) if layout.partition_keys else None
        if layout.key_lake_format is not None:
            return key_bytes, layout.bucket_of(bucket_key, layout.bucket_count), partition
        return key_bytes, bucketing.bucket_ids([bucket_key], layout.bucket_count)[0], partition

    async def _partition_id(self, name: str | None) -> int | None:
        if name is None:
            return None
        return await self._table.connection.metadata.partition_id(self._table.layout.info, name)

    def _decode_one(self, value: bytes) -> dict[str, Any]:
        """One stored value as a dict; rows of plain types skip Arrow (a single lookup's hot path)."""
        layout = self._table.layout
        if self._plain_rows and layout.kv_format == "COMPACTED":
            layout.check_values((value,))
            row = layout.row_reader.decode(value, SCHEMA_ID_SIZE_BYTES)
            return dict(zip(layout.column_names, row, strict=True))
        return self._decode([value])[0]

    def _decode(self, values: Sequence[bytes]) -> list[dict[str, Any]]:
        if not values:
            return []
        layout = self._table.layout
        layout.check_values(values)
        rows = [memoryview(value)[SCHEMA_ID_SIZE_BYTES:] for value in values]
        batch = row_arrow.rows_to_record_batch(rows, layout.row_decoder, layout.arrow_schema)
        result: list[dict[str, Any]] = batch.to_pylist()
        return result


class Lookuper(_KeyedReader):
    """``await lookuper.lookup({"id": 1})`` → the row as a dict, or None.

    A key of a partition that has expired from the cluster is looked up in the lake when the table has
    ``table.datalake.historical-partition.enabled`` (Fluss's historical partitions): the lookup goes to the
    same bucket of the table's ``__historical__`` partition, naming the expired one, and its leader reads the
    lake table. A partition that does not exist and is not in the past (a current or future one not created)
    holds no rows."""

    def __init__(self, table: TableHandle, *, insert_if_not_exists: bool = False) -> None:
        super().__init__(table, table.layout.primary_key)
        self._insert_if_not_exists = insert_if_not_exists
        self._historical_partitions: set[str] = set()
        """Partitions found expired: their keys go to the lake at once."""

    def _is_historical(self, partition_name: str) -> bool:
        """Whether ``partition_name``, not in the cluster, is an expired partition the lake answers for."""
        if partition_name in self._historical_partitions:
            return True
        layout = self._table.layout
        info = layout.info
        if self._insert_if_not_exists or not info.options.datalake_historical_partition:
            return False
        strategy = AutoPartitionStrategy.of(info.properties, layout.partition_keys)
        if not strategy.enabled or not strategy.values.matches(partition_name):
            return False
        if partition_name >= strategy.partition_time(int(time.time() * 1000)):
            return False  # the current partition or a future one: not created yet, no rows
        self._historical_partitions.add(partition_name)
        return True

    async def _lookup_historical(self, partition_name: str, bucket_id: int, keys: list[bytes]) -> list[bytes | None]:
        """Stored values of ``keys`` of an expired partition's bucket, from the lake (through the leader of the
        ``__historical__`` partition's bucket); retried with a back-off while that server is busy with others."""
        table_id = self._table.layout.info.table_id
        historical_id = await self._partition_id(HISTORICAL_PARTITION_VALUE)
        bucket = TableBucket(table_id, bucket_id, historical_id)
        request = pb.LookupRequest(table_id=table_id)
        request.buckets_req.add(partition_id=historical_id, bucket_id=bucket_id, keys=keys,
                                original_partition_name=partition_name)
        delay_s = HISTORICAL_BACKOFF_S
        deadline = time.monotonic() + HISTORICAL_RETRY_S
        while True:
            try:
                response, _ = await self._table.connection.read_from_leader(bucket, ApiKey.LOOKUP, request, _bucket_error)
                break
            except HistoricalPartitionThrottledError:
                if time.monotonic() + delay_s > deadline:
                    raise
                await asyncio.sleep(delay_s * random.uniform(0.8, 1.2))
                delay_s = min(delay_s * 2, HISTORICAL_BACKOFF_MAX_S)
        found = response.buckets_resp[0].values
        if len(found) != len(keys):
            raise CorruptMessageError(f"a Lookup of {len(keys)} keys was answered with {len(found)} values")
        return [value.values if value.HasField("values") else None for value in found]

    async def lookup(self, key: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any] | None:
        simple = self._simple_key(key)
        if simple is None:
            return (await self.lookup_many([key]))[0]
        key_bytes, bucket_id, partition_name = simple
        partition_id = None
        if partition_name is not None:
            try:
                partition_id = await self._partition_id(partition_name)
            except PartitionNotExistError:
                if not self._is_historical(partition_name):
                    return None
                value = (await self._lookup_historical(partition_name, bucket_id, [key_bytes]))[0]
                return None if value is None else self._decode_one(value)
        bucket = TableBucket(self._table.layout.info.table_id, bucket_id, partition_id)
        value = (await self._lookup_bucket(bucket, [key_bytes]))[0]
        return None if value is None else self._decode_one(value)

    async def _lookup_bucket(self, bucket: TableBucket, keys: list[bytes]) -> list[bytes | None]:
        body = lookup_wire.lookup_request(bucket.table_id, bucket.partition_id, bucket.bucket, keys)
        if self._insert_if_not_exists:
            body += _INSERTING  # fields of a message may come in any order
        request = EncodedRequest(body, lookup_wire.parse_lookup_response)
        answers, _ = await self._table.connection.read_from_leader(bucket, ApiKey.LOOKUP, request, _lookup_error)
        return _lookup_values(answers, len(keys))

    async def _lookup_buckets(self, keys: dict[TableBucket, list[bytes]]) -> dict[TableBucket, list[bytes | None]]:
        """Values of each bucket's keys, with one Lookup request per leader (as Fluss's client sends them)
        instead of one per bucket: a batched lookup over B buckets and N servers costs N round trips' framing
        on both sides, not B. A bucket whose leader is not cached yet, or whose part of the answer carries an
        error, goes through :meth:`_lookup_bucket`, which follows its leadership and raises its error."""
        connection = self._table.connection
        by_leader: dict[str, list[TableBucket]] = {}
        alone: list[TableBucket] = []
        for bucket in keys:
            address = connection.metadata.cached_leader_address(bucket)
            if address is None:
                alone.append(bucket)
            else:
                by_leader.setdefault(address, []).append(bucket)
        values: dict[TableBucket, list[bytes | None]] = {}

        async def one(bucket: TableBucket) -> None:
            values[bucket] = await self._lookup_bucket(bucket, keys[bucket])

        async def several(address: str, buckets: list[TableBucket]) -> None:
            # A protobuf message's encodings concatenate: one-bucket requests joined are one request whose
            # buckets_req holds them all (table_id repeats with the same value).
            body = b"".join(lookup_wire.lookup_request(b.table_id, b.partition_id, b.bucket, keys[b]) for b in buckets)
            if self._insert_if_not_exists:
                body += _INSERTING
            try:
                answers = await connection.request(address, ApiKey.LOOKUP, EncodedRequest(body, lookup_wire.parse_lookup_response))
            except LEADERSHIP_MOVED:
                answers = []  # every bucket again, alone: that path forgets the leader and retries
            answered = {(partition_id, bucket_id): found for bucket_id, partition_id, error_code, _message, found in answers
                        if not error_code}
            retry = []
            for bucket in buckets:
                found = answered.get((bucket.partition_id, bucket.bucket))
                if found is None or len(found) != len(keys[bucket]):
                    retry.append(bucket)
                else:
                    values[bucket] = found
            await asyncio.gather(*(one(bucket) for bucket in retry))

        await asyncio.gather(
            *(one(bucket) for bucket in alone),
            *(several(address, buckets) if len(buckets) > 1 else one(buckets[0]) for address, buckets in by_leader.items()),
        )
        return values

    async def lookup_many(self, keys: Sequence[Mapping[str, Any] | Sequence[Any]]) -> list[dict[str, Any] | None]:
        """Look up many keys with one request per bucket leader; results in input order."""
        found = await self._lookup_values(self._full_row_batch(keys))
        results: list[dict[str, Any] | None] = [None] * len(keys)
        present = [(index, value) for index, value in enumerate(found) if value is not None]
        for (index, _), row in zip(present, self._decode([value for _, value in present]), strict=True):
            results[index] = row
        return results

    async def lookup_arrow(self, keys: pa.Table | pa.RecordBatch) -> pa.Table:
        """Arrow in, Arrow out (no Python object per row): the rows of the keys that exist, in the order of
        ``keys``, whose columns are (at least) the primary-key columns."""
        layout = self._table.layout
        if isinstance(keys, pa.Table):
            keys = keys.combine_chunks().to_batches()[0] if keys.num_rows else self._full_row_batch([])
        arrays = []
        for field in self._lookup_schema:
            index = keys.schema.get_field_index(field.name)
            if index < 0:
                if field.name in self._key_columns:
                    raise ValueError(f"the lookup keys lack the column {field.name!r}")
                arrays.append(pa.nulls(keys.num_rows, field.type))
            else:
                arrays.append(keys.column(index).cast(field.type))
        found = await self._lookup_values(pa.RecordBatch.from_arrays(arrays, schema=self._lookup_schema))
        values = layout.present_rows(found)
        batch = row_arrow.rows_to_record_batch(
            values, layout.row_decoder, layout.arrow_schema, offset=SCHEMA_ID_SIZE_BYTES
        )
        return pa.Table.from_batches([batch], schema=layout.arrow_schema)

    async def _lookup_values(self, batch: pa.RecordBatch) -> list[bytes | None]:
        """Stored values of the keys in ``batch``, one per row in its order (None: no row)."""
        layout = self._table.layout
        encoded = encoding.encode(layout, batch, with_rows=False, with_keys=True)
        assert encoded.keys is not None
        partitions = encoding.partition_names(layout, batch)
        if partitions is None:
            return await self._lookup_unpartitioned(encoded.keys, encoded.buckets)
        partition_ids: dict[str, int | None] = {}
        for name in set(partitions):
            try:
                partition_ids[name] = await self._partition_id(name)
            except PartitionNotExistError:
                partition_ids[name] = None  # a missing partition holds no rows
        table_id = layout.info.table_id
        keys = encoded.keys
        by_bucket: dict[tuple[int, int], list[int]] = {}
        for index, bucket_id in enumerate(encoded.buckets):
            partition_id = partition_ids[partitions[index]]
            if partition_id is not None:
                by_bucket.setdefault((partition_id, bucket_id), []).append(index)
        groups = {TableBucket(table_id, bucket_id, partition_id): indexes
                  for (partition_id, bucket_id), indexes in by_bucket.items()}
        expired = {name for name, partition_id in partition_ids.items()
                   if partition_id is None and self._is_historical(name)}
        historical: dict[tuple[str, int], list[int]] = {}
        for index, bucket_id in enumerate(encoded.buckets):
            if partitions[index] in expired:
                historical.setdefault((partitions[index], bucket_id), []).append(index)
        current, past = await asyncio.gather(
            self._lookup_buckets({bucket: [keys[i] for i in indexes] for bucket, indexes in groups.items()}),
            asyncio.gather(*(self._lookup_historical(name, bucket_id, [keys[i] for i in indexes])
                             for (name, bucket_id), indexes in historical.items())),
        )
        found: list[bytes | None] = [None] * batch.num_rows
        for indexes, values in zip([*groups.values(), *historical.values()], [*(current[b] for b in groups), *past],
                                   strict=True):
            for index, value in zip(indexes, values, strict=True):
                found[index] = value
        return found

    async def _lookup_unpartitioned(self, keys: list[bytes], buckets: Sequence[int]) -> list[bytes | None]:
        """:meth:`_lookup_values` of a table without partitions, vectorised: the keys sorted by bucket once
        (a stable sort, so each bucket's run keeps the request order), every bucket's run asked for, and the
        answers, concatenated in that same order, put back in the request's order in one step."""
        count = len(keys)
        if count == 0:
            return []
        table_id = self._table.layout.info.table_id
        bucket_ids = np.asarray(buckets, dtype=np.int64)
        order = np.argsort(bucket_ids, kind="stable")
        ordered = bucket_ids[order]
        bounds = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), count]
        sorted_keys = positions.take(keys, order)
        runs = {TableBucket(table_id, int(ordered[start]), None): sorted_keys[start:end]
                for start, end in itertools.pairwise(bounds)}
        answers = await self._lookup_buckets(runs)
        answered: list[bytes | None] = list(itertools.chain.from_iterable(answers[bucket] for bucket in runs))
        return positions.unsort(answered, order)  # each answer back at its request row


class PrefixLookuper(_KeyedReader):
    """Rows whose key starts with the given prefix columns (the partition keys plus the bucket keys)."""

    def __init__(self, table: TableHandle, columns: Sequence[str]) -> None:
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
        bucket_key = key if layout.key_lake_format is None else layout.bucket_key_encoder.encode(values)
        bucket = TableBucket(layout.info.table_id, layout.bucket_of(bucket_key, layout.bucket_count), partition_id)
        request = pb.PrefixLookupRequest(table_id=bucket.table_id)
        entry = request.buckets_req.add(bucket_id=bucket.bucket, keys=[key])
        if partition_id is not None:
            entry.partition_id = partition_id
        response, _ = await self._table.connection.read_from_leader(
            bucket, ApiKey.PREFIX_LOOKUP, request, _bucket_error
        )
        bucket_response = response.buckets_resp[0]
        return self._decode(list(bucket_response.value_lists[0].values))


def _bucket_error(response: Any) -> StromError | None:
    """The error a prefix lookup's response carries for its (one) bucket."""
    bucket_response = response.buckets_resp[0]
    if bucket_response.HasField("error_code") and bucket_response.error_code != 0:
        return error_for_code(bucket_response.error_code, bucket_response.error_message)
    return None


def _lookup_error(answers: list[lookup_wire.BucketAnswer]) -> StromError | None:
    """The error a lookup's answer carries for its one bucket (or a corrupt answer's)."""
    if len(answers) != 1:
        return CorruptMessageError(f"a Lookup for one bucket was answered with {len(answers)} bucket entries")
    _bucket_id, _partition_id, error_code, error_message, _values = answers[0]
    return error_for_code(error_code, error_message) if error_code else None


def _lookup_values(answers: list[lookup_wire.BucketAnswer], key_count: int) -> list[bytes | None]:
    """The values of a lookup's answer without an error, one per key asked (None: no row)."""
    values = answers[0][4]
    if len(values) != key_count:
        raise CorruptMessageError(f"a Lookup of {key_count} keys was answered with {len(values)} values")
    return values


def one_bucket_values(body: bytes, key_count: int) -> list[bytes | None]:
    """The values of a LookupResponse body for one bucket's ``key_count`` keys; raises the bucket's error,
    or CorruptMessageError when the answer is malformed or does not fit the request."""
    try:
        answers = lookup_wire.parse_lookup_response(body)
    except ValueError as exc:
        raise CorruptMessageError(str(exc)) from exc
    error = _lookup_error(answers)
    if error is not None:
        raise error
    return _lookup_values(answers, key_count)
