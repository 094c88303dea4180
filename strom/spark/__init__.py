"""The Spark connector: a PySpark (4.3+) Python data source named ``fluss``.

    from strom.spark import FlussDataSource
    spark.dataSource.register(FlussDataSource)
    spark.read.format("fluss").option("bootstrap.servers", "127.0.0.1:9123").option("table", "db.t").load()

See docs/spark.md for the options, the type mapping and the guarantees.
"""

from strom.spark.errors import FlussConnectorError

try:
    from strom.spark.source import FlussDataSource
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    if exc.name is None or not exc.name.startswith("pyspark"):
        raise
    raise ModuleNotFoundError("Spark support not installed: pip install 'strom[spark]'", name=exc.name) from exc

__all__ = ["FlussConnectorError", "FlussDataSource"]
