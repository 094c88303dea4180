"""Tables whose columns are NOT NULL (what a DataFrame of typed sources gives): every path that encodes keys
alone — ``lookup``, ``lookup_arrow``, the blocking lookuper, deletes — works whatever the nullability of the
columns beside the key, for every key type, against a real server."""

from __future__ import annotations

import asyncio
import datetime
import decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strom.client import Connection, Schema, TableDescriptor, TablePath
from tests.conftest import unique_name

KEY_TYPES: dict[str, tuple[pa.DataType, list[object]]] = {
    "int": (pa.int32(), [1, -7, 2_000_000_000]),
    "bigint": (pa.int64(), [1, -(2**62), 2**40]),
    "smallint": (pa.int16(), [1, -300, 32_000]),
    "string": (pa.string(), ["a", "", "ключ"]),
    "bytes": (pa.binary(), [b"\x00", b"", b"key"]),
    "date": (pa.date32(), [datetime.date(2024, 1, 1), datetime.date(1970, 1, 1), datetime.date(2100, 12, 31)]),
    "timestamp": (pa.timestamp("us"), [datetime.datetime(2024, 1, 1, 12), datetime.datetime(1999, 5, 5),
                                       datetime.datetime(2030, 2, 2, 2, 2, 2, 2)]),
    "decimal": (pa.decimal128(10, 2), [decimal.Decimal("1.50"), decimal.Decimal("-3.00"), decimal.Decimal("12345.67")]),
}
VALUE_TYPES: list[tuple[pa.DataType, object]] = [
    (pa.int64(), 42), (pa.string(), "value"), (pa.float64(), 1.5), (pa.bool_(), True), (pa.int32(), -1),
]


@st.composite
def tables(draw: st.DrawFn) -> tuple[pa.Schema, list[str], list[dict[str, object]]]:
    """A schema of 1–2 key columns of any key type and 1–3 value columns, each NOT NULL or not; 3 rows."""
    key_names = draw(st.lists(st.sampled_from(sorted(KEY_TYPES)), min_size=1, max_size=2, unique=True))
    values = draw(st.lists(st.sampled_from(range(len(VALUE_TYPES))), min_size=1, max_size=3))
    fields = [pa.field(f"k_{name}", KEY_TYPES[name][0], nullable=False) for name in key_names]
    fields += [pa.field(f"v{i}", VALUE_TYPES[kind][0], nullable=draw(st.booleans())) for i, kind in enumerate(values)]
    rows = []
    for row in range(3):
        record = {f"k_{name}": KEY_TYPES[name][1][row] for name in key_names}
        record.update({f"v{i}": VALUE_TYPES[kind][1] for i, kind in enumerate(values)})
        rows.append(record)
    return pa.schema(fields), [f"k_{name}" for name in key_names], rows


async def check_table(address: str, schema: pa.Schema, key: list[str], rows: list[dict[str, object]]) -> None:
    path = TablePath("fluss", unique_name("not_null"))
    async with await Connection.create(address) as connection:
        await connection.get_admin().create_table(
            path, TableDescriptor(Schema.from_arrow(schema, primary_key=key), bucket_count=2))
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        await writer.upsert_batch(pa.Table.from_pylist(rows, schema=schema))
        keys = [{name: row[name] for name in key} for row in rows]
        lookuper = table.new_lookup().create_lookuper()
        assert [await lookuper.lookup(k) for k in keys] == rows
        found = await lookuper.lookup_arrow(pa.Table.from_pylist(keys, schema=pa.schema([schema.field(n) for n in key])))
        assert found.to_pylist() == rows
        with table.new_lookup().create_blocking_lookuper() as blocking:
            assert await asyncio.to_thread(lambda: [blocking.lookup(k) for k in keys]) == rows
        await writer.delete(keys[0]).wait()
        await writer.flush()
        assert await lookuper.lookup(keys[0]) is None
        remaining = await lookuper.lookup_arrow(pa.Table.from_pylist(keys, schema=pa.schema([schema.field(n) for n in key])))
        assert remaining.to_pylist() == rows[1:]


def test_key_paths_work_on_every_nullability_mix(server) -> None:  # type: ignore[no-untyped-def]
    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(tables())
    def run(table: tuple[pa.Schema, list[str], list[dict[str, object]]]) -> None:
        asyncio.run(check_table(server.address, *table))

    run()


@pytest.mark.asyncio
async def test_lookup_arrow_on_a_table_of_only_not_null_columns(server) -> None:  # type: ignore[no-untyped-def]
    """The case a Spark key filter hit: a table created from a DataFrame whose columns are all NOT NULL."""
    schema = pa.schema([pa.field("id", pa.int32(), nullable=False), pa.field("v", pa.int64(), nullable=False),
                        pa.field("s", pa.string(), nullable=False)])
    rows = [{"id": i, "v": i * 10, "s": f"s{i}"} for i in range(5)]
    await check_table(server.address, schema, ["id"], rows)
