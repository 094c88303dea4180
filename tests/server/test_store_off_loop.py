"""No metadata store call runs on the event loop: a server whose store is slow keeps serving.

The server runs in this process over a store that records every call made from a thread running an event
loop and makes each call slow. A workload through every coordinator request that touches the store (the
catalog, leases, producer offsets, cluster configs, server tags, ACL-free lake and health requests, KV
snapshots committed by the tablet role) must leave that record empty; and while a slow change is in
flight, metadata requests already known to the coordinator are answered before the change completes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.config import Configuration
from strom.ids import TableBucket
from strom.metadata.off_loop import on_event_loop
from strom.metadata.rebalance_plan import ServerTag
from strom.metadata.store import MetadataStore
from strom.security.acl import AclBinding, AclFilter, OperationType, Principal, Resource
from strom.server import node
from strom.server.node import StromServer
from tests.integration.security_support import SECURE_CONFIG, strom_config_at
from tests.server_process import free_port

pytestmark = pytest.mark.asyncio

STORE_CALL_DELAY_S = 0.2


class SlowLoopWatchingStore:
    """A metadata store that takes ``delay_s`` per call and names each call made on an event loop."""

    def __init__(self, store: MetadataStore, delay_s: float) -> None:
        self._store = store
        self._delay_s = delay_s
        self.on_loop: list[str] = []
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if not callable(found) or name.startswith("_"):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if on_event_loop():
                self.on_loop.append(name)
            if name != "close":
                time.sleep(self._delay_s)
            return found(*args, **kwargs)

        return call


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> list[SlowLoopWatchingStore]:
    """Every store the servers of the test open, wrapped."""
    opened: list[SlowLoopWatchingStore] = []
    real_open = node.open_store

    def open_watched(*args: Any, **kwargs: Any) -> Any:
        store = SlowLoopWatchingStore(real_open(*args, **kwargs), STORE_CALL_DELAY_S)
        opened.append(store)
        return store

    monkeypatch.setattr(node, "open_store", open_watched)
    return opened


async def _started(tmp_path: Path) -> StromServer:
    server = StromServer(tmp_path / "data", "127.0.0.1", 0, Configuration({"kv.snapshot.interval": "1s"}))
    await server.start()
    return server


async def _eventually(check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.2)


async def test_no_store_call_runs_on_the_event_loop(tmp_path: Path, watched: list[SlowLoopWatchingStore]) -> None:
    server = await _started(tmp_path)
    try:
        connection = await Connection.create(f"127.0.0.1:{server.port}")
        admin = connection.get_admin()
        schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("day", pa.string()), ("v", pa.string())]),
                                   primary_key=["id", "day"])
        await admin.create_database("shop")
        assert await admin.database_exists("shop") and "shop" in await admin.list_databases()
        await admin.get_database_info("shop")
        orders = TablePath("shop", "orders")
        await admin.create_table(orders, TableDescriptor(schema, bucket_count=1, partition_keys=["day"]))
        await admin.create_partition(orders, {"day": "2026-11-28"})
        assert [p.partition_name for p in await admin.list_partition_infos(orders)] == ["2026-11-28"]
        await admin.alter_table(orders, set_properties={"owner": "ops"})
        assert await admin.table_exists(orders) and await admin.list_tables("shop") == ["orders"]
        await admin.get_table_info(orders)
        table = await connection.get_table(orders)
        writer = table.new_upsert().create_writer()
        await writer.upsert_batch(pa.table({"id": [1, 2], "day": ["2026-11-28"] * 2, "v": ["a", "b"]}))
        await writer.flush()
        partition_id = (await admin.list_partition_infos(orders))[0].partition_id
        bucket = TableBucket(table.table_info.table_id, 0, partition_id)

        async def snapshot_taken() -> Any:
            return (await admin.get_latest_kv_snapshots(orders, "2026-11-28")).snapshots.get(0)

        snapshot_id = (await _eventually(snapshot_taken)).snapshot_id
        lease = admin.create_kv_snapshot_lease("reader", 60_000)
        assert not (await lease.acquire_snapshots({bucket: snapshot_id})).unavailable_table_buckets
        await lease.release_snapshots([bucket])
        await lease.drop()
        await admin.register_producer_offsets("job-1", {bucket: 2})
        assert await admin.get_producer_offsets("job-1") is not None
        await admin.delete_producer_offsets("job-1")
        await admin.alter_cluster_configs({"table.datalake.freshness": "5min"})
        await admin.describe_cluster_configs()
        (node_id,) = [n.id for n in await admin.get_server_nodes() if n.server_type == "TabletServer"]
        await admin.add_server_tag([node_id], ServerTag.TEMPORARY_OFFLINE)
        await admin.remove_server_tag([node_id], ServerTag.TEMPORARY_OFFLINE)
        await admin.get_cluster_health()
        await admin.describe_lake_tiering()
        await admin.drop_partition(orders, {"day": "2026-11-28"})
        await admin.drop_table(orders)
        await admin.drop_database("shop")
        await connection.close()
    finally:
        await server.stop()
    (store,) = watched
    assert store.calls > 20, "the workload reached the store"
    assert store.on_loop == [], f"store calls made on the event loop: {sorted(set(store.on_loop))}"


async def test_known_metadata_is_answered_while_a_slow_change_is_in_flight(
    tmp_path: Path, watched: list[SlowLoopWatchingStore]
) -> None:
    server = await _started(tmp_path)
    try:
        connection = await Connection.create(f"127.0.0.1:{server.port}")
        admin = connection.get_admin()
        schema = Schema.from_arrow(pa.schema([("id", pa.int64())]), primary_key=["id"])
        known = TablePath("fluss", "known")
        await admin.create_table(known, TableDescriptor(schema, bucket_count=1))
        change = asyncio.ensure_future(admin.create_table(TablePath("fluss", "slow"), TableDescriptor(schema)))
        answered = 0
        while not change.done():  # each store call of the creation takes STORE_CALL_DELAY_S
            await admin.get_table_info(known)
            answered += 1
        await change
        assert answered >= 5, f"only {answered} metadata answers while the creation was in flight"
        await connection.close()
    finally:
        await server.stop()


async def test_acl_changes_and_their_checks_make_no_store_call_on_the_event_loop(
    tmp_path: Path, watched: list[SlowLoopWatchingStore]
) -> None:
    """With authorization on: ACL changes are stored off the loop, and the check of DeleteProducerOffsets
    (which reads the producer's stored offsets to know the tables they cover) reads off the loop too."""
    port = free_port()
    config = {**SECURE_CONFIG, "bind.listeners": f"CLIENT://127.0.0.1:{port}"}
    server = StromServer(tmp_path / "data", "127.0.0.1", port, Configuration(config))
    await server.start()
    try:
        async with await Connection.create(strom_config_at(f"127.0.0.1:{port}", "admin")) as connection:
            admin = connection.get_admin()
            schema = Schema.from_arrow(pa.schema([("id", pa.int64())]), primary_key=["id"])
            path = TablePath("fluss", "guarded")
            await admin.create_table(path, TableDescriptor(schema, bucket_count=1))
            table_id = (await admin.get_table_info(path)).table_id
            bob = Principal("User", "bob")
            await admin.create_acls([AclBinding(Resource.table("fluss", "guarded"), bob, "*", OperationType.READ)])
            assert await admin.list_acls(AclFilter(principal=bob))
            await admin.register_producer_offsets("job-2", {TableBucket(table_id, 0): 0})
            await admin.delete_producer_offsets("job-2")
            assert await admin.get_producer_offsets("job-2") is None
            await admin.drop_acls([AclFilter(principal=bob)])
    finally:
        await server.stop()
    (store,) = watched
    assert store.on_loop == [], f"store calls made on the event loop: {sorted(set(store.on_loop))}"

