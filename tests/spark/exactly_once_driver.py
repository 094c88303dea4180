"""A Spark driver the exactly-once tests run as a child process (so it can be killed with SIGKILL):

``stream ADDRESS SOURCE DIR COLUMNS=TARGET...``: one streaming query per target table, each reading the log
table SOURCE from its start (96 rows per micro-batch, in requests of 10 rows), selecting COLUMNS (comma-separated) and writing them
into TARGET with ``write.exactly-once`` and ``trigger(availableNow=True)``, its checkpoint under DIR; exits 0
once every query has drained the source.

``batch ADDRESS SOURCE DIR COLUMNS=TARGET...``: per target, reads SOURCE in one batch job and writes it into
TARGET exactly-once in requests of 50 rows; the first task to have two requests acknowledged kills its own
Python worker (``testing.write.crash-once-after-requests``, a marker file under DIR), and Spark retries it.

Spark runs ``local[2,8]``: a task whose worker died is retried up to 8 times.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from strom.spark import FlussDataSource

    mode, address, source = sys.argv[1:4]
    spark = (
        SparkSession.builder.master("local[2,8]").appName("strom-exactly-once")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
        .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FlussDataSource)
    directory, targets = sys.argv[4], [target.split("=", 1) for target in sys.argv[5:]]
    if mode == "stream":
        queries = []
        for columns, target in targets:
            rows = (spark.readStream.format("fluss").option("bootstrap.servers", address).option("table", source)
                    .option("scan.startup.mode", "earliest").option("scan.max-rows-per-trigger", "96").load())
            queries.append(
                rows.select(*columns.split(",")).writeStream.format("fluss").option("bootstrap.servers", address)
                .option("table", target).option("write.exactly-once", "true").option("write.batch-rows", "10")
                .option("checkpointLocation", os.path.join(directory, target))
                .trigger(availableNow=True).start()
            )
        for query in queries:
            query.awaitTermination()
    else:
        for columns, target in targets:
            rows = spark.read.format("fluss").option("bootstrap.servers", address).option("table", source).load()
            crash = os.path.join(directory, f"crashed-{target}")
            (rows.select(*columns.split(",")).write.format("fluss").option("bootstrap.servers", address)
             .option("table", target).option("write.exactly-once", "true").option("write.batch-rows", "50")
             .option("testing.write.crash-once-after-requests", f"2:{crash}").mode("append").save())
    spark.stop()


if __name__ == "__main__":
    main()
