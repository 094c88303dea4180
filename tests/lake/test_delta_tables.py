"""Creating and opening the Delta copy of a strom table: idempotent, race-safe, and refusing a location
that holds another table's copy."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from deltalake import DeltaTable

from strom.errors import InvalidConfigError, InvalidTableError
from strom.lake.delta import TABLE_ID_CONFIGURATION, DeltaLakeTable
from strom.lake.format import LakeTableMismatchError
from strom.lake.formats import lake_format
from strom.metadata.store import TableRecord
from strom.metadata.table_info import TableInfo
from strom.records import types as t
from tests.lake.duckdb_reader import rows_of
from tests.lake.support import TABLE_ID, create_concurrently, table_info, write_split

PK = [("id", t.IntType(nullable=False)), ("name", t.StringType())]


def test_create_is_idempotent_and_records_the_strom_table_id(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    first = lake_format(info).table(info)
    again = lake_format(info).table(info)
    assert first.uri == again.uri == f"{tmp_path}/fluss/orders"
    assert first.latest_snapshot_id() == again.latest_snapshot_id() == 0
    delta = DeltaTable(first.uri)
    assert delta.metadata().configuration[TABLE_ID_CONFIGURATION] == str(TABLE_ID)
    assert delta.metadata().partition_columns == ["__bucket"]
    assert [f.name for f in delta.schema().fields] == ["id", "name", "__bucket", "__offset", "__timestamp"]
    assert rows_of(first.uri, "SELECT count(*) FROM lake") == [(0,)]


def test_creators_racing_on_a_new_location_make_one_table(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    assert create_concurrently(info, 8) == []
    log = sorted(p.name for p in (tmp_path / "fluss" / "orders" / "_delta_log").glob("*.json"))
    assert log == [f"{0:020d}.json"], "one CREATE TABLE, no second one retried at version 1"


def test_a_recreated_strom_table_at_the_same_location_is_refused(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    lake_format(info).table(info)
    recreated = table_info(tmp_path, PK, ["id"], table_id=TABLE_ID + 1)
    with pytest.raises(LakeTableMismatchError, match=rf"belongs to strom table id {TABLE_ID}, not to 'fluss.orders'"):
        lake_format(recreated).table(recreated)
    assert isinstance(LakeTableMismatchError(), InvalidTableError)


def test_a_lake_table_with_another_schema_is_refused(tmp_path: Path) -> None:
    info = table_info(tmp_path, PK, ["id"])
    lake_format(info).table(info)
    changed = table_info(tmp_path, [("id", t.IntType(nullable=False)), ("name", t.BigIntType())], ["id"])
    with pytest.raises(LakeTableMismatchError, match="has columns"):
        lake_format(changed).table(changed)


def test_unknown_format_or_missing_warehouse_is_a_config_error(tmp_path: Path) -> None:
    hudi = table_info(tmp_path, PK, ["id"], properties={"table.datalake.format": "hudi"})
    with pytest.raises(InvalidConfigError, match="'hudi'"):
        lake_format(hudi)
    info = table_info(tmp_path, PK, ["id"])
    document = json.loads(info.table_json)
    del document["properties"]["table.datalake.delta.warehouse"]
    missing = TableInfo.from_record(TableRecord(1, "fluss", "x", json.dumps(document).encode(), 1, 0, 0))
    with pytest.raises(InvalidConfigError, match="warehouse"):
        lake_format(missing)


def test_system_column_names_and_unsupported_partition_key_types_are_refused(tmp_path: Path) -> None:
    clash = table_info(tmp_path, [("id", t.IntType()), ("__offset", t.BigIntType())], name="clash")
    with pytest.raises(InvalidTableError, match="reserves"):
        lake_format(clash).table(clash)
    by_time = table_info(
        tmp_path, [("id", t.IntType(nullable=False)), ("at", t.TimeType(0, nullable=False))], ["id", "at"],
        partition_keys=["at"], name="by_time",
    )
    with pytest.raises(InvalidTableError, match="partition key 'at'"):
        lake_format(by_time).table(by_time)


def test_a_lake_table_pickles_as_its_location_and_reads_after_unpickling(tmp_path: Path) -> None:
    import pyarrow as pa

    info = table_info(tmp_path, PK, ["id"])
    table = lake_format(info).table(info)
    rows = pa.record_batch({"id": pa.array([1], pa.int32()), "name": ["a"]})
    version = table.commit([write_split(table, 0, rows, [0])], {})
    copy = pickle.loads(pickle.dumps(table))
    assert isinstance(copy, DeltaLakeTable) and copy.uri == table.uri
    assert pa.Table.from_batches(list(copy.read_bucket(version, 0, None))).to_pylist() == [{"id": 1, "name": "a"}]


def test_a_relative_warehouse_is_pinned_to_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    info = table_info("lake", PK, ["id"])
    assert lake_format(info).table(info).uri == f"{tmp_path}/lake/fluss/orders"
