"""Tables created from Spark: ``df.write.format("fluss")`` creates a missing table from the DataFrame and
refuses an existing table that differs; ``strom.spark.register`` makes a database's tables SQL views."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest

from strom.records.types import BigIntType, IntType, StringType
from strom.spark import FlussDataSource, register
from tests.conftest import unique_name
from tests.spark.support import Fluss, run
from tests.spark.test_spark_errors import failure_line

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(180)]


def write(frame: Any, cluster: Fluss, table: str, **options: str) -> None:
    frame.write.format("fluss").options(**cluster.options(table, **options)).mode("append").save()


def test_a_write_creates_a_missing_primary_key_table_with_the_dataframes_schema_and_the_options_layout(
    spark: Any, cluster: Fluss
) -> None:
    table = f"fluss.{unique_name('created')}"
    frame = spark.createDataFrame(
        [(1, "a", 2.5, decimal.Decimal("1.25"), datetime.date(2026, 1, 2), datetime.datetime(2026, 1, 2, 3, 4, 5), [1, 2], "+I"),
         (2, "b", None, None, None, None, None, "+I")],
        "id INT NOT NULL, name STRING NOT NULL, score DOUBLE, price DECIMAL(10,2), day DATE, at TIMESTAMP_NTZ, "
        "tags ARRAY<INT>, _change_type STRING",
    )

    write(frame, cluster, table, **{"primary.key": "id,name", "bucket.num": "3", "bucket.key": "id",
                                    "table.log.ttl": "2d", "comment": "from spark"})

    layout = cluster.describe(table)
    assert layout.column_names == ["id", "name", "score", "price", "day", "at", "tags"]
    assert [str(f.type) for f in layout.row_type.fields] == [
        "INT NOT NULL", "STRING NOT NULL", "DOUBLE", "DECIMAL(10, 2)", "DATE", "TIMESTAMP(6)", "ARRAY<INT>",
    ]
    assert (layout.primary_key, layout.bucket_count) == (["id", "name"], 3)
    assert [layout.column_names[i] for i in layout.bucket_key_indexes] == ["id"]
    assert layout.info.properties["table.log.ttl"] == "2d" and layout.info.descriptor.comment == "from spark"
    assert sorted((r["id"], r["name"], r["score"]) for r in cluster.rows(table)) == [(1, "a", 2.5), (2, "b", None)]

    write(frame.where("id = 1"), cluster, table, **{"primary.key": "id,name", "bucket.num": "3"})  # matches: fine
    read_back = spark.read.format("fluss").options(**cluster.options(table)).load()
    assert read_back.drop("_change_type").schema.simpleString() == frame.drop("_change_type").schema.simpleString()


def test_a_write_creates_a_log_table_without_a_primary_key_and_with_partition_keys(spark: Any, cluster: Fluss) -> None:
    table = f"fluss.{unique_name('created_log')}"
    frame = spark.createDataFrame([], "id BIGINT, day STRING")

    write(frame, cluster, table, **{"partition.key": "day", "bucket.num": "2"})

    layout = cluster.describe(table)
    assert (layout.primary_key, layout.partition_keys, layout.bucket_count) == ([], ["day"], 2)
    plain = f"fluss.{unique_name('created_plain')}"
    write(spark.createDataFrame([(1, "x")], "id BIGINT, event STRING"), cluster, plain)
    assert cluster.describe(plain).primary_key == []
    assert [tuple(r) for r in spark.read.format("fluss").options(**cluster.options(plain)).load().collect()] == [(1, "x")]


def test_a_write_declaring_a_layout_refuses_an_existing_table_that_differs(spark: Any, cluster: Fluss) -> None:
    table = cluster.create_table([("id", IntType()), ("name", StringType()), ("score", BigIntType())],
                                 primary_key=["id"], bucket_count=2)
    frame = spark.createDataFrame([(1, "a", 1)], "id INT NOT NULL, name STRING, score INT")

    message = failure_line(lambda: write(frame, cluster, table, **{"primary.key": "id", "bucket.num": "4"}))

    assert message.startswith(f"table '{table}' exists and differs from the DataFrame and the write's options: ")
    assert "column 'score' is BIGINT (read as bigint), the DataFrame's is int" in message
    assert "2 buckets, option 'bucket.num' says 4" in message
    other_key = failure_line(lambda: write(frame, cluster, table, **{"primary.key": "name"}))
    assert "primary key ['id'], option 'primary.key' says ['name']" in other_key
    write(frame, cluster, table)  # no layout declared: the write casts as before
    assert [(r["id"], r["score"]) for r in cluster.rows(table)] == [(1, 1)]


def test_register_makes_a_databases_tables_usable_from_spark_sql_by_name(spark: Any, cluster: Fluss) -> None:
    database = unique_name("views")

    async def create_database(connection: Any) -> None:
        await connection.get_admin().create_database(database)

    run(cluster.address, create_database)
    events = f"{database}.events"
    write(spark.createDataFrame([(i, f"e{i}") for i in range(5)], "id INT, event STRING"), cluster, events)
    write(spark.createDataFrame([(1, "x")], "id INT NOT NULL, v STRING"), cluster, f"{database}.users",
          **{"primary.key": "id"})
    try:
        assert register(spark, bootstrap_servers=cluster.address, database=database) == ["events", "users"]
        assert spark.sql("SELECT count(*) FROM events").first()[0] == 5
        assert [tuple(r) for r in spark.sql("SELECT * FROM users").collect()] == [(1, "x")]  # the table's columns
        write(spark.createDataFrame([(6, "e6")], "id INT, event STRING"), cluster, events)
        write(spark.createDataFrame([(2, "y"), (1, "x2")], "id INT NOT NULL, v STRING"), cluster, f"{database}.users")
        # Spark plans a view once; every query still reads what is committed when it runs
        assert spark.sql("SELECT count(*) FROM events").first()[0] == 6
        assert sorted(tuple(r) for r in spark.sql("SELECT * FROM users").collect()) == [(1, "x2"), (2, "y")]
        spark.sql("INSERT INTO users VALUES (3, 'z'), (1, 'x3')")  # upserted
        spark.sql("INSERT INTO events VALUES (7, 'e7')")  # appended
        assert sorted(tuple(r) for r in spark.sql("SELECT * FROM users").collect()) == [(1, "x3"), (2, "y"), (3, "z")]
        assert sorted(r.id for r in spark.sql("SELECT id FROM events").collect()) == [0, 1, 2, 3, 4, 6, 7]
        message = failure_line(lambda: spark.sql("INSERT OVERWRITE users VALUES (9, 'w')").collect())
        assert "mode 'overwrite' is not supported" in message
        assert 9 not in {row["id"] for row in cluster.rows(f"{database}.users")}
        assert register(spark, bootstrap_servers=cluster.address, database=database, tables=["users"]) == ["users"]
    finally:
        spark.dataSource.register(FlussDataSource)
        spark.catalog.dropTempView("events")
        spark.catalog.dropTempView("users")


def test_a_temporary_view_with_a_schema_creates_its_table_on_the_first_insert(spark: Any, cluster: Fluss) -> None:
    table = f"fluss.{unique_name('sql_created')}"
    options = (f"`bootstrap.servers` '{cluster.address}', `table` '{table}', `primary.key` 'id', "
               "`bucket.num` '2', `read.change-type-column` '', `read.strategy` 'server-scan'")
    spark.sql(f"CREATE TEMPORARY VIEW sql_created (id BIGINT NOT NULL, v STRING) USING fluss OPTIONS ({options})")
    try:
        spark.sql("INSERT INTO sql_created VALUES (1, 'a'), (2, 'b')")
        described = cluster.describe(table).info
        assert described.schema.primary_key == ("id",) and described.bucket_count == 2
        assert sorted(tuple(r) for r in spark.sql("SELECT * FROM sql_created").collect()) == [(1, "a"), (2, "b")]
        columns = [(r.col_name, r.data_type) for r in spark.sql("DESCRIBE sql_created").collect()]
        assert columns == [("id", "bigint"), ("v", "string")]
        spark.sql("INSERT INTO sql_created VALUES (2, 'b2')")
        assert [tuple(r) for r in spark.sql("SELECT * FROM sql_created WHERE id = 2").collect()] == [(2, "b2")]
    finally:
        spark.catalog.dropTempView("sql_created")


def test_a_catalog_table_is_refused_with_what_to_use_instead(spark: Any, cluster: Fluss) -> None:
    """Spark 4.3 hands a Python data source behind a catalog table none of its options."""
    table = cluster.create_table([("id", IntType())], primary_key=None, bucket_count=1)
    name = unique_name("catalog_table")
    # the options reach the source while Spark creates the table (it asks for the schema), never afterwards
    spark.sql(f"CREATE TABLE {name} USING fluss OPTIONS (`bootstrap.servers` '{cluster.address}', `table` '{table}')")
    try:
        message = failure_line(lambda: spark.sql(f"SELECT * FROM {name}").collect())
        assert "given no options at all" in message
        assert "CREATE TEMPORARY VIEW" in message
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_a_dictionary_table_with_an_auto_increment_column_is_created_and_filled_from_spark(
    spark: Any, cluster: Fluss
) -> None:
    table = f"fluss.{unique_name('dictionary')}"
    first = spark.createDataFrame([("u1", None), ("u2", None)], "user_id STRING NOT NULL, uid BIGINT")
    write(first, cluster, table, **{"primary.key": "user_id", "bucket.num": "2", "auto-increment.fields": "uid"})
    assert cluster.describe(table).info.schema.auto_increment_columns == ("uid",)

    write(spark.createDataFrame([("u3",), ("u1",)], "user_id STRING NOT NULL"), cluster, table)  # the column left out

    ids = {row["user_id"]: row["uid"] for row in cluster.rows(table)}
    assert sorted(ids) == ["u1", "u2", "u3"] and None not in ids.values()
    assert len(set(ids.values())) == 3, f"ids must be unique: {ids}"
    message = failure_line(lambda: write(spark.createDataFrame([("u4", 7)], "user_id STRING NOT NULL, uid BIGINT"),
                                         cluster, table))
    assert "column 'uid'" in message and "is auto-increment" in message
    assert "u4" not in {row["user_id"] for row in cluster.rows(table)}
