"""What only the ZooKeeper store has: Fluss's node layout, lost connections and sessions, two stores on one
ZooKeeper, and values kept under ZooKeeper's 1 MB limit. Real ZooKeeper processes on loopback."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from strom.coordinator.kv_snapshot_leases import KvSnapshotLease, decode_lease, encode_lease
from strom.errors import NotInstalledError, StorageError, TableAlreadyExistError
from strom.ids import TableBucket
from strom.metadata.store import (
    DatabaseRecord,
    KvSnapshotRecord,
    LakeSnapshotRecord,
)
from strom.server.metadata_stores import open_store
from strom.zk import metadata_store as zookeeper_store
from strom.zk import session
from strom.zk.metadata_store import (
    VALUE_SIZE_BYTES_MAX,
    MetadataValueTooLargeError,
    ZooKeeperMetadataStore,
    parse_location,
)
from strom.zk.zookeeper_server import ZooKeeperServer

T0_MS = 1_700_000_000_000
TABLE_JSON = b'{"version":1}'
ZOOKEEPER_NODE_SIZE_BYTES_MAX = (1 << 20) - 1  # jute.maxbuffer's default


@pytest.fixture
def store(zookeeper_location: str) -> Iterator[ZooKeeperMetadataStore]:
    opened = ZooKeeperMetadataStore(zookeeper_location)
    yield opened
    opened.close()


@pytest.fixture
def raw_client(zookeeper_location: str) -> Iterator[KazooClient]:
    """A plain kazoo client inside the test's root, to look at the nodes themselves."""
    client = KazooClient(hosts=zookeeper_location, timeout=10)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def with_database(store: ZooKeeperMetadataStore, name: str = "db") -> None:
    store.create_database(DatabaseRecord(name, b"{}", T0_MS, T0_MS))


def test_a_location_without_a_root_uses_fluss_root() -> None:
    assert parse_location("127.0.0.1:2181") == ("127.0.0.1:2181", "/fluss")
    assert parse_location("a:1,b:2/strom/one/") == ("a:1,b:2", "/strom/one")
    with pytest.raises(ValueError):
        parse_location("/only-a-root")


def test_metadata_lives_at_fluss_paths(store: ZooKeeperMetadataStore, raw_client: KazooClient) -> None:
    # the paths under the root (the location's, or /fluss by default), as Fluss names them
    with_database(store)
    table = store.create_table("db", "orders", TABLE_JSON, 1, T0_MS)
    partition = store.create_partition(table.table_id, "2024", (("year", "2024"),), T0_MS)
    store.add_kv_snapshot(KvSnapshotRecord(table.table_id, None, 3, 7, b'{"files":[]}'))
    store.add_kv_snapshot(KvSnapshotRecord(table.table_id, partition.partition_id, 0, 1, b"{}"))
    store.put_lease("job-1", b"lease")
    store.commit_lake_snapshot(LakeSnapshotRecord(table.table_id, 42, True, b"{}"))
    store.add_acls([zookeeper_store.AclRecord(4, "db.orders", "User", "bob", "*", 3, 3)])
    writer_id = store.next_id("writer")

    expected = [
        "/metadata/databases/db",
        "/metadata/databases/db/tables/orders",
        "/metadata/databases/db/tables/orders/partitions/2024",
        "/metadata/table_seqid",
        "/metadata/partition_seqid",
        "/metadata/writer_id",
        f"/tabletservers/tables/{table.table_id}",
        f"/tabletservers/tables/{table.table_id}/buckets/3/snapshots/7",
        f"/tabletservers/partitions/{partition.partition_id}/buckets/0/snapshots/1",
        "/leases/kv_snapshot/job-1",
        "/fluss-acls/4/db.orders",
    ]
    for path in expected:
        assert raw_client.exists(path) is not None, path
    assert raw_client.get(f"/tabletservers/tables/{table.table_id}/buckets/3/snapshots/7")[0] == b'{"files":[]}'
    assert raw_client.get("/metadata/writer_id")[0] == str(writer_id + 1).encode()
    assert [name.split("-")[0] for name in raw_client.get_children(
        f"/tabletservers/tables/{table.table_id}/laketable")] == ["42"]


