"""The REST gateway against strom's own client, same rows, same run.

One ``strom server`` and one ``strom gateway`` process in front of it, on loopback. A primary-key table of
two buckets takes ``--rows`` rows in batches of ``--batch`` (each acknowledged before the next is sent), then
``--lookups`` batched lookups of ``--batch`` keys each: strom's client (``upsert_batch``, ``lookup_many``
and ``lookup_arrow``), the gateway with JSON bodies (``rows:upsert``, ``lookup``; httpx, one kept-alive
connection), and the gateway with Arrow IPC bodies (upserts; lookups with Arrow keys in and Arrow rows out).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

import httpx
import pyarrow as pa

from bench.harness import BenchServer, free_port, report
from strom.client import Connection, Schema, TableDescriptor, TablePath

FIELDS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("score", pa.int64())])
READY_S = 30.0


def _rows(start: int, count: int, tag: str) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table({"id": ids, "name": [f"{tag}-{i}" for i in ids], "score": ids}, schema=FIELDS)


def _ipc_stream(table: pa.Table) -> bytes:
    """``table`` as an Arrow IPC stream (the gateway's Arrow request body)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return sink.getvalue().to_pybytes()


async def _client(address: str, path: TablePath, rows: int, batch: int, lookups: int) -> tuple[float, float, float]:
    async with await Connection.create(address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(Schema.from_arrow(FIELDS, ["id"]), bucket_count=2))
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        started = time.perf_counter()
        for start in range(0, rows, batch):
            await writer.upsert_batch(_rows(start, batch, "client"))
        upserts = rows / (time.perf_counter() - started)
        lookuper = table.new_lookup().create_lookuper()
        started = time.perf_counter()
        for round_ in range(lookups):
            first = (round_ * batch) % rows
            found = await lookuper.lookup_many([{"id": i} for i in range(first, first + batch)])
            assert all(row is not None for row in found)
        dicts = lookups * batch / (time.perf_counter() - started)
        started = time.perf_counter()
        for round_ in range(lookups):
            first = (round_ * batch) % rows
            keys = pa.table({"id": pa.array(range(first, first + batch), pa.int64())})
            assert (await lookuper.lookup_arrow(keys)).num_rows == batch  # type: ignore[union-attr]
        return upserts, dicts, lookups * batch / (time.perf_counter() - started)


def _gateway(base: str, path: TablePath, rows: int, batch: int, lookups: int) -> tuple[float, float, float, float]:
    table = f"{base}/v1/databases/{path.database_name}/tables/{path.table_name}"
    with httpx.Client(timeout=120) as http:
        created = http.post(f"{base}/v1/databases/{path.database_name}/tables", json={
            "name": path.table_name, "columns": [{"name": "id", "type": "BIGINT NOT NULL"},
                                                 {"name": "name", "type": "STRING"}, {"name": "score", "type": "BIGINT"}],
            "primary_key": ["id"], "bucket_count": 2})
        created.raise_for_status()
        started = time.perf_counter()
        for start in range(0, rows, batch):
            http.post(f"{table}/rows:upsert", json={"rows": _rows(start, batch, "json").to_pylist()}).raise_for_status()
        json_upserts = rows / (time.perf_counter() - started)
        started = time.perf_counter()
        for start in range(0, rows, batch):
            http.post(f"{table}/rows:upsert", content=_ipc_stream(_rows(start, batch, "arrow")),
                      headers={"content-type": "application/vnd.apache.arrow.stream"}).raise_for_status()
        arrow_upserts = rows / (time.perf_counter() - started)
        started = time.perf_counter()
        for round_ in range(lookups):
            first = (round_ * batch) % rows
            answer = http.post(f"{table}/lookup", json={"keys": [{"id": i} for i in range(first, first + batch)]})
            answer.raise_for_status()
            assert all(row is not None for row in answer.json()["rows"])
        json_lookups = lookups * batch / (time.perf_counter() - started)
        started = time.perf_counter()
        for round_ in range(lookups):
            first = (round_ * batch) % rows
            keys = pa.table({"id": pa.array(range(first, first + batch), pa.int64())})
            answer = http.post(f"{table}/lookup", content=_ipc_stream(keys),
                               headers={"content-type": "application/vnd.apache.arrow.stream"})
            answer.raise_for_status()
            assert pa.ipc.open_stream(answer.content).read_all().num_rows == batch
        return json_upserts, arrow_upserts, json_lookups, lookups * batch / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--lookups", type=int, default=200)
    args = parser.parse_args()
    with BenchServer({"kv.snapshot.interval": "0s"}) as server:
        port = free_port()
        gateway = subprocess.Popen([sys.executable, "-m", "strom.cli.main", "gateway", "--bootstrap", server.address,
                                    "--bind", f"127.0.0.1:{port}", "--log-level", "WARNING",
                                    # batches above Fluss's default limits (128 lookup keys, 10 000 rows)
                                    "-D", f"gateway.rest.lookup.max-keys={max(args.batch, 128)}",
                                    "-D", f"gateway.rest.write.max-rows={max(args.batch, 10_000)}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + READY_S
            while True:
                try:
                    if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the gateway did not become ready"
                time.sleep(0.1)
            client_up, client_look, client_arrow_look = asyncio.run(
                _client(server.address, TablePath("fluss", "through_client"), args.rows, args.batch, args.lookups))
            json_up, arrow_up, json_look, arrow_look = _gateway(base, TablePath("fluss", "through_gateway"),
                                                                args.rows, args.batch, args.lookups)
        finally:
            gateway.terminate()
            gateway.wait(30)
    report(f"REST gateway against strom's client, {args.rows:,} rows in batches of {args.batch} (same run)", [
        ("strom client: upserts", f"{client_up:,.0f} rows/s"),
        ("gateway, JSON: upserts", f"{json_up:,.0f} rows/s ({json_up / client_up:.2f}x)"),
        ("gateway, Arrow IPC: upserts", f"{arrow_up:,.0f} rows/s ({arrow_up / client_up:.2f}x)"),
        ("strom client: batched lookups", f"{client_look:,.0f} keys/s"),
        ("gateway, JSON: batched lookups", f"{json_look:,.0f} keys/s ({json_look / client_look:.2f}x)"),
        ("strom client: lookup_arrow", f"{client_arrow_look:,.0f} keys/s"),
        ("gateway, Arrow IPC: batched lookups", f"{arrow_look:,.0f} keys/s ({arrow_look / client_arrow_look:.2f}x "
                                                f"of lookup_arrow, {arrow_look / client_look:.2f}x of lookup_many)"),
    ])


if __name__ == "__main__":
    main()
