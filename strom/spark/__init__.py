"""The Spark connector: a PySpark (4.3+) Python data source named ``fluss``.

    import strom.spark
    strom.spark.register(spark)  # or spark.dataSource.register(FlussDataSource): no filter pushdown
    spark.read.format("fluss").option("bootstrap.servers", "127.0.0.1:9123").option("table", "db.t").load()

See docs/spark.md for the options, the type mapping and the guarantees.
"""

from strom.spark.errors import FlussConnectorError
from strom.spark.registration import PUSHDOWN_SETTING, FlussDataSource, FlussPushdownDataSource, register

__all__ = ["PUSHDOWN_SETTING", "FlussConnectorError", "FlussDataSource", "FlussPushdownDataSource", "register"]