def test_two_stores_on_one_zookeeper_see_each_others_commits(zookeeper_location: str) -> None:
    first = ZooKeeperMetadataStore(zookeeper_location)
    second = ZooKeeperMetadataStore(zookeeper_location)
    try:
        with_database(first)
        table = first.create_table("db", "t", TABLE_JSON, 1, T0_MS)
        assert second.get_table("db", "t") == table
        second.put_lease("lease", b"payload")
        assert first.list_leases() == {"lease": b"payload"}
        with pytest.raises(TableAlreadyExistError):
            second.create_table("db", "t", TABLE_JSON, 1, T0_MS)
        second.drop_table(table.table_id)
        assert first.get_table_by_id(table.table_id) is None
    finally:
        first.close()
        second.close()


def test_concurrent_stores_never_hand_out_an_id_twice(zookeeper_location: str) -> None:
    stores = [ZooKeeperMetadataStore(zookeeper_location) for _ in range(3)]
    with_database(stores[0])
    table_ids: list[int] = []
    writer_ids: list[int] = []
    lock = threading.Lock()

    def work(index: int) -> None:
        store = stores[index]
        for round_index in range(15):
            table = store.create_table("db", f"t{index}_{round_index}", TABLE_JSON, 1, T0_MS)
            writer = store.next_id("writer")
            with lock:
                table_ids.append(table.table_id)
                writer_ids.append(writer)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(stores))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(table_ids) == list(range(45))
        assert sorted(writer_ids) == list(range(45))
        assert len(stores[1].list_tables("db")) == 45
    finally:
        for store in stores:
            store.close()


def test_a_large_lease_stays_far_below_the_node_limit(store: ZooKeeperMetadataStore, raw_client: KazooClient) -> None:
    rng = random.Random(13)
    lease = KvSnapshotLease("big", T0_MS)
    for table_id in range(200):  # 200 tables x 512 buckets, snapshot ids of a long-running cluster
        for bucket in range(512):
            lease.pins[TableBucket(table_id, bucket)] = 1_000_000 + rng.randrange(50)
    payload = encode_lease(lease)
    store.put_lease("big", payload)
    _data, stat = raw_client.get("/leases/kv_snapshot/big")
    assert stat.dataLength == len(payload)
    assert stat.dataLength < VALUE_SIZE_BYTES_MAX < ZOOKEEPER_NODE_SIZE_BYTES_MAX
    assert decode_lease("big", store.list_leases()["big"]).pins == lease.pins


def test_a_value_over_the_limit_is_refused_before_it_reaches_zookeeper(store: ZooKeeperMetadataStore) -> None:
    with pytest.raises(MetadataValueTooLargeError):
        store.put_lease("huge", b"x" * (VALUE_SIZE_BYTES_MAX + 1))
    with pytest.raises(MetadataValueTooLargeError):
        store.add_kv_snapshot(KvSnapshotRecord(1, None, 0, 0, b"x" * (VALUE_SIZE_BYTES_MAX + 1)))
    store.put_lease("small", b"ok")  # the connection is still fine
    assert store.list_leases() == {"small": b"ok"}


def test_a_table_too_large_for_one_transaction_is_dropped_in_chunks(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session, "TRANSACTION_DELETES_MAX", 10)
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    kept = store.create_table("db", "kept", TABLE_JSON, 1, T0_MS)
    for bucket in range(8):
        for snapshot_id in range(3):
            store.add_kv_snapshot(KvSnapshotRecord(table.table_id, None, bucket, snapshot_id, b"{}"))
    store.add_kv_snapshot(KvSnapshotRecord(kept.table_id, None, 0, 0, b"{}"))
    store.drop_table(table.table_id)
    assert store.list_tables("db") == ["kept"]
    assert [s.table_id for s in store.list_kv_snapshots()] == [kept.table_id]


