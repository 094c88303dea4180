"""Creating and opening the Iceberg copy of a strom table: Fluss's layout (columns, system columns,
identifier fields, partition spec, sort order, properties), idempotent and race-safe creation, and a
catalog entry that belongs to another strom table refused."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from strom.errors import InvalidConfigError, InvalidTableError
from strom.lake.format import LakeTableMismatchError
from strom.lake.formats import lake_format
from strom.lake.iceberg import (
    DEFAULT_CATALOG_NAME,
    SQLITE_CATALOG_FILE,
    TABLE_ID_PROPERTY,
    IcebergLakeFormat,
    IcebergLakeTable,
)
from strom.metadata.store import TableRecord
from strom.metadata.table_info import TableInfo
from strom.records import types as t
from tests.lake.duckdb_reader import iceberg_rows
from tests.lake.support import TABLE_ID, create_concurrently, table_info, write_split

PK = [("id", t.IntType(nullable=False)), ("name", t.StringType())]


def iceberg_table(info: TableInfo) -> IcebergLakeTable:
    table = lake_format(info).table(info)
    assert isinstance(table, IcebergLakeTable)
    return table


def test_a_primary_key_table_is_laid_out_as_fluss_lays_it_out(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg", properties={"iceberg.write.format.default": "parquet"})
    table = iceberg_table(info)
    ice = table.iceberg()
    assert table.identifier == ("fluss", "orders") and table.uri == f"{tmp_path}/fluss/orders"
    fields = [(f.field_id, f.name, str(f.field_type), f.required) for f in ice.schema().fields]
    assert fields == [
        (1, "id", "int", True), (2, "name", "string", False),
        (3, "__bucket", "int", True), (4, "__offset", "long", True), (5, "__timestamp", "timestamptz", True),
    ]
    assert ice.schema().identifier_field_names() == {"id"}
    assert [(f.source_id, f.field_id, str(f.transform), f.name) for f in ice.spec().fields] == [(1, 1000, "bucket[2]", "id_bucket")]
    assert [(f.source_id, str(f.direction)) for f in ice.sort_order().fields] == [(4, "ASC")]
    properties = ice.properties
    assert properties[TABLE_ID_PROPERTY] == str(TABLE_ID)
    assert properties["fluss.table.datalake.enabled"] == "true" and properties["fluss.table.datalake.format"] == "iceberg"
    assert not any(key.startswith("fluss.table.datalake.iceberg.") for key in properties), "catalog options stay out"
    assert properties["write.format.default"] == "parquet", "iceberg.<key> becomes an Iceberg property"
    assert {properties[k] for k in ("write.delete.mode", "write.update.mode", "write.merge.mode")} == {"copy-on-write"}
    assert (tmp_path / SQLITE_CATALOG_FILE).exists(), "the embedded catalog lives in the warehouse"
    assert table.latest_snapshot_id() is None and table.stats().record_count == 0 and table.read().num_rows == 0


def test_log_tables_are_partitioned_by_their_keys_then_bucket(tmp_path: Path) -> None:
    columns = [("day", t.StringType(nullable=False)), ("id", t.IntType()), ("v", t.BigIntType())]
    info = table_info(tmp_path, columns, partition_keys=["day"], lake="iceberg", name="events")
    ice = iceberg_table(info).iceberg()
    assert [(str(f.transform), f.name) for f in ice.spec().fields] == [("identity", "day"), ("identity", "__bucket")]
    assert ice.schema().identifier_field_ids == []
    assert "write.delete.mode" not in ice.properties
    keyed = table_info(tmp_path, columns, partition_keys=["day"], lake="iceberg", name="keyed", bucket_keys=["id"])
    assert [(str(f.transform), f.name) for f in iceberg_table(keyed).iceberg().spec().fields] == [
        ("identity", "day"), ("bucket[2]", "id_bucket"),
    ], "a log table with a bucket key buckets by it, as Fluss does"


def test_a_partitioned_primary_key_table_has_the_whole_key_as_identifier_fields(tmp_path: Path) -> None:
    columns = [("region", t.StringType(nullable=False)), ("id", t.BigIntType(nullable=False)), ("v", t.DoubleType())]
    info = table_info(tmp_path, columns, ["region", "id"], partition_keys=["region"], lake="iceberg", bucket_count=4)
    ice = iceberg_table(info).iceberg()
    assert ice.schema().identifier_field_names() == {"region", "id"}
    assert [(str(f.transform), f.name) for f in ice.spec().fields] == [("identity", "region"), ("bucket[4]", "id_bucket")]


def test_create_is_idempotent_and_duckdb_reads_the_empty_table(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    first = iceberg_table(info)
    again = iceberg_table(info)
    assert first.uri == again.uri
    assert first.iceberg().metadata_location == again.iceberg().metadata_location, "no second create"
    version = first.commit([write_split(first, 0, pa.record_batch({"id": pa.array([1], pa.int32()), "name": ["a"]}), [0])], {})
    assert again.latest_snapshot_id() == version
    assert iceberg_rows(again.iceberg().metadata_location, "SELECT id, name, __bucket FROM lake") == [(1, "a", 0)]


def test_creators_racing_on_a_new_table_make_one_table(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    assert create_concurrently(info, 6) == []
    catalog = iceberg_table(info).catalog
    assert catalog.list_tables("fluss") == [("fluss", "orders")]
    # losers leave an unreferenced metadata file (pyiceberg writes it before the catalog refuses them)
    assert len({iceberg_table(info).iceberg().metadata_location for _ in range(3)}) == 1


def test_a_recreated_strom_table_with_the_same_name_is_refused(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    iceberg_table(info)
    recreated = table_info(tmp_path, PK, ["id"], table_id=TABLE_ID + 1, lake="iceberg")
    with pytest.raises(LakeTableMismatchError, match=rf"belongs to strom table id {TABLE_ID}, not to 'fluss.orders'"):
        lake_format(recreated).table(recreated)
    assert isinstance(LakeTableMismatchError(), InvalidTableError)


def test_a_table_with_another_schema_key_or_spec_is_refused(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    iceberg_table(info)
    changed = table_info(tmp_path, [("id", t.IntType(nullable=False)), ("name", t.BigIntType())], ["id"], lake="iceberg")
    with pytest.raises(LakeTableMismatchError, match="has columns"):
        lake_format(changed).table(changed)
    more_buckets = table_info(tmp_path, PK, ["id"], lake="iceberg", bucket_count=3)
    with pytest.raises(LakeTableMismatchError, match=r"bucket\[2\]"):
        lake_format(more_buckets).table(more_buckets)
    as_log = table_info(tmp_path, [("id", t.IntType(nullable=False)), ("name", t.StringType())], lake="iceberg")
    with pytest.raises(LakeTableMismatchError, match="key"):
        lake_format(as_log).table(as_log)


def test_a_table_someone_else_created_in_the_catalog_is_refused(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    catalog = SqlCatalog(DEFAULT_CATALOG_NAME, uri=f"sqlite:///{tmp_path}/{SQLITE_CATALOG_FILE}", warehouse=str(tmp_path))
    catalog.create_namespace("fluss")
    catalog.create_table("fluss.orders", pa.schema([pa.field("id", pa.int32())]))
    with pytest.raises(LakeTableMismatchError, match="belongs to strom table id None"):
        lake_format(info).table(info)


def test_configuration_errors(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    document = json.loads(info.table_json)
    del document["properties"]["table.datalake.iceberg.warehouse"]
    missing = TableInfo.from_record(TableRecord(1, "fluss", "x", json.dumps(document).encode(), 1, 0, 0))
    with pytest.raises(InvalidConfigError, match="warehouse"):
        lake_format(missing)
    with pytest.raises(InvalidConfigError, match="local warehouse"):
        IcebergLakeFormat({"warehouse": "s3://bucket/lake"})
    rest = IcebergLakeFormat({"type": "rest", "uri": "http://localhost:1/catalog", "warehouse": "s3://bucket/lake"})
    assert rest.catalog_properties == {"type": "rest", "uri": "http://localhost:1/catalog", "warehouse": "s3://bucket/lake"}


def test_tables_iceberg_cannot_hold_are_refused(tmp_path: Path) -> None:
    clash = table_info(tmp_path, [("id", t.IntType()), ("__offset", t.BigIntType())], name="clash", lake="iceberg")
    with pytest.raises(InvalidTableError, match="reserves"):
        lake_format(clash).table(clash)
    composite = table_info(
        tmp_path, [("a", t.IntType(nullable=False)), ("b", t.IntType(nullable=False))], ["a", "b"], name="composite",
        lake="iceberg",
    )
    with pytest.raises(InvalidTableError, match="one column"):
        lake_format(composite).table(composite)
    by_double = table_info(
        tmp_path, [("d", t.DoubleType(nullable=False)), ("v", t.IntType())], ["d"], name="by_double", lake="iceberg",
    )
    with pytest.raises(InvalidTableError, match="must not be float or double"):
        lake_format(by_double).table(by_double)
    by_flag = table_info(
        tmp_path, [("f", t.BooleanType(nullable=False)), ("v", t.IntType())], ["f"], name="by_flag", lake="iceberg",
    )
    with pytest.raises(InvalidTableError, match="bucket key 'f' of type boolean cannot be an Iceberg bucket partition"):
        lake_format(by_flag).table(by_flag)


def test_a_lake_table_pickles_as_its_catalog_and_reads_after_unpickling(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"], lake="iceberg")
    table = iceberg_table(info)
    rows = pa.record_batch({"id": pa.array([1], pa.int32()), "name": ["a"]})
    version = table.commit([write_split(table, 0, rows, [0])], {})
    copy = pickle.loads(pickle.dumps(table))
    assert isinstance(copy, IcebergLakeTable) and copy.uri == table.uri
    assert pa.Table.from_batches(list(copy.read_bucket(version, 0, None))).to_pylist() == [{"id": 1, "name": "a"}]


def test_a_relative_warehouse_is_pinned_to_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    info = table_info("lake", PK, ["id"], lake="iceberg")
    assert iceberg_table(info).uri == f"{tmp_path}/lake/fluss/orders"
