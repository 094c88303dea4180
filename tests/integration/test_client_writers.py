"""strom's own client writers against a real server: pipelined Arrow batches keep their order."""

from __future__ import annotations

import asyncio
import urllib.request

import pyarrow as pa
import pytest

from strom.client import Connection, OffsetSpec, Schema, TableDescriptor, TablePath
from strom.errors import StromError
from tests.conftest import unique_name
from tests.server_process import free_port

pytestmark = pytest.mark.asyncio


async def test_pipelined_upserts_of_overlapping_keys_end_in_the_last_write(server) -> None:  # type: ignore[no-untyped-def]
    path = TablePath("fluss", unique_name("pipeline"))
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("round", pa.int64())]), primary_key=["id"])
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=3))
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        handles = [
            writer.upsert_arrow_batch(pa.table({"id": list(range(500)), "round": [r] * 500})) for r in range(12)
        ]
        await writer.flush()
        for handle in handles:
            await handle.wait()
        rows = await (await table.new_scan().create_batch_scanner()).to_arrow()
        assert sorted(rows.column("id").to_pylist()) == list(range(500))
        assert set(rows.column("round").to_pylist()) == {11}
        # the changelog saw every round in order: 500 inserts, then 11 rounds of -U/+U per key
        offsets = await connection.get_admin().list_offsets(path, [0, 1, 2], OffsetSpec.latest())
        scanner = table.new_scan().create_log_scanner()
        per_key: dict[int, list[int]] = {}
        for bucket in range(3):
            async for change in scanner.read_range(table.bucket(bucket), 0, offsets[bucket]):
                for change_type, row in zip(change.change_types or b"", change.batch.to_pylist(), strict=True):
                    if change_type in (1, 3):
                        per_key.setdefault(row["id"], []).append(row["round"])
        assert all(rounds == list(range(12)) for rounds in per_key.values())
        assert len(per_key) == 500


async def test_pipelined_appends_keep_their_order_per_bucket(server) -> None:  # type: ignore[no-untyped-def]
    path = TablePath("fluss", unique_name("appends"))
    schema = Schema.from_arrow(pa.schema([("seq", pa.int64())]))
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        writer = table.new_append().create_writer()
        for start in range(0, 2000, 100):
            writer.append_arrow_batch(pa.table({"seq": list(range(start, start + 100))}))
        await writer.flush()
        end = (await connection.get_admin().list_offsets(path, [0], OffsetSpec.latest()))[0]
        seen = []
        async for change in table.new_scan().create_log_scanner().read_range(table.bucket(0), 0, end):
            seen += change.batch.column("seq").to_pylist()
        assert seen == list(range(2000))


async def test_a_failed_batch_write_surfaces_on_its_handle(server) -> None:  # type: ignore[no-untyped-def]
    path = TablePath("fluss", unique_name("gone"))
    schema = Schema.from_arrow(pa.schema([("id", pa.int64())]), primary_key=["id"])
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        await admin.create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        await writer.upsert_batch(pa.table({"id": [1, 2]}))
        await admin.drop_table(path)
        handle = writer.upsert_arrow_batch(pa.table({"id": [3]}))
        with pytest.raises(StromError):
            await handle.wait()


async def test_flush_raises_the_error_of_a_failed_row_write(server) -> None:  # type: ignore[no-untyped-def]
    path = TablePath("fluss", unique_name("flusherr"))
    schema = Schema.from_arrow(pa.schema([("id", pa.int64())]), primary_key=["id"])
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        await admin.create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        writer.upsert({"id": 1})
        await writer.flush()
        await admin.drop_table(path)
        handle = writer.upsert({"id": 2})
        with pytest.raises(StromError):
            await writer.flush()
        with pytest.raises(StromError):
            await handle.wait()


async def test_lookup_arrow_returns_the_existing_rows_in_key_order(server) -> None:  # type: ignore[no-untyped-def]
    path = TablePath("fluss", unique_name("lookup_arrow"))
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=3))
        table = await connection.get_table(path)
        await table.new_upsert().create_writer().upsert_batch(pa.table({"id": list(range(100)), "v": [f"v{i}" for i in range(100)]}))
        lookuper = table.new_lookup().create_lookuper()
        found = await lookuper.lookup_arrow(pa.table({"id": [42, 1000, 7, 99, -1]}))
        assert found.column("id").to_pylist() == [42, 7, 99]
        assert found.column("v").to_pylist() == ["v42", "v7", "v99"]
        rows = await lookuper.lookup_many([{"id": 7}, {"id": 1000}, (42,)])
        assert rows == [{"id": 7, "v": "v7"}, None, {"id": 42, "v": "v42"}]


