"""Schema, TableDescriptor and DatabaseDescriptor JSON, with Fluss's normalisation rules."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from strom.records.schema import Column, DatabaseDescriptor, Schema, TableDescriptor
from strom.records.types import (
    ArrayType,
    DataField,
    DecimalType,
    IntType,
    MapType,
    RowType,
    StringType,
    TimestampType,
)

# The table_json pyfluss sent for a table without bucket_count (research doc, section 3.8).
SAMPLE_TABLE_JSON = (
    '{"bucket_key":["id"],"comment":"hello","custom_properties":{},"partition_key":[],"properties":{},'
    '"schema":{"columns":[{"data_type":{"nullable":false,"type":"INTEGER"},"id":0,"name":"id"},'
    '{"data_type":{"precision":6,"type":"TIMESTAMP_WITHOUT_TIME_ZONE"},"id":1,"name":"ts"},'
    '{"data_type":{"precision":10,"scale":2,"type":"DECIMAL"},"id":2,"name":"d"},'
    '{"data_type":{"element_type":{"type":"STRING"},"type":"ARRAY"},"id":3,"name":"tags"},'
    '{"data_type":{"key_type":{"nullable":false,"type":"STRING"},"type":"MAP","value_type":{"type":"INTEGER"}},'
    '"id":4,"name":"m"},'
    '{"data_type":{"fields":[{"field_id":6,"field_type":{"type":"INTEGER"},"name":"x"}],"type":"ROW"},'
    '"id":5,"name":"r"}],'
    '"highest_field_id":6,"primary_key":["id"],"version":1},"version":1}'
)


def test_sample_table_json_round_trips():
    descriptor = TableDescriptor.from_json(SAMPLE_TABLE_JSON.encode())
    assert json.loads(descriptor.to_json()) == json.loads(SAMPLE_TABLE_JSON)
    assert TableDescriptor.from_json(descriptor.to_json()) == descriptor
    schema = descriptor.schema
    assert schema.column_names == ["id", "ts", "d", "tags", "m", "r"]
    assert schema.primary_key == ("id",) and schema.primary_key_indexes == (0,)
    assert schema.highest_field_id == 6
    assert schema.row_type.fields[5] == DataField(
        "r", RowType((DataField("x", IntType(), None, 6),)), None, 5
    )
    assert descriptor.comment == "hello" and descriptor.bucket_count is None
    assert descriptor.has_primary_key and not descriptor.is_partitioned
    assert descriptor.physical_primary_key == ("id",)
    assert descriptor.kv_format == "COMPACTED"


def test_serialised_json_uses_javas_key_order_and_compact_separators():
    descriptor = TableDescriptor.from_json(SAMPLE_TABLE_JSON).with_bucket_count(3)
    text = descriptor.to_json().decode()
    assert text.startswith('{"version":1,"schema":{"version":1,"columns":[{"name":"id","data_type":')
    top_keys = list(json.loads(text))
    assert top_keys == [
        "version", "schema", "comment", "partition_key", "bucket_key", "bucket_count",
        "properties", "custom_properties",
    ]  # fmt: skip
    assert json.loads(text)["bucket_count"] == 3


def test_schema_json_is_the_schema_object_alone():
    schema = TableDescriptor.from_json(SAMPLE_TABLE_JSON).schema
    assert Schema.from_json(schema.to_json_bytes()) == schema
    assert list(schema.to_json()) == ["version", "columns", "primary_key", "highest_field_id"]
    assert schema.arrow_schema == pa.schema(
        [
            pa.field("id", pa.int32(), nullable=False),
            pa.field("ts", pa.timestamp("us")),
            pa.field("d", pa.decimal128(10, 2)),
            pa.field("tags", pa.list_(pa.utf8())),
            pa.field("m", pa.map_(pa.field("key", pa.utf8(), nullable=False), pa.int32())),
            pa.field("r", pa.struct([("x", pa.int32())])),
        ]
    )


@pytest.mark.parametrize("missing", ["schema", "partition_key", "properties", "custom_properties"])
def test_missing_required_keys_are_rejected(missing):
    obj = json.loads(SAMPLE_TABLE_JSON)
    del obj[missing]
    with pytest.raises(ValueError, match=missing):
        TableDescriptor.from_json(json.dumps(obj))


def test_unknown_keys_are_tolerated_and_scalar_properties_stringified():
    obj = json.loads(SAMPLE_TABLE_JSON)
    obj["future_field"] = {"x": 1}
    obj["schema"]["columns"][0]["future"] = True
    obj["properties"] = {"table.replication.factor": 3}
    descriptor = TableDescriptor.from_json(json.dumps(obj))
    assert descriptor.properties == {"table.replication.factor": "3"}


@pytest.mark.parametrize("garbage", [b"\xff", b"[1]", b"{", b'{"schema": 1}'])
def test_garbage_is_a_value_error(garbage):
    with pytest.raises(ValueError):
        TableDescriptor.from_json(garbage)


def test_primary_key_columns_become_not_null_and_ids_are_assigned_depth_first():
    schema = Schema.of(
        [
            ("a", IntType()),
            ("r", RowType.of(("x", IntType()), ("y", ArrayType(RowType.of(("z", StringType())))))),
            ("b", StringType()),
        ],
        primary_key=["a"],
    )
    assert schema.columns[0].data_type == IntType(nullable=False)
    # column r takes id 1, then its fields 2 (x), 3 (y) and 4 (y's element z); b comes after
    assert [c.column_id for c in schema.columns] == [0, 1, 5]
    nested = schema.columns[1].data_type
    assert [f.field_id for f in nested.fields] == [2, 3]
    assert nested.fields[1].type.element.fields[0].field_id == 4
    assert schema.highest_field_id == 5


def test_mixed_or_duplicate_ids_are_rejected():
    with pytest.raises(ValueError, match="every column has an id"):
        Schema((Column("a", IntType(), column_id=0), Column("b", IntType())))
    with pytest.raises(ValueError, match="unique"):
        Schema((Column("a", IntType(), column_id=0), Column("b", IntType(), column_id=0)))
    with pytest.raises(ValueError, match="duplicate column"):
        Schema.of([("a", IntType()), ("a", StringType())])
    with pytest.raises(ValueError, match="not in the schema"):
        Schema.of([("a", IntType())], primary_key=["b"])


def test_bucket_keys_default_to_the_physical_primary_key():
    schema = Schema.of([("dt", StringType()), ("id", IntType()), ("v", DecimalType(20, 2))], ["dt", "id"])
    descriptor = TableDescriptor(schema, partition_keys=("dt",))
    assert descriptor.bucket_keys == ("id",)
    assert descriptor.physical_primary_key == ("id",)
    assert descriptor.is_partitioned
    with pytest.raises(ValueError, match="subset of the primary key"):
        TableDescriptor(schema, bucket_keys=("v",))
    with pytest.raises(ValueError, match="must not include partition keys"):
        TableDescriptor(schema, partition_keys=("dt",), bucket_keys=("dt",))
    with pytest.raises(ValueError, match="part of the primary key"):
        TableDescriptor(schema, partition_keys=("v",))


def test_log_table_without_distribution_omits_bucket_keys_until_a_count_is_set():
    schema = Schema.of([("ts", TimestampType(3)), ("msg", StringType())])
    descriptor = TableDescriptor(schema, properties={"table.log.format": "ARROW"})
    assert "bucket_key" not in json.loads(descriptor.to_json())
    with_count = json.loads(descriptor.with_bucket_count(4).to_json())
    assert with_count["bucket_key"] == [] and with_count["bucket_count"] == 4


def test_map_keys_in_columns_serialise_as_not_null():
    schema = Schema.of([("m", MapType(StringType(), IntType()))])
    assert schema.to_json()["columns"][0]["data_type"]["key_type"] == {"type": "STRING", "nullable": False}


def test_database_descriptor_json():
    assert DatabaseDescriptor().to_json() == b'{"version":1,"custom_properties":{}}'
    descriptor = DatabaseDescriptor("sales", {"owner": "ana"})
    assert descriptor.to_json() == b'{"version":1,"comment":"sales","custom_properties":{"owner":"ana"}}'
    assert DatabaseDescriptor.from_json(descriptor.to_json()) == descriptor
    assert DatabaseDescriptor.from_json("{}") == DatabaseDescriptor()


def test_auto_increment_column_must_be_an_integer_non_key_column():
    columns = (Column("id", IntType()), Column("seq", IntType()), Column("s", StringType()))
    schema = Schema(columns, ("id",), auto_increment_columns=("seq",))
    assert schema.to_json()["auto_increment_column"] == ["seq"]
    assert Schema.from_json(schema.to_json()) == schema
    with pytest.raises(ValueError, match="INT or BIGINT"):
        Schema(columns, ("id",), auto_increment_columns=("s",))
    with pytest.raises(ValueError, match="non-key column"):
        Schema(columns, ("id",), auto_increment_columns=("id",))
