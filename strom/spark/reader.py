"""The batch reader: ``spark.read.format("fluss")``.

``partitions()`` runs once per query on the driver and fixes the read (see :mod:`strom.spark.planning`);
``read()`` runs in the executors, one call per partition. Python data sources get no column pruning (nor a
limit), so every read returns full rows and Spark applies ``select`` afterwards; ``where`` conjuncts Spark
pushes become key lookups or partition pruning (:mod:`strom.spark.pushdown`), the rest Spark applies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from strom.client import Connection
from strom.client.table import TableLayout
from strom.spark import planning, pushdown, runtime
from strom.spark.bucket_reader import (
    ReadContext,
    read_key_lookup,
    read_kv_state,
    read_lake_bucket,
    read_log_range,
    read_log_tail,
    read_server_scan,
)
from strom.spark.errors import FlussConnectorError
from strom.spark.options import SCAN_STARTUP_MODE, ConnectionOptions, ReadOptions, ReadSource, StartupMode
from strom.spark.partitions import (
    KeyLookupPartition,
    KvStatePartition,
    LakeBucketPartition,
    LogRangePartition,
    LogTailPartition,
    ServerScanPartition,
)


def read_partition(context: ReadContext, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Dispatch a planned partition to its reader (shared by the batch and the streaming reader)."""
    if isinstance(partition, LogRangePartition):
        return read_log_range(context, partition)
    if isinstance(partition, LogTailPartition):
        return read_log_tail(context, partition)
    if isinstance(partition, KvStatePartition):
        return read_kv_state(context, partition)
    if isinstance(partition, ServerScanPartition):
        return read_server_scan(context, partition)
    if isinstance(partition, LakeBucketPartition):
        return read_lake_bucket(context, partition)
    if isinstance(partition, KeyLookupPartition):
        return read_key_lookup(context, partition)
    assert type(partition) is InputPartition, f"unknown partition {partition!r}"
    return iter(())  # Spark's stand-in when planning found nothing to read


class FlussBatchReader(DataSourceReader):
    """Plans one partition per bucket with data; picklable (options and plain values only)."""

    def __init__(self, connection: ConnectionOptions, options: ReadOptions, context: ReadContext) -> None:
        if options.startup_mode is StartupMode.LATEST:
            raise FlussConnectorError(
                f"option '{SCAN_STARTUP_MODE.key}'=latest only applies to streaming reads; a batch read returns the "
                "table's current contents"
            )
        self._connection = connection
        self._options = options
        self._context = context
        self._pushed: pushdown.PushedFilters | None = None

    def partitions(self) -> Sequence[InputPartition]:
        async def plan(connection: Connection) -> list[InputPartition]:
            table = await connection.get_table(self._connection.table_path)
            if table.layout.info.table_id != self._context.table_id:
                raise FlussConnectorError(
                    f"table '{self._connection.table}' was dropped and re-created since the DataFrame was defined; "
                    "load it again"
                )
            return await planning.plan_batch(
                connection, table.layout, self._options, self._pushed, changes_only=self._context.binlog
            )

        return runtime.call(self._connection, plan)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self._context, partition)


class FlussFilteringReader(FlussBatchReader):
    """The batch reader with filter pushdown (see :mod:`strom.spark.pushdown`); Spark calls ``pushFilters``
    only with ``spark.sql.python.filterPushdown.enabled=true`` and refuses a reader that defines it
    otherwise, so the source uses this class unless option ``read.filter-pushdown`` is false."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        if not filters:
            return []
        async def layout(connection: Connection) -> TableLayout:
            return (await connection.get_table(self._connection.table_path)).layout

        table_layout = runtime.call(self._connection, layout)
        options = self._options
        allow_lookup = (
            options.source is not ReadSource.LAKE and options.startup_mode is StartupMode.FULL
            and options.time_range is None and not options.read_optimized
        )
        self._pushed, kept = pushdown.push(table_layout, filters, allow_lookup)
        if self._pushed.log_predicate is not None:
            self._context = dataclasses.replace(self._context, log_predicate=self._pushed.log_predicate)
        return kept
