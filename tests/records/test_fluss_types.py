"""Fluss types: JSON form, Arrow mapping, and a cross-check against pyfluss's own mapping."""

from __future__ import annotations

import random

import fluss
import pyarrow as pa
import pytest

from strom.records.types import (
    ArrayType,
    BigIntType,
    BinaryType,
    BooleanType,
    BytesType,
    CharType,
    DataField,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntType,
    MapType,
    RowType,
    SmallIntType,
    StringType,
    TimestampLtzType,
    TimestampType,
    TimeType,
    TinyIntType,
    data_type_from_json,
    data_type_to_json,
    from_arrow_field,
    from_arrow_type,
    to_arrow_field,
    to_arrow_type,
)
from tests.records.row_values import random_type

# (type, its JSON, its Arrow type) for every type root.
EVERY_TYPE = [
    (BooleanType(), {"type": "BOOLEAN"}, pa.bool_()),
    (TinyIntType(), {"type": "TINYINT"}, pa.int8()),
    (SmallIntType(), {"type": "SMALLINT"}, pa.int16()),
    (IntType(nullable=False), {"type": "INTEGER", "nullable": False}, pa.int32()),
    (BigIntType(), {"type": "BIGINT"}, pa.int64()),
    (FloatType(), {"type": "FLOAT"}, pa.float32()),
    (DoubleType(), {"type": "DOUBLE"}, pa.float64()),
    (CharType(3), {"type": "CHAR", "length": 3}, pa.utf8()),
    (StringType(), {"type": "STRING"}, pa.utf8()),
    (DecimalType(10, 2), {"type": "DECIMAL", "precision": 10, "scale": 2}, pa.decimal128(10, 2)),
    (DecimalType(38, 0), {"type": "DECIMAL", "precision": 38, "scale": 0}, pa.decimal128(38, 0)),
    (DateType(), {"type": "DATE"}, pa.date32()),
    (TimeType(0), {"type": "TIME_WITHOUT_TIME_ZONE", "precision": 0}, pa.time32("s")),
    (TimeType(2), {"type": "TIME_WITHOUT_TIME_ZONE", "precision": 2}, pa.time32("ms")),
    (TimeType(5), {"type": "TIME_WITHOUT_TIME_ZONE", "precision": 5}, pa.time64("us")),
    (TimeType(9), {"type": "TIME_WITHOUT_TIME_ZONE", "precision": 9}, pa.time64("ns")),
    (TimestampType(0), {"type": "TIMESTAMP_WITHOUT_TIME_ZONE", "precision": 0}, pa.timestamp("s")),
    (TimestampType(3), {"type": "TIMESTAMP_WITHOUT_TIME_ZONE", "precision": 3}, pa.timestamp("ms")),
    (TimestampType(6), {"type": "TIMESTAMP_WITHOUT_TIME_ZONE", "precision": 6}, pa.timestamp("us")),
    (TimestampType(8), {"type": "TIMESTAMP_WITHOUT_TIME_ZONE", "precision": 8}, pa.timestamp("ns")),
    (
        TimestampLtzType(1),
        {"type": "TIMESTAMP_WITH_LOCAL_TIME_ZONE", "precision": 1},
        pa.timestamp("ms", tz="UTC"),
    ),
    (
        TimestampLtzType(9),
        {"type": "TIMESTAMP_WITH_LOCAL_TIME_ZONE", "precision": 9},
        pa.timestamp("ns", tz="UTC"),
    ),
    (BytesType(), {"type": "BYTES"}, pa.binary()),
    (BinaryType(16), {"type": "BINARY", "length": 16}, pa.binary(16)),
    (
        ArrayType(IntType(nullable=False)),
        {"type": "ARRAY", "element_type": {"type": "INTEGER", "nullable": False}},
        pa.list_(pa.field("item", pa.int32(), nullable=False)),
    ),
    (
        MapType(StringType(), DoubleType()),
        {"type": "MAP", "key_type": {"type": "STRING", "nullable": False}, "value_type": {"type": "DOUBLE"}},
        pa.map_(pa.field("key", pa.utf8(), nullable=False), pa.field("value", pa.float64())),
    ),
    (
        RowType((DataField("x", IntType(), "the x", 6), DataField("y", StringType(nullable=False), None, 7))),
        {
            "type": "ROW",
            "fields": [
                {"name": "x", "field_type": {"type": "INTEGER"}, "description": "the x", "field_id": 6},
                {"name": "y", "field_type": {"type": "STRING", "nullable": False}, "field_id": 7},
            ],
        },
        pa.struct([pa.field("x", pa.int32()), pa.field("y", pa.utf8(), nullable=False)]),
    ),
]