def expire_session(store: ZooKeeperMetadataStore, address: str) -> None:
    """End the store's session from outside, as a long network partition would."""
    deadline = time.monotonic() + 10
    while store._client.client_id is None:  # still reconnecting after the previous expiry
        assert time.monotonic() < deadline, "the store did not reconnect within 10 s"
        time.sleep(0.01)
    session_id, password = store._client.client_id
    intruder = KazooClient(hosts=address, client_id=(session_id, password), timeout=10)
    intruder.start(timeout=10)
    intruder.stop()  # closing the borrowed session expires it for its owner
    intruder.close()


def test_expired_sessions_during_writes_lose_nothing_and_duplicate_nothing(
    zookeeper_server: ZooKeeperServer, zookeeper_location: str
) -> None:
    store = ZooKeeperMetadataStore(zookeeper_location, session_timeout_ms=4_000)
    try:
        with_database(store)
        created: list[int] = []
        failures: list[BaseException] = []

        def write() -> None:
            try:
                for index in range(60):
                    created.append(store.create_table("db", f"t{index}", TABLE_JSON, 1, T0_MS).table_id)
                    store.put_lease(f"lease{index}", str(index).encode())
            except BaseException as exc:  # reported by the test thread below
                failures.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        for _ in range(6):
            time.sleep(0.05)
            expire_session(store, zookeeper_server.address)
        writer.join(timeout=60)
        assert not writer.is_alive()
        assert failures == []
        assert len(created) == len(set(created)) == 60
        assert store.list_tables("db") == sorted(f"t{index}" for index in range(60))
        assert sorted(t.table_id for t in map(store.get_table_by_id, created) if t is not None) == sorted(created)
        assert len(store.list_leases()) == 60
        assert store.create_table("db", "after", TABLE_JSON, 1, T0_MS).table_id > max(created)
    finally:
        store.close()


def test_a_zookeeper_restart_during_writes_is_waited_out(tmp_path: Path, zookeeper_server: ZooKeeperServer) -> None:
    server = ZooKeeperServer(tmp_path / "zk").start()
    restarted: ZooKeeperServer | None = None
    store = ZooKeeperMetadataStore(f"{server.address}/restart", session_timeout_ms=10_000, operation_timeout_ms=30_000)
    try:
        with_database(store)
        ids = [store.next_id("writer") for _ in range(5)]
        server.stop()
        restarted = ZooKeeperServer(tmp_path / "zk", port=server.port)
        starter = threading.Timer(0.5, restarted.start)
        starter.start()
        ids += [store.next_id("writer") for _ in range(5)]  # blocks until the server is back
        starter.join()
        assert ids == sorted(set(ids))
        assert store.get_database("db") is not None
    finally:
        store.close()
        if restarted is not None:
            restarted.stop()
        server.stop()


def test_a_read_in_flight_when_the_store_closes_fails_at_once(zookeeper_location: str) -> None:
    """A stopping server closes its store while a periodic reread may still run on a thread; that read must
    fail with StorageError now, not wait out the operation timeout for a reconnect that never comes (the
    process would not exit until that thread ends)."""
    store = ZooKeeperMetadataStore(zookeeper_location, operation_timeout_ms=600_000)
    store.put_cluster_configs(b"{}")
    failures: list[BaseException] = []
    reads = threading.Event()

    def reread() -> None:
        try:
            while True:
                store.get_cluster_configs()
                reads.set()
        except BaseException as exc:  # the one expected failure is checked below
            failures.append(exc)

    reader = threading.Thread(target=reread, daemon=True)
    reader.start()
    assert reads.wait(10)
    store.close()
    reader.join(60)  # far below the 600 s it would otherwise wait
    assert not reader.is_alive(), "a read on a closed store waited for a reconnect"
    assert len(failures) == 1 and isinstance(failures[0], StorageError), failures
    assert "closed" in str(failures[0])


def test_a_missing_kazoo_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "strom.zk.metadata_store")
    monkeypatch.setitem(sys.modules, "kazoo.client", None)
    with pytest.raises(NotInstalledError, match=r"strom\[zookeeper\]"):
        open_store("zookeeper", "127.0.0.1:1")
