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


SQL_VIEW_OPTIONS = {"read.change-type-column": "", "read.strategy": "server-scan"}
"""The read options of :func:`register`'s views unless its ``options`` say otherwise: no change-type column
(``SELECT *`` and ``INSERT INTO`` see the table's own columns), and a primary-key table's rows as its leaders
hold them when each query's tasks run (ScanKv), so every query sees what is committed then, though Spark
plans the view once."""


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
    from Spark SQL by name: one temporary view per table, named as the table, made with ``CREATE OR REPLACE
    TEMPORARY VIEW … USING fluss OPTIONS (…)`` (Spark 4.3 passes no options to a Python data source behind a
    table of its catalog). ``SELECT`` reads the table when the query runs (:data:`SQL_VIEW_OPTIONS`, under
    ``options``), ``INSERT INTO`` appends to a log table and upserts into a primary-key table; ``INSERT
    OVERWRITE`` is refused. Register again after tables are created or dropped (docs/spark.md).

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
        view_options = {**SQL_VIEW_OPTIONS, **dict(options or {}), "bootstrap.servers": bootstrap_servers,
                        "table": f"{database}.{name}"}
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {sql_identifier(name)} USING fluss OPTIONS "
                  f"({', '.join(f'{sql_identifier(k)} {sql_string(v)}' for k, v in view_options.items())})")
    return names


def sql_identifier(name: str) -> str:
    """``name`` as a Spark SQL identifier in backquotes (a backquote doubled)."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """``value`` as a Spark SQL string literal (backslashes and quotes escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _table_names(bootstrap_servers: str, database: str) -> list[str]:

    async def listed() -> list[str]:
        async with await Connection.create({"bootstrap.servers": bootstrap_servers}) as connection:
            return sorted(await connection.get_admin().list_tables(database))

    with translated(bootstrap_servers, database):
        return runtime.run(listed())


__all__ = ["PUSHDOWN_SETTING", "SQL_VIEW_OPTIONS", "FlussDataSource", "FlussPushdownDataSource", "register"]