def lookup_requests(metrics_port: int) -> float:
    """Lookup requests the server has routed, from its Prometheus endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    counts = [float(line.split(" ")[1]) for line in lines if line.startswith('strom_rpc_api_requests_total{api="LOOKUP"}')]
    return counts[0] if counts else 0.0


async def test_a_batched_lookup_asks_each_leader_once_for_all_its_buckets(server_factory) -> None:  # type: ignore[no-untyped-def]
    """As Fluss's client does, a batched lookup sends each leader one Lookup request holding every bucket's
    keys, not one request per bucket: 8 buckets on one server, one request per lookup_arrow and lookup_many."""
    port = free_port()
    server = server_factory({"metrics.reporter.prometheus.port": str(port)})
    path = TablePath("fluss", unique_name("lookup_grouped"))
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=8))
        table = await connection.get_table(path)
        ids = list(range(400))
        await table.new_upsert().create_writer().upsert_batch(pa.table({"id": ids, "v": [f"v{i}" for i in ids]}))
        lookuper = table.new_lookup().create_lookuper()
        before = lookup_requests(port)
        found = await lookuper.lookup_arrow(pa.table({"id": [*reversed(ids), 1000]}))
        assert found.column("id").to_pylist() == list(reversed(ids))
        assert found.column("v").to_pylist() == [f"v{i}" for i in reversed(ids)]
        rows = await lookuper.lookup_many([{"id": i} for i in range(0, 420, 7)])
        assert rows == [{"id": i, "v": f"v{i}"} if i < 400 else None for i in range(0, 420, 7)]
        assert lookup_requests(port) - before == 2


async def test_a_lookup_of_many_keys_answers_like_single_lookups(server) -> None:  # type: ignore[no-untyped-def]
    """The server reads a bucket's keys of a large lookup with one multi-get in key order; the answer is
    the same as key by key: present rows in request order, missing keys absent."""
    path = TablePath("fluss", unique_name("lookup_many_keys"))
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=3))
        table = await connection.get_table(path)
        ids = list(range(0, 6000, 2))
        await table.new_upsert().create_writer().upsert_batch(pa.table({"id": ids, "v": [f"v{i}" for i in ids]}))
        wanted = [(i * 7919) % 7000 for i in range(2500)]  # ~3/7 exist, in no key order, some twice
        lookuper = table.new_lookup().create_lookuper()
        found = await lookuper.lookup_arrow(pa.table({"id": wanted}))
        expected = [i for i in wanted if i < 6000 and i % 2 == 0]
        assert found.column("id").to_pylist() == expected
        assert found.column("v").to_pylist() == [f"v{i}" for i in expected]
        one_by_one = [await lookuper.lookup({"id": i}) for i in wanted[:300]]
        assert await lookuper.lookup_many([{"id": i} for i in wanted[:300]]) == one_by_one
        assert (await lookuper.lookup_arrow(pa.table({"id": pa.array([], pa.int64())}))).num_rows == 0
        assert await lookuper.lookup_many([]) == []


async def test_the_blocking_lookuper_finds_rows_without_an_event_loop_in_the_path(server) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    path = TablePath("fluss", unique_name("blocking"))
    schema = Schema.from_arrow(
        pa.schema([("region", pa.string()), ("id", pa.int64()), ("day", pa.date32()), ("v", pa.string())]),
        primary_key=["region", "id", "day"],
    )
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=3))
        table = await connection.get_table(path)
        import datetime as dt

        day = dt.date(2026, 1, 2)
        await table.new_upsert().create_writer().upsert_batch(
            pa.table({"region": ["eu", "us"], "id": [1, 2], "day": [day, day], "v": ["a", "b"]})
        )

        def blocking_reads() -> list[object]:
            with table.new_lookup().create_blocking_lookuper() as lookuper:
                return [
                    lookuper.lookup({"region": "eu", "id": 1, "day": day}),  # a date key: the Arrow path
                    lookuper.lookup(("us", 2, day)),
                    lookuper.lookup({"region": "eu", "id": 2, "day": day}),
                ]

        found = await asyncio.to_thread(blocking_reads)
        assert found == [
            {"region": "eu", "id": 1, "day": day, "v": "a"},
            {"region": "us", "id": 2, "day": day, "v": "b"},
            None,
        ]


async def test_the_blocking_lookuper_follows_the_metadata_cache_and_reconnects_after_a_failure(server) -> None:  # type: ignore[no-untyped-def]
    """The lookuper keeps each bucket's leader connection between lookups, but not past a change of the
    connection's metadata cache (a forgotten leader is not used), nor past a failed connection (the next
    lookup opens a new one)."""
    import socket

    from strom.errors import LeaderNotAvailableError, NetworkError
    from strom.ids import TableBucket

    path = TablePath("fluss", unique_name("blocking_cache"))
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=2))
        table = await connection.get_table(path)
        await table.new_upsert().create_writer().upsert_batch(pa.table({"id": [1, 2], "v": ["a", "b"]}))
        lookuper = table.new_lookup().create_blocking_lookuper()
        try:
            assert await asyncio.to_thread(lookuper.lookup, {"id": 1}) == {"id": 1, "v": "a"}
            for bucket_id in range(2):
                connection.metadata.invalidate(TableBucket(table.layout.info.table_id, bucket_id))
            with pytest.raises(LeaderNotAvailableError):
                await asyncio.to_thread(lookuper.lookup, {"id": 1})
            await connection.get_table(path)  # the leaders are known again
            assert await asyncio.to_thread(lookuper.lookup, {"id": 2}) == {"id": 2, "v": "b"}

            for rpc in lookuper._servers.values():
                rpc._sock.shutdown(socket.SHUT_RDWR)  # the connection breaks under the lookuper
            with pytest.raises(NetworkError):
                await asyncio.to_thread(lookuper.lookup, {"id": 2})
            assert await asyncio.to_thread(lookuper.lookup, {"id": 2}) == {"id": 2, "v": "b"}
            assert await asyncio.to_thread(lookuper.lookup, {"id": 3}) is None
        finally:
            lookuper.close()


async def test_single_lookups_of_a_key_out_of_column_order_find_the_rows_batched_lookups_find(server) -> None:  # type: ignore[no-untyped-def]
    """A key of plain values is encoded from its own values (the single lookup's lane): a composite key
    whose order is not the columns' order, after a value column, lands in the same bucket and finds the
    same rows as the batched Arrow path, through both single-key lookupers."""
    import asyncio

    path = TablePath("fluss", unique_name("key_order"))
    schema = Schema.from_arrow(pa.schema([("v", pa.string()), ("b", pa.int64()), ("a", pa.string())]),
                               primary_key=["a", "b"])
    rows = pa.table({"v": [f"v{i}" for i in range(60)], "b": list(range(60)), "a": [f"k{i % 7}" for i in range(60)]})
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=4))
        table = await connection.get_table(path)
        await table.new_upsert().create_writer().upsert_batch(rows)
        keys = [{"b": i, "a": f"k{i % 7}"} for i in range(0, 70, 3)]  # past 59: no such row
        lookuper = table.new_lookup().create_lookuper()
        batched = await lookuper.lookup_many(keys)
        singles = [await lookuper.lookup(key) for key in keys]

        def blocking_reads() -> list[object]:
            with table.new_lookup().create_blocking_lookuper() as blocking:
                return [blocking.lookup(key) for key in keys]

        assert singles == batched == await asyncio.to_thread(blocking_reads)
        assert batched[:2] == [{"v": "v0", "b": 0, "a": "k0"}, {"v": "v3", "b": 3, "a": "k3"}]
        assert batched[-1] is None


async def test_waiting_on_a_buffered_row_sends_it(server) -> None:  # type: ignore[no-untyped-def]
    """A row waits in the writer's buffer for a full batch or a flush; waiting on its handle sends it, as
    waiting on a row of Fluss's clients does, instead of hanging."""
    path = TablePath("fluss", unique_name("wait"))
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("name", pa.string())]), primary_key=["id"])
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        await asyncio.wait_for(table.new_upsert().create_writer().upsert({"id": 1, "name": "a"}).wait(), 30)
        appends = await connection.get_admin().list_offsets(path, [0], OffsetSpec.latest())
        assert appends == {0: 1}
        assert await table.new_lookup().create_lookuper().lookup({"id": 1}) == {"id": 1, "name": "a"}


async def test_a_partial_update_batch_may_leave_out_the_columns_it_does_not_write(server) -> None:  # type: ignore[no-untyped-def]
    path = TablePath("fluss", unique_name("partial"))
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("a", pa.string()), ("b", pa.string())]), ["id"])
    async with await Connection.create(server.address) as connection:
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=1))
        table = await connection.get_table(path)
        await table.new_upsert().create_writer().upsert_batch(pa.table({"id": [1], "a": ["a1"], "b": ["b1"]}))
        partial = table.new_upsert().partial_update(["id", "b"]).create_writer()
        await partial.upsert_batch(pa.table({"id": [1], "b": ["b2"]}))
        with pytest.raises(ValueError, match="lacks columns \\['b'\\]"):
            partial.upsert_arrow_batch(pa.table({"id": [1]}))
        assert await table.new_lookup().create_lookuper().lookup({"id": 1}) == {"id": 1, "a": "a1", "b": "b2"}
