"""A Spark application as a user runs it against a deployed Spark: ``python deployment_client.py MASTER STROM
PREFIX WORK lake|plain`` with MASTER ``spark://host:port`` (a standalone cluster) or ``sc://host:port`` (Spark Connect). It
registers the ``fluss`` source, writes a DataFrame of NOT NULL columns into a new primary-key table (lake-enabled
with ``lake``), reads it
back, filters one key, streams the table into a log table, and prints one JSON line of what it saw."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def main() -> None:
    master, strom, prefix, work, lake = sys.argv[1:6]
    from pyspark.sql import SparkSession

    from strom.spark import FlussPushdownDataSource

    builder = SparkSession.builder.appName(f"strom-{prefix}")
    if master.startswith("sc://"):
        spark = builder.remote(master).getOrCreate()
    else:
        spark = (builder.master(master).config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").config("spark.executor.memory", "512m")
                 .config("spark.sql.python.filterPushdown.enabled", "true").getOrCreate())
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(FlussPushdownDataSource)
    options = {"bootstrap.servers": strom}
    users, events = f"fluss.{prefix}_users", f"fluss.{prefix}_events"
    frame = spark.range(0, 20_000, numPartitions=4).selectExpr(
        "CAST(id AS INT) AS id", "id * 2 AS v", "CAST(id AS STRING) AS s")  # every column NOT NULL
    lake_options = {"table.datalake.enabled": "true", "table.datalake.freshness": "1s"} if lake == "lake" else {}
    (frame.write.format("fluss").options(**options, **lake_options).option("table", users).option("primary.key", "id")
     .option("bucket.num", "2").mode("append").save())
    table = spark.read.format("fluss").options(**options).option("table", users).load()
    count = table.count()
    found = [row.asDict() for row in table.where("id = 12345").select("id", "v", "s").collect()]
    stream = (spark.readStream.format("fluss").options(**options).option("table", users).load()
              .selectExpr("id", "v", "s"))
    query = (stream.writeStream.format("fluss").options(**options).option("table", events)
             .option("checkpointLocation", os.path.join(work, "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(180)
    streamed = spark.read.format("fluss").options(**options).option("table", events).load().count()
    print(json.dumps({"count": count, "found": found, "streamed": streamed}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