@pytest.mark.parametrize(("fluss_type", "json_obj", "arrow_type"), EVERY_TYPE, ids=lambda v: str(v))
def test_every_type_has_fluss_json_and_client_arrow_type(fluss_type, json_obj, arrow_type):
    assert data_type_to_json(fluss_type) == json_obj
    assert list(data_type_to_json(fluss_type)) == list(json_obj)  # Java's key order
    assert data_type_from_json(json_obj) == fluss_type
    assert to_arrow_type(fluss_type) == arrow_type
    field = to_arrow_field("c", fluss_type)
    assert field.nullable == fluss_type.nullable
    assert field.type == arrow_type


def test_arrow_nested_layout_names_and_nullability():
    list_type = to_arrow_type(ArrayType(StringType()))
    assert list_type.value_field.name == "item" and list_type.value_field.nullable
    map_type = to_arrow_type(MapType(IntType(), IntType(nullable=False)))
    assert map_type.key_field.name == "key" and not map_type.key_field.nullable
    assert map_type.item_field.name == "value" and not map_type.item_field.nullable
    # the entries struct: named "entries", itself not null
    rendered = pa.schema([pa.field("m", map_type)]).to_string()
    assert "entries: struct<key: int32 not null, value: int32 not null> not null" in rendered
    ltz = to_arrow_type(TimestampLtzType(6))
    assert ltz.tz == "UTC" and ltz.unit == "us"
    assert to_arrow_type(StringType()) != pa.large_utf8()


def test_json_defaults_match_the_clients():
    assert data_type_from_json({"type": "TIMESTAMP_WITHOUT_TIME_ZONE"}) == TimestampType(6)
    assert data_type_from_json({"type": "TIMESTAMP_WITH_LOCAL_TIME_ZONE"}) == TimestampLtzType(6)
    assert data_type_from_json({"type": "TIME_WITHOUT_TIME_ZONE"}) == TimeType(0)
    assert data_type_from_json({"type": "DECIMAL", "precision": 7}) == DecimalType(7, 0)
    assert data_type_from_json(
        {"type": "ROW", "fields": [{"name": "a", "field_type": {"type": "DATE"}}]}
    ) == (RowType((DataField("a", DateType(), None, -1),)))


def test_map_keys_are_always_not_null():
    assert MapType(IntType(), IntType()).key == IntType(nullable=False)
    parsed = data_type_from_json(
        {"type": "MAP", "key_type": {"type": "INTEGER"}, "value_type": {"type": "DATE"}}
    )
    assert parsed.key.nullable is False
    assert data_type_to_json(parsed)["key_type"] == {"type": "INTEGER", "nullable": False}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"precision": 3}, "'type'"),
        ({"type": "VARCHAR"}, "unknown data type"),
        ({"type": "DECIMAL", "scale": 2}, "'precision'"),
        ({"type": "DECIMAL", "precision": 39}, "precision"),
        ({"type": "CHAR"}, "'length'"),
        ({"type": "TIMESTAMP_WITHOUT_TIME_ZONE", "precision": 10}, "precision"),
        ({"type": "ARRAY"}, "'element_type'"),
        ({"type": "ROW", "fields": {}}, "'fields'"),
        ({"type": "INTEGER", "nullable": "no"}, "nullable"),
    ],
)
def test_invalid_json_types_raise_value_error(bad, message):
    with pytest.raises(ValueError, match=message):
        data_type_from_json(bad)


@pytest.mark.parametrize("seed", range(100))
def test_random_types_round_trip_through_json_and_arrow(seed):
    t = random_type(random.Random(seed), depth_max=4)
    assert data_type_from_json(data_type_to_json(t)) == t, f"seed={seed}"
    back = from_arrow_field(to_arrow_field("c", t))
    assert to_arrow_type(back) == to_arrow_type(t), f"seed={seed} type={t}"


