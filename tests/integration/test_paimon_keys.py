"""A cluster whose lake format is Paimon, end to end through a real server: every table carries
``table.datalake.format=paimon`` from its creation, so the official client (pyfluss, whose Rust core has
its own Paimon key encoder) and strom's client encode and bucket keys the same way: rows either one writes,
the other finds by key, in the bucket Paimon's hash gives them."""

from __future__ import annotations

import fluss as pyfluss
import pyarrow as pa
import pytest

from strom.client import Connection, TablePath
from strom.records import keys
from strom.records import types as t
from tests.integration.pyfluss_support import create_table, lookup_many
from tests.server_process import ServerProcess

pytestmark = pytest.mark.asyncio

PAIMON = {"datalake.format": "paimon"}
BUCKETS = 3
FIELDS = [pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string(), nullable=False),
          pa.field("v", pa.string())]


async def test_pyfluss_and_stroms_client_agree_on_paimon_keys(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = ServerProcess(tmp_path / "data", PAIMON).start()
    official = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": server.address}))
    try:
        path, table = await create_table(official, FIELDS, primary_keys=["id", "name"], bucket_count=BUCKETS)
        writer = table.new_upsert().create_writer()
        for i in range(0, 60):
            writer.upsert({"id": i * 977, "name": f"key-name-{i}" if i % 2 else "k", "v": f"py{i}"})
        await writer.flush()
        async with await Connection.create(server.address) as connection:
            ours = await connection.get_table(TablePath(path.database_name, path.table_name))
            assert ours.table_info.properties["table.datalake.format"] == "paimon"
            lookuper = ours.new_lookup().create_lookuper()
            for i in range(0, 60, 7):
                row = await lookuper.lookup({"id": i * 977, "name": f"key-name-{i}" if i % 2 else "k"})
                assert row is not None and row["v"] == f"py{i}", i
            await ours.new_upsert().create_writer().upsert_batch(pa.table({
                "id": pa.array([10_000 + i for i in range(20)], pa.int64()),
                "name": [f"strom-{i}" for i in range(20)], "v": [f"st{i}" for i in range(20)]}))
            found = await lookup_many(table, [{"id": 10_000 + i, "name": f"strom-{i}"} for i in range(20)])
            assert [None if r is None else r["v"] for r in found] == [f"st{i}" for i in range(20)]

            scanner = ours.new_scan().create_log_scanner()
            scanner.subscribe_buckets({b: 0 for b in range(BUCKETS)})
            row_type = t.RowType.of(("id", t.BigIntType(nullable=False)), ("name", t.StringType(nullable=False)))
            encoder = keys.key_encoder(row_type, [0, 1], keys.PAIMON)
            bucket_of = keys.bucket_function(keys.PAIMON)
            seen: dict[int, int] = {}
            for _ in range(40):
                for batch in await scanner.poll(500):
                    for key_id, name in zip(batch.batch.column("id").to_pylist(), batch.batch.column("name").to_pylist(),
                                            strict=True):
                        seen[key_id] = batch.bucket.bucket
                        assert batch.bucket.bucket == bucket_of(encoder.encode_key([key_id, name]), BUCKETS), key_id
                if len(seen) >= 80:
                    break
            assert len(seen) == 80 and set(seen.values()) == set(range(BUCKETS)), (
                "every row of both clients is in the bucket Paimon's hash gives it")
    finally:
        await official.close()
        server.stop()
