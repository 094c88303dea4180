"""The Spark connector: a PySpark (4.3+) Python data source named ``fluss``.

    import strom.spark
    strom.spark.register(spark)  # or spark.dataSource.register(FlussDataSource): no filter pushdown
    spark.read.format("fluss").option("bootstrap.servers", "127.0.0.1:9123").option("table", "db.t").load()

See docs/spark.md for the options, the type mapping and the guarantees.
"""

from typing import Any

from strom.spark.errors import FlussConnectorError

PUSHDOWN_SETTING = "spark.sql.python.filterPushdown.enabled"
"""Spark's SQL setting (default false) that lets a Python data source's reader take filters; with it false,
Spark refuses a reader that implements ``pushFilters`` (see option ``read.filter-pushdown``)."""

try:
    from strom.spark.source import FlussDataSource, FlussPushdownDataSource
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    if exc.name is None or not exc.name.startswith("pyspark"):
        raise
    raise ModuleNotFoundError("Spark support not installed: pip install 'strom[spark]'", name=exc.name) from exc


def register(spark: Any) -> None:
    """Register the ``fluss`` source with a session and enable filter pushdown for Python data sources
    (primary-key lookups and partition pruning for batch reads)."""
    spark.conf.set(PUSHDOWN_SETTING, "true")
    spark.dataSource.register(FlussPushdownDataSource)


__all__ = ["PUSHDOWN_SETTING", "FlussConnectorError", "FlussDataSource", "FlussPushdownDataSource", "register"]
