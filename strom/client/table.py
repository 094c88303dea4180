"""A table handle (``connection.get_table(path)``) and the builders it hands out, named as in pyfluss."""

from __future__ import annotations

from collections.abc import Sequence

from strom.client.admin import Admin
from strom.client.batch_scanner import BatchScanner, BucketBatchScanner
from strom.client.blocking import BlockingLookuper
from strom.client.layout import TableLayout
from strom.client.log_scanner import LogScanner
from strom.client.lookup import Lookuper, PrefixLookuper
from strom.client.predicates import Predicate
from strom.client.table_handle import TableHandle
from strom.client.writer import AppendWriter, ReplayableWriterId, UpsertWriter
from strom.ids import TableBucket


class Table(TableHandle):
    """An existing table of the cluster."""

    def new_upsert(self) -> TableUpsert:
        return TableUpsert(self)

    def new_append(self) -> TableAppend:
        return TableAppend(self)

    def new_lookup(self) -> TableLookup:
        return TableLookup(self)

    def new_scan(self) -> TableScan:
        return TableScan(self)


class TableUpsert:
    def __init__(self, table: Table) -> None:
        self._table = table
        self._targets: list[int] | None = None
        self._merge_mode = "default"

    def partial_update(self, columns: Sequence[int | str]) -> TableUpsert:
        """Only write these columns (they must include the primary key); others keep their values."""
        self._targets = self._table.layout.column_indexes(columns)
        return self

    def merge_mode(self, mode: str) -> TableUpsert:
        """``overwrite``: rows replace the stored ones, bypassing the table's merge engine (Fluss's
        MergeMode.OVERWRITE, for undoing merged writes; deletes are then always allowed); ``default``: the
        merge engine applies. Overwrite needs a table with a merge engine."""
        self._merge_mode = mode
        return self

    partial_update_by_name = partial_update
    partial_update_by_index = partial_update

    def create_writer(self, replayable: ReplayableWriterId | None = None) -> UpsertWriter:
        """``replayable``: write under a writer identity of the caller's (see :class:`ReplayableWriterId`)."""
        return UpsertWriter(self._table, self._targets, replayable, self._merge_mode)


class TableAppend:
    def __init__(self, table: Table) -> None:
        self._table = table

    def create_writer(self, replayable: ReplayableWriterId | None = None) -> AppendWriter:
        """``replayable``: write under a writer identity of the caller's (see :class:`ReplayableWriterId`)."""
        return AppendWriter(self._table, replayable)


class TableLookup:
    def __init__(self, table: Table) -> None:
        self._table = table
        self._prefix: list[str] | None = None
        self._insert_if_not_exists = False

    def lookup_by(self, columns: Sequence[str]) -> TableLookup:
        self._prefix = list(columns)
        return self

    def insert_if_not_exists(self) -> TableLookup:
        """Lookups insert a row for each missing key (the key alone; an auto-increment column gets its id)
        and return it: Fluss's dictionary-table lookup. Needs write access to the table."""
        self._insert_if_not_exists = True
        return self

    def create_blocking_lookuper(self) -> BlockingLookuper:
        """A lookuper for synchronous code: no event loop, one blocking socket per leader (lowest latency)."""
        if self._prefix is not None or self._insert_if_not_exists:
            raise ValueError("prefix lookups and inserting lookups have no blocking variant; use create_lookuper()")
        return BlockingLookuper(self._table)

    def create_lookuper(self) -> Lookuper | PrefixLookuper:
        if self._prefix is not None:
            if self._insert_if_not_exists:
                raise ValueError("prefix lookups cannot insert missing keys; use a key lookup")
            return PrefixLookuper(self._table, self._prefix)
        return Lookuper(self._table, insert_if_not_exists=self._insert_if_not_exists)


class TableScan:
    """Builder for scanners: the log scanner here; the KV batch scanners come with ScanKv support."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.projection: list[int] | None = None
        self.row_limit: int | None = None
        self.predicate: Predicate | None = None

    def project(self, columns: Sequence[int | str]) -> TableScan:
        self.projection = sorted(set(self.table.layout.column_indexes(columns)))
        return self

    project_by_name = project

    def limit(self, row_limit: int) -> TableScan:
        if row_limit <= 0:
            raise ValueError(f"limit must be positive, got {row_limit}")
        self.row_limit = row_limit
        return self

    def filter(self, predicate: Predicate) -> TableScan:
        """Push ``predicate`` down: the server skips log batches no row of which matches (by their
        statistics, ``table.statistics.columns``); the batches returned are whole (:meth:`Predicate.filter`
        keeps their matching rows)."""
        self.predicate = predicate
        return self

    def create_log_scanner(self) -> LogScanner:
        return LogScanner(self.table, self.projection, self.predicate)

    def create_bucket_batch_scanner(self, bucket: TableBucket) -> BucketBatchScanner:
        """Scan one bucket's current rows (ScanKv)."""
        return BucketBatchScanner(self.table, bucket, projection=self.projection, limit=self.row_limit)

    async def create_batch_scanner(self, parallelism: int = 4) -> BatchScanner:
        """Scan every bucket (of every partition) of the table, ``parallelism`` at a time."""
        layout = self.table.layout
        partition_ids: list[int | None] = [None]
        if layout.partition_keys:
            admin = Admin(self.table.connection)
            partitions = await admin.list_partition_infos(layout.info.path)
            partition_ids = [p.partition_id for p in partitions]
        buckets = [self.table.bucket(b, p) for p in partition_ids for b in range(layout.bucket_count)]
        return BatchScanner(
            self.table, buckets, projection=self.projection, limit=self.row_limit, parallelism=parallelism
        )


__all__ = ["Table", "TableAppend", "TableLayout", "TableLookup", "TableScan", "TableUpsert"]
