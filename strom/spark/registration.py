"""Registering the ``fluss`` source with a Spark session, and a SQL view per table of a database."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from strom.client import Connection
from strom.spark import runtime
from strom.spark.errors import FlussConnectorError, translated

PUSHDOWN_SETTING = "spark.sql.python.filterPushdown.enabled"
"""Spark's SQL setting (default false) that lets a Python data source's reader take filters; with it false,
Spark refuses a reader that implements ``pushFilters`` (see option ``read.filter-pushdown``)."""

try:
    from strom.spark.source import FlussDataSource, FlussPushdownDataSource
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    if exc.name is None or not exc.name.startswith("pyspark"):
        raise
    raise ModuleNotFoundError("Spark support not installed: pip install 'strom[spark]'", name=exc.name) from exc


def register(
    spark: Any,
    bootstrap_servers: str | None = None,
    database: str = "fluss",
    tables: Collection[str] | None = None,
    options: Mapping[str, str] | None = None,
) -> list[str]:
    """Register the ``fluss`` source with a session and enable filter pushdown for Python data sources
    (primary-key lookups and partition pruning for batch reads).

    With ``bootstrap_servers``, also make the tables of ``database`` (or only ``tables`` of it) usable
    from Spark SQL by name: one temporary view per table, named as the table, over a batch read with
    ``options``. Spark 4.3 has no catalog hook for Python data sources, so views are what SQL can name;
    and Spark plans a Python data source's relation once, at the first query that uses it, and reuses that
    plan. A log table's view still reads each bucket to its end when the query runs; a primary-key table's
    snapshot read keeps its planned snapshots and end offsets: call ``register`` again to read newer data
    there, or after a table is created, dropped or altered (docs/spark.md).

    Returns:
        The names of the views created (empty without ``bootstrap_servers``).

    Raises:
        FlussConnectorError: the cluster cannot be reached or the database does not exist.
    """
    spark.conf.set(PUSHDOWN_SETTING, "true")
    spark.dataSource.register(FlussPushdownDataSource)
    if bootstrap_servers is None:
        return []
    names = _table_names(bootstrap_servers, database)
    if tables is not None:
        missing = sorted(set(tables) - set(names))
        if missing:
            raise FlussConnectorError(f"database '{database}' on {bootstrap_servers} has no tables {missing}")
        names = [name for name in names if name in tables]
    for name in names:
        frame = (
            spark.read.format("fluss").options(**dict(options or {}))
            .option("bootstrap.servers", bootstrap_servers).option("table", f"{database}.{name}").load()
        )
        frame.createOrReplaceTempView(name)
    return names


def _table_names(bootstrap_servers: str, database: str) -> list[str]:

    async def listed() -> list[str]:
        async with await Connection.create({"bootstrap.servers": bootstrap_servers}) as connection:
            return sorted(await connection.get_admin().list_tables(database))

    with translated(bootstrap_servers, database):
        return runtime.run(listed())


__all__ = ["PUSHDOWN_SETTING", "FlussDataSource", "FlussPushdownDataSource", "register"]