def test_from_arrow_accepts_dataframe_variants():
    assert from_arrow_type(pa.large_string()) == StringType()
    assert from_arrow_type(pa.large_binary()) == BytesType()
    assert from_arrow_type(pa.date64()) == DateType()
    assert from_arrow_type(pa.uint16()) == SmallIntType()
    assert from_arrow_type(pa.timestamp("us", tz="Europe/Paris")) == TimestampLtzType(6)
    assert from_arrow_type(pa.large_list(pa.int8())) == ArrayType(TinyIntType())
    assert from_arrow_field(pa.field("x", pa.int32(), nullable=False)) == IntType(nullable=False)
    with pytest.raises(TypeError):
        from_arrow_type(pa.float16())


# ---------------------------------------------------------------------------------------
# Cross-check with pyfluss (no server needed): fluss.Schema(pa_schema) runs the Rust
# client's from_arrow conversion and reports each column as a string. Its Fluss->Arrow
# direction needs a server (FlussTable.arrow_schema), so it is checked here only as the
# inverse: our Arrow type must map back to the same Fluss type in the client.
# ---------------------------------------------------------------------------------------


def _pyfluss_string(t: DataType) -> str:
    """The column-type string of fluss-rust's Python binding (``Utils::datatype_to_string``)."""
    if isinstance(t, TimeType):
        text = "time" if t.precision == 0 else f"time({t.precision})"
    elif isinstance(t, TimestampType):
        text = "timestamp" if t.precision == 6 else f"timestamp({t.precision})"
    elif isinstance(t, TimestampLtzType):
        text = "timestamp_ltz" if t.precision == 6 else f"timestamp_ltz({t.precision})"
    elif isinstance(t, (CharType, BinaryType)):
        text = f"{'char' if isinstance(t, CharType) else 'binary'}({t.length})"
    elif isinstance(t, DecimalType):
        text = f"decimal({t.precision},{t.scale})"
    elif isinstance(t, ArrayType):
        text = f"array<{_pyfluss_string(t.element)}>"
    elif isinstance(t, MapType):
        text = f"map<{_pyfluss_string(t.key)},{_pyfluss_string(t.value)}>"
    elif isinstance(t, RowType):
        text = "row<" + ", ".join(f"{f.name}: {_pyfluss_string(f.type)}" for f in t.fields) + ">"
    elif isinstance(t, IntType):
        text = "int"
    else:
        text = t.type_root.lower()
    return text if t.nullable else text + " NOT NULL"


def _canonical(t: DataType) -> DataType:
    """What survives Fluss -> Arrow -> Fluss: CHAR becomes STRING, precisions snap to units."""
    return from_arrow_field(to_arrow_field("c", t))


ARROW_SAMPLES = [
    pa.field("a", pa.int32(), nullable=False),
    pa.field("b", pa.large_string()),
    pa.field("c", pa.timestamp("us")),
    pa.field("d", pa.timestamp("ns", tz="UTC")),
    pa.field("e", pa.decimal128(20, 3)),
    pa.field("f", pa.list_(pa.int64())),
    pa.field("g", pa.map_(pa.string(), pa.int32())),
    pa.field("h", pa.struct([("x", pa.int8()), pa.field("y", pa.binary(4), nullable=False)])),
    pa.field("i", pa.time32("s")),
    pa.field("j", pa.time64("ns")),
    pa.field("k", pa.date32()),
    pa.field("l", pa.binary()),
    pa.field("m", pa.timestamp("s", tz="UTC")),
    pa.field("n", pa.list_(pa.field("item", pa.struct([("z", pa.time32("ms"))]), nullable=False))),
]


def test_from_arrow_matches_pyfluss_schema_conversion():
    schema = fluss.Schema(pa.schema(ARROW_SAMPLES))
    ours = [_pyfluss_string(from_arrow_field(f)) for f in ARROW_SAMPLES]
    assert schema.get_column_types() == ours


@pytest.mark.parametrize("seed", range(40))
def test_our_arrow_types_map_back_to_the_same_type_in_pyfluss(seed):
    rng = random.Random(seed)
    types = [random_type(rng, depth_max=3) for _ in range(6)]
    fields = [to_arrow_field(f"c{i}", t) for i, t in enumerate(types)]
    expected = [_pyfluss_string(_canonical(t)) for t in types]
    assert fluss.Schema(pa.schema(fields)).get_column_types() == expected, f"seed={seed}"


def test_dictionary_encoded_columns_map_to_their_value_type():
    assert from_arrow_type(pa.dictionary(pa.int32(), pa.string())) == StringType()
