"""The server opens its buckets through the RocksDB binding ``kv.rocksdb.binding`` names, says which at start
and in its metrics, and a bucket written through one binding is served after a restart on the other."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.kv import rocksdb
from tests.server_process import ServerProcess, free_port

pytestmark = pytest.mark.skipif(not rocksdb.NATIVE_AVAILABLE, reason="the native binding is not built here")

ROWS = 2_000


async def _write(address: str, start: int) -> None:
    async with await Connection.create(address) as connection:
        path = TablePath("fluss", "switched")
        admin = connection.get_admin()
        schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
        await admin.create_table(path, TableDescriptor(schema, bucket_count=2), ignore_if_exists=True)
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        ids = list(range(start, start + ROWS))
        await writer.upsert_batch(pa.table({"id": ids, "v": [f"v{i}" for i in ids]}))


async def _read(address: str, ids: list[int]) -> list[str | None]:
    async with await Connection.create(address) as connection:
        table = await connection.get_table(TablePath("fluss", "switched"))
        found = await table.new_lookup().create_lookuper().lookup_arrow(pa.table({"id": pa.array(ids, pa.int64())}))
        by_id = dict(zip(found.column("id").to_pylist(), found.column("v").to_pylist(), strict=True))
        return [by_id.get(i) for i in ids]


def _binding_metric(port: int) -> str:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    (line,) = [line for line in body.splitlines() if line.startswith("strom_kv_rocksdb_binding_info")]
    return line


def test_a_bucket_moves_between_bindings_across_restarts(tmp_path: Path) -> None:
    metrics_port = free_port()
    data = tmp_path / "data"
    for round_, binding in enumerate(("rocksdict", "native", "rocksdict")):
        server = ServerProcess(data, {"kv.rocksdb.binding": binding, "kv.snapshot.interval": "0s",
                                      "metrics.reporter.prometheus.port": str(metrics_port)}).start()
        try:
            asyncio.run(_write(server.address, round_ * ROWS))
            ids = [0, ROWS - 1, ROWS, 2 * ROWS - 1, 3 * ROWS - 1]
            expected = [f"v{i}" if i < (round_ + 1) * ROWS else None for i in ids]
            assert asyncio.run(_read(server.address, ids)) == expected
            version = "9.10.0" if binding == "native" else rocksdb.ROCKSDICT_ROCKSDB_VERSION
            assert f"RocksDB {version} through the {binding} binding" in server.log_text()
            assert _binding_metric(metrics_port) == (
                f'strom_kv_rocksdb_binding_info{{binding="{binding}",rocksdb_version="{version}"}} 1.0'
            )
        finally:
            assert server.stop() == 0, server.log_text()[-3000:]


def test_an_unknown_binding_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"kv\.rocksdb\.binding"):
        ServerProcess(tmp_path / "data", {"kv.rocksdb.binding": "leveldb"}).start()
