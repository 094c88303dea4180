"""``FlussDataSource``: the Python data source Spark knows as ``fluss``.

    spark.dataSource.register(FlussDataSource)
    df = (spark.read.format("fluss").option("bootstrap.servers", "127.0.0.1:9123")
          .option("table", "db.orders").load())

Spark creates the source and asks for its schema once per ``load()``, pickles it, and unpickles it in the
planner and in every task; so it keeps only the options and the table id it saw (to notice a table that
was dropped and re-created in between). A primary-key table's schema ends with a change-type column
(``_change_type``) in batch reads too: Spark fixes the schema before the source can know whether the query
streams, and one schema for both lets a batch read feed the same code, or a write, as a stream does.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from strom.client import Connection
from strom.client.table import TableLayout
from strom.spark import runtime
from strom.spark.binlog import BINLOG_COLUMNS, binlog_schema, check_binlog_table
from strom.spark.bucket_reader import ReadContext
from strom.spark.errors import FlussConnectorError
from strom.spark.options import (
    READ_CHANGE_TYPE_COLUMN,
    READ_METADATA_COLUMNS,
    READ_OPTIMIZED,
    WRITE_CHANGE_TYPE_COLUMN,
    ConnectionOptions,
    ReadOptions,
    WriteOptions,
)
from strom.spark.reader import FlussBatchReader, FlussFilteringReader
from strom.spark.stream_reader import FlussStreamReader
from strom.spark.tables import load_or_create
from strom.spark.type_mapping import read_schema, spark_arrow_schema
from strom.spark.writer import FlussArrowWriter, FlussStreamArrowWriter

CATALOG_TABLE_REFUSAL = (
    "the fluss source was given no options at all: Spark 4.3 hands a Python data source none of the OPTIONS, "
    "LOCATION or TBLPROPERTIES of a table in its catalog (CREATE TABLE … USING fluss), so such a table cannot "
    "name its strom table; use CREATE TEMPORARY VIEW name USING fluss OPTIONS (…), whose options Spark passes, "
    "or strom.spark.register(spark, bootstrap_servers=…) (docs/spark.md, \"Spark SQL by name\")"
)
"""Why a source without options is refused: the one way Spark creates it so."""


class FlussDataSource(DataSource):
    """Batch and streaming reads and writes of one Fluss table (options in docs/spark.md).

    Batch reads take no pushed filters unless option ``read.filter-pushdown`` is true: PySpark refuses a
    reader that takes them while ``spark.sql.python.filterPushdown.enabled`` is off (its default), so
    registering this class by hand works in any session. ``strom.spark.register`` registers
    :class:`FlussPushdownDataSource` and turns that setting on.
    """

    filter_pushdown_default: bool = False

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(dict(options))
        if not options:
            raise FlussConnectorError(CATALOG_TABLE_REFUSAL)
        self._connection = ConnectionOptions.parse(options)
        self._table_id: int | None = None
        self._has_primary_key = False
        self._change_type_column: str | None = None

    @classmethod
    def name(cls) -> str:
        return "fluss"

    def _load(self) -> TableLayout:
        async def load(connection: Connection) -> TableLayout:
            return (await connection.get_table(self._connection.table_path)).layout

        layout = runtime.call(self._connection, load)
        if self._table_id is not None and self._table_id != layout.info.table_id:
            raise FlussConnectorError(
                f"table '{self._connection.table}' was dropped and re-created since the DataFrame was defined; load it again"
            )
        self._table_id = layout.info.table_id
        self._has_primary_key = bool(layout.primary_key)
        return layout

    def _load_for_read(self, options: ReadOptions) -> TableLayout:
        """The table, and the name of its change type column (primary-key tables only)."""
        layout = self._load()
        if self._connection.binlog:
            check_binlog_table(layout)
            built_in = [name for name in options.metadata_columns if name in BINLOG_COLUMNS]
            if built_in:
                raise FlussConnectorError(
                    f"'{self._connection.table}' has {built_in} among its columns already; leave them out of option "
                    f"'{READ_METADATA_COLUMNS.key}'"
                )
            if options.read_optimized:
                raise FlussConnectorError(
                    f"option '{READ_OPTIMIZED.key}' reads KV snapshots, which hold no changes: it does not apply to "
                    f"'{self._connection.table}'"
                )
            self._change_type_column = None
            return layout
        column = options.change_type_column if layout.primary_key else ""
        if column in layout.column_names:
            raise FlussConnectorError(
                f"table '{self._connection.table}' has a column named '{column}'; choose another name for the change "
                f"type with option '{READ_CHANGE_TYPE_COLUMN.key}'"
            )
        self._change_type_column = column or None
        taken = [name for name in options.metadata_columns if name in layout.column_names or name == column]
        if taken:
            raise FlussConnectorError(
                f"table '{self._connection.table}' already has columns named {taken}; leave them out of option "
                f"'{READ_METADATA_COLUMNS.key}'"
            )
        return layout

    def _read_schema(self, layout: TableLayout, options: ReadOptions) -> StructType:
        if self._connection.binlog:
            return binlog_schema(layout, options.metadata_columns)
        return read_schema(layout.row_type, self._change_type_column, options.metadata_columns)

    def schema(self) -> StructType:
        options = ReadOptions.parse(self.options)
        return self._read_schema(self._load_for_read(options), options)

    def _read_context(self, schema: StructType, options: ReadOptions) -> ReadContext:
        layout = self._load_for_read(options)
        assert self._table_id is not None
        expected = self._read_schema(layout, options).fieldNames()
        if schema.fieldNames() != expected:
            raise FlussConnectorError(
                f"a user-specified schema is not supported for table '{self._connection.table}'; its columns are {expected}"
            )
        return ReadContext(
            self._connection, self._table_id, spark_arrow_schema(schema), self._change_type_column is not None,
            options.wait_for_file, options.metadata_columns, self._connection.binlog,
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        options = ReadOptions.parse(self.options)
        pushdown = self.filter_pushdown_default if options.filter_pushdown is None else options.filter_pushdown
        reader = FlussFilteringReader if pushdown and not self._connection.binlog else FlussBatchReader
        return reader(self._connection, options, self._read_context(schema, options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = ReadOptions.parse(self.options)
        context = self._read_context(schema, options)
        if self._has_primary_key and self._change_type_column is None and not self._connection.binlog:
            raise FlussConnectorError(
                f"a streaming read of primary-key table '{self._connection.table}' needs the change type column; "
                f"option '{READ_CHANGE_TYPE_COLUMN.key}' must not be empty"
            )
        return FlussStreamReader(self._connection, options, context, self._has_primary_key)

    def _check_write(self, schema: StructType, options: WriteOptions, overwrite: bool) -> int:
        """Fail on the driver, before any task runs, for what would fail in every task; returns the table id."""
        table = self._connection.table
        if self._connection.binlog:
            raise FlussConnectorError(
                f"'{table}' is a read-only form of table '{self._connection.table_path}': write to the table itself"
            )
        if overwrite:
            raise FlussConnectorError(
                f"mode 'overwrite' is not supported for table '{table}': use mode 'append' "
                "(rows are appended to log tables and upserted into primary-key tables)"
            )
        async def ensure(connection: Connection) -> TableLayout:
            columns = [name for name in schema.fieldNames() if name != options.change_type_column]
            change_type = options.change_type_column_for(columns)
            layout, _created = await load_or_create(
                connection, self._connection.table_path, schema, options.creation, change_type
            )
            return layout

        layout = runtime.call(self._connection, ensure)
        if self._table_id is not None and self._table_id != layout.info.table_id:
            raise FlussConnectorError(
                f"table '{table}' was dropped and re-created since the DataFrame was defined; load it again"
            )
        names = schema.fieldNames()
        change_type_column = options.change_type_column_for(layout.column_names)
        unknown = [n for n in names if n not in layout.column_names and n != change_type_column]
        if unknown:
            raise FlussConnectorError(
                f"table '{table}' has no columns {unknown} (it has {layout.column_names}; a change type column is "
                f"named by option '{WRITE_CHANGE_TYPE_COLUMN.key}')"
            )
        assigned = layout.info.schema.auto_increment_columns  # filled by the server
        missing = [n for n in layout.column_names if n not in names and n not in assigned]
        if missing:
            raise FlussConnectorError(f"the DataFrame lacks columns {missing} of table '{table}'")
        return layout.info.table_id

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = WriteOptions.parse(self.options)
        return FlussArrowWriter(self._connection, options, self._check_write(schema, options, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = WriteOptions.parse(self.options)
        return FlussStreamArrowWriter(self._connection, options, self._check_write(schema, options, overwrite))


class FlussPushdownDataSource(FlussDataSource):
    """The ``fluss`` source with filter pushdown on by default, for sessions where
    ``spark.sql.python.filterPushdown.enabled`` is true (what ``strom.spark.register`` sets up)."""

    filter_pushdown_default = True
