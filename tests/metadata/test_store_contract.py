"""The metadata store contract, checked on every backend (SQLite on a real file, ZooKeeper on a real
server): every method, its uniqueness errors, and ids and records across reopen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.errors import (
    DatabaseAlreadyExistError,
    DatabaseNotEmptyError,
    DatabaseNotExistError,
    InvalidAlterTableError,
    PartitionAlreadyExistsError,
    TableAlreadyExistError,
    TableNotExistError,
)
from strom.metadata.store import (
    AclRecord,
    DatabaseRecord,
    KvSnapshotRecord,
    LakeSnapshotRecord,
    MetadataStore,
)
from strom.server.metadata_stores import open_store

T0_MS = 1_700_000_000_000
TABLE_JSON = b'{"version":1}'


@pytest.fixture(params=["sqlite", "zookeeper"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(kind, location) of an empty store of each backend."""
    if request.param == "zookeeper":
        return "zookeeper", request.getfixturevalue("zookeeper_location")
    return "sqlite", str(tmp_path / "metadata.sqlite")


@pytest.fixture
def store(store_location: tuple[str, str]) -> Iterator[MetadataStore]:
    opened = open_store(*store_location)
    yield opened
    opened.close()


def with_database(store: MetadataStore, name: str = "db") -> None:
    store.create_database(DatabaseRecord(name, b'{"comment":"x"}', T0_MS, T0_MS + 1))


# ---- databases ----


def test_a_created_database_reads_back_and_is_listed_in_name_order(store: MetadataStore) -> None:
    with_database(store, "zeta")
    with_database(store, "alpha")
    assert store.get_database("zeta") == DatabaseRecord("zeta", b'{"comment":"x"}', T0_MS, T0_MS + 1)
    assert store.get_database("missing") is None
    assert store.list_databases() == ["alpha", "zeta"]


def test_creating_a_database_twice_raises_database_already_exist(store: MetadataStore) -> None:
    with_database(store)
    with pytest.raises(DatabaseAlreadyExistError):
        with_database(store)


def test_database_names_are_case_sensitive(store: MetadataStore) -> None:
    with_database(store, "db")
    with_database(store, "DB")
    assert store.list_databases() == ["DB", "db"]


def test_dropping_a_database_removes_it_and_a_missing_one_is_a_no_op(store: MetadataStore) -> None:
    with_database(store)
    store.drop_database("db")
    store.drop_database("db")
    assert store.get_database("db") is None
    assert store.list_databases() == []


def test_dropping_a_database_that_still_has_tables_raises_database_not_empty(store: MetadataStore) -> None:
    with_database(store)
    store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    with pytest.raises(DatabaseNotEmptyError):
        store.drop_database("db")
    assert store.get_database("db") is not None


def test_updating_a_database_replaces_its_json_and_modified_time_only(store: MetadataStore) -> None:
    with_database(store, "db")
    with_database(store, "other")
    updated = store.update_database("db", b'{"comment":"y","custom_properties":{"k":"v"}}', T0_MS + 9)
    assert updated == DatabaseRecord("db", b'{"comment":"y","custom_properties":{"k":"v"}}', T0_MS, T0_MS + 9)
    assert store.get_database("db") == updated
    assert store.get_database("other") == DatabaseRecord("other", b'{"comment":"x"}', T0_MS, T0_MS + 1)
    store.create_table("db", "t", TABLE_JSON, 1, T0_MS)  # the database keeps its tables
    assert store.update_database("db", b"{}", T0_MS + 10).database_json == b"{}"
    assert store.list_tables("db") == ["t"]


def test_updating_a_missing_database_raises_database_not_exist(store: MetadataStore) -> None:
    with pytest.raises(DatabaseNotExistError):
        store.update_database("missing", b"{}", T0_MS)
    with_database(store)
    store.drop_database("db")
    with pytest.raises(DatabaseNotExistError):
        store.update_database("db", b"{}", T0_MS)
    assert store.get_database("db") is None
    assert store.list_databases() == []


def test_an_updated_database_survives_reopen(store_location: tuple[str, str]) -> None:
    first = open_store(*store_location)
    try:
        with_database(first)
        updated = first.update_database("db", b'{"comment":"after"}', T0_MS + 3)
    finally:
        first.close()
    reopened = open_store(*store_location)
    try:
        assert reopened.get_database("db") == updated
    finally:
        reopened.close()


# ---- tables ----


def test_a_created_table_gets_an_id_and_reads_back_by_path_and_id(store: MetadataStore) -> None:
    with_database(store)
    record = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    assert (record.database, record.name, record.table_json, record.schema_id) == ("db", "t", TABLE_JSON, 1)
    assert (record.created_ms, record.modified_ms) == (T0_MS, T0_MS)
    assert store.get_table("db", "t") == record
    assert store.get_table_by_id(record.table_id) == record
    assert store.get_table("db", "other") is None
    assert store.get_table_by_id(record.table_id + 1) is None


def test_creating_a_table_twice_raises_and_consumes_no_id(store: MetadataStore) -> None:
    with_database(store)
    first = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    with pytest.raises(TableAlreadyExistError):
        store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    assert store.create_table("db", "u", TABLE_JSON, 1, T0_MS).table_id == first.table_id + 1


def test_a_table_in_a_missing_database_raises_database_not_exist(store: MetadataStore) -> None:
    with pytest.raises(DatabaseNotExistError):
        store.create_table("nowhere", "t", TABLE_JSON, 1, T0_MS)


def test_the_same_table_name_may_exist_in_two_databases(store: MetadataStore) -> None:
    with_database(store, "a")
    with_database(store, "b")
    first = store.create_table("a", "t", TABLE_JSON, 1, T0_MS)
    second = store.create_table("b", "t", TABLE_JSON, 1, T0_MS)
    assert first.table_id != second.table_id
    assert store.list_tables("a") == ["t"]
    assert store.list_tables("b") == ["t"]
    assert store.list_tables("c") == []


def test_updating_a_table_replaces_its_json_and_modified_time(store: MetadataStore) -> None:
    with_database(store)
    record = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    updated = store.update_table(record.table_id, b'{"version":2}', T0_MS + 5)
    assert (updated.table_json, updated.created_ms, updated.modified_ms) == (b'{"version":2}', T0_MS, T0_MS + 5)
    assert store.get_table_by_id(record.table_id) == updated


def test_a_schema_change_keeps_the_replaced_document_under_its_schema_id(store: MetadataStore) -> None:
    with_database(store)
    record = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    other = store.create_table("db", "u", TABLE_JSON, 1, T0_MS)
    assert store.table_versions(record.table_id) == {}
    store.update_table(record.table_id, b'{"version":2}', T0_MS + 1)  # options only: no new version
    assert store.table_versions(record.table_id) == {}

    second = store.update_table(record.table_id, b'{"schema":2}', T0_MS + 2, schema_id=2)
    third = store.update_table(record.table_id, b'{"schema":3}', T0_MS + 3, schema_id=3)
    assert (second.schema_id, third.schema_id) == (2, 3)
    assert store.get_table("db", "t") == third
    assert store.table_versions(record.table_id) == {1: b'{"version":2}', 2: b'{"schema":2}'}
    assert store.table_versions(other.table_id) == {}

    with pytest.raises(InvalidAlterTableError, match="changed meanwhile"):  # a stale change is refused whole
        store.update_table(record.table_id, b'{"stale":1}', T0_MS + 4, schema_id=5)
    assert store.get_table("db", "t") == third
    assert store.update_table(record.table_id, b'{"schema":3}', T0_MS + 5, schema_id=3).schema_id == 3  # same id: a plain update

    store.drop_table(record.table_id)
    assert store.table_versions(record.table_id) == {}


def test_updating_a_missing_table_raises_table_not_exist(store: MetadataStore) -> None:
    with pytest.raises(TableNotExistError):
        store.update_table(42, TABLE_JSON, T0_MS)


def test_dropping_a_table_drops_its_partitions_and_snapshots(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    other = store.create_table("db", "u", TABLE_JSON, 1, T0_MS)
    partition = store.create_partition(table.table_id, "2024", (("year", "2024"),), T0_MS)
    store.add_kv_snapshot(KvSnapshotRecord(table.table_id, partition.partition_id, 0, 0, b"{}"))
    store.add_kv_snapshot(KvSnapshotRecord(other.table_id, None, 0, 0, b"{}"))

    store.drop_table(table.table_id)
    assert store.get_table("db", "t") is None
    assert store.list_partitions(table.table_id) == []
    assert store.get_partition_by_id(partition.partition_id) is None
    assert store.list_kv_snapshots(table.table_id) == []
    assert [s.table_id for s in store.list_kv_snapshots()] == [other.table_id]
    assert store.list_tables("db") == ["u"]


# ---- partitions ----


def test_partitions_get_ids_read_back_and_list_in_id_order(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    spec = (("region", "eu"), ("year", "2024"))
    first = store.create_partition(table.table_id, "eu$2024", spec, T0_MS)
    second = store.create_partition(table.table_id, "us$2024", (("region", "us"), ("year", "2024")), T0_MS + 1)
    assert first.spec == spec
    assert store.get_partition(table.table_id, "eu$2024") == first
    assert store.get_partition_by_id(second.partition_id) == second
    assert store.get_partition(table.table_id, "nope") is None
    assert store.list_partitions(table.table_id) == [first, second]

    store.drop_partition(first.partition_id)
    assert store.list_partitions(table.table_id) == [second]


def test_creating_a_partition_twice_raises_partition_already_exists(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    store.create_partition(table.table_id, "2024", (("year", "2024"),), T0_MS)
    with pytest.raises(PartitionAlreadyExistsError):
        store.create_partition(table.table_id, "2024", (("year", "2024"),), T0_MS)


def test_a_partition_of_a_missing_table_raises_table_not_exist(store: MetadataStore) -> None:
    with pytest.raises(TableNotExistError):
        store.create_partition(99, "2024", (("year", "2024"),), T0_MS)


def test_dropping_a_partition_drops_its_snapshots_only(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    kept = store.create_partition(table.table_id, "a", (("p", "a"),), T0_MS)
    dropped = store.create_partition(table.table_id, "b", (("p", "b"),), T0_MS)
    store.add_kv_snapshot(KvSnapshotRecord(table.table_id, kept.partition_id, 0, 0, b"{}"))
    store.add_kv_snapshot(KvSnapshotRecord(table.table_id, dropped.partition_id, 0, 0, b"{}"))
    store.drop_partition(dropped.partition_id)
    assert [s.partition_id for s in store.list_kv_snapshots(table.table_id)] == [kept.partition_id]



# ---- remote log manifests ----


def test_remote_log_manifest_handles_are_per_bucket_and_go_with_their_table_or_partition(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    other = store.create_table("db", "u", TABLE_JSON, 1, T0_MS)
    partition = store.create_partition(table.table_id, "a", (("p", "a"),), T0_MS)
    assert store.get_remote_log_manifest(table.table_id, None, 0) is None
    store.put_remote_log_manifest(table.table_id, None, 0, b"first")
    store.put_remote_log_manifest(table.table_id, None, 0, b"second")  # replaced
    store.put_remote_log_manifest(table.table_id, None, 2, b"bucket 2")
    store.put_remote_log_manifest(table.table_id, partition.partition_id, 0, b"partition")
    store.put_remote_log_manifest(other.table_id, None, 0, b"other")
    assert store.get_remote_log_manifest(table.table_id, None, 0) == b"second"
    assert store.list_remote_log_manifests(table.table_id, None) == {0: b"second", 2: b"bucket 2"}
    assert store.list_remote_log_manifests(table.table_id, partition.partition_id) == {0: b"partition"}
    store.drop_partition(partition.partition_id)
    assert store.list_remote_log_manifests(table.table_id, partition.partition_id) == {}
    assert store.get_remote_log_manifest(table.table_id, None, 0) == b"second"
    store.drop_table(table.table_id)
    assert store.list_remote_log_manifests(table.table_id, None) == {}
    assert store.get_remote_log_manifest(other.table_id, None, 0) == b"other"


# ---- sequences ----


def test_sequences_count_from_zero_independently(store: MetadataStore) -> None:
    assert [store.next_id("writer") for _ in range(3)] == [0, 1, 2]
    assert store.next_id("other") == 0
    assert store.next_id("writer") == 3


def test_a_sequence_reserves_a_range_of_values_at_once(store: MetadataStore) -> None:
    name = "auto_increment/7/col_1"  # the counter of an auto-increment column: "/" is part of the name
    assert store.next_id(name, 100_000) == 0  # values 0..99 999 reserved, the caller hands out 1..100 000
    assert store.next_id(name, 3) == 100_000
    assert store.next_id(name) == 100_003
    with pytest.raises(ValueError, match="positive count"):
        store.next_id(name, 0)
    assert store.next_id(name) == 100_004, "a refused reservation moves nothing"


def test_ids_are_never_reused_across_drops_and_reopen(store_location: tuple[str, str]) -> None:
    store = open_store(*store_location)
    with_database(store)
    tables = [store.create_table("db", f"t{i}", TABLE_JSON, 1, T0_MS).table_id for i in range(3)]
    partition = store.create_partition(tables[0], "x", (("p", "x"),), T0_MS).partition_id
    writer = store.next_id("writer")
    for table_id in tables:
        store.drop_table(table_id)
    store.close()

    reopened = open_store(*store_location)
    try:
        assert reopened.get_database("db") is not None
        assert reopened.create_table("db", "t0", TABLE_JSON, 1, T0_MS).table_id == max(tables) + 1
        new_table = reopened.get_table("db", "t0")
        assert new_table is not None
        assert reopened.create_partition(new_table.table_id, "x", (("p", "x"),), T0_MS).partition_id == partition + 1
        assert reopened.next_id("writer") == writer + 1
    finally:
        reopened.close()


# ---- KV snapshots ----


def test_kv_snapshots_list_in_table_partition_bucket_and_id_order(store: MetadataStore) -> None:
    records = [
        KvSnapshotRecord(2, None, 0, 1, b'{"n":1}'),
        KvSnapshotRecord(1, None, 1, 0, b'{"n":2}'),
        KvSnapshotRecord(1, None, 0, 3, b'{"n":3}'),
        KvSnapshotRecord(1, None, 0, 2, b'{"n":4}'),
        KvSnapshotRecord(1, 5, 0, 0, b'{"n":5}'),
    ]
    for record in records:
        store.add_kv_snapshot(record)
    assert store.list_kv_snapshots(1) == [records[3], records[2], records[1], records[4]]
    assert store.list_kv_snapshots() == [records[3], records[2], records[1], records[4], records[0]]

    store.delete_kv_snapshot(1, None, 0, 3)
    store.delete_kv_snapshot(1, None, 0, 99)  # missing: a no-op
    assert store.list_kv_snapshots(1) == [records[3], records[1], records[4]]


def test_one_buckets_snapshots_list_by_id(store: MetadataStore) -> None:
    records = [
        KvSnapshotRecord(1, None, 0, 12, b'{"n":1}'),
        KvSnapshotRecord(1, None, 0, 3, b'{"n":2}'),
        KvSnapshotRecord(1, None, 1, 4, b'{"n":3}'),
        KvSnapshotRecord(1, 5, 0, 6, b'{"n":4}'),
        KvSnapshotRecord(2, None, 0, 7, b'{"n":5}'),
    ]
    for record in records:
        store.add_kv_snapshot(record)
    assert store.list_bucket_kv_snapshots(1, None, 0) == [records[1], records[0]]
    assert store.list_bucket_kv_snapshots(1, 5, 0) == [records[3]]
    assert store.list_bucket_kv_snapshots(1, None, 9) == []
    store.delete_kv_snapshot(1, None, 0, 3)
    assert store.list_bucket_kv_snapshots(1, None, 0) == [records[0]]


def test_the_same_snapshot_id_in_another_partition_is_another_snapshot(store: MetadataStore) -> None:
    store.add_kv_snapshot(KvSnapshotRecord(1, None, 0, 0, b"{}"))
    store.add_kv_snapshot(KvSnapshotRecord(1, 7, 0, 0, b"{}"))
    store.delete_kv_snapshot(1, 7, 0, 0)
    assert [s.partition_id for s in store.list_kv_snapshots(1)] == [None]


# ---- leases ----


def test_leases_are_created_replaced_listed_and_deleted(store: MetadataStore) -> None:
    store.put_lease("a", b"one")
    store.put_lease("b", b"two")
    store.put_lease("a", b"three")
    assert store.list_leases() == {"a": b"three", "b": b"two"}
    store.delete_lease("a")
    store.delete_lease("missing")
    assert store.list_leases() == {"b": b"two"}


# ---- lake tiering state and lake snapshots ----


def test_lake_tiering_states_are_created_replaced_listed_and_deleted(store: MetadataStore) -> None:
    store.put_lake_tiering_state(1, b"one")
    store.put_lake_tiering_state(2, b"two")
    store.put_lake_tiering_state(1, b"three")
    assert store.list_lake_tiering_states() == {1: b"three", 2: b"two"}
    store.delete_lake_tiering_state(1)
    store.delete_lake_tiering_state(99)
    assert store.list_lake_tiering_states() == {2: b"two"}


def lake_snapshot(table_id: int, snapshot_id: int, readable: bool = True) -> LakeSnapshotRecord:
    return LakeSnapshotRecord(table_id, snapshot_id, readable, f'{{"s":{snapshot_id}}}'.encode())


def test_lake_snapshots_keep_commit_order_not_id_order(store: MetadataStore) -> None:
    for snapshot_id in (30, 10, 20):
        assert store.commit_lake_snapshot(lake_snapshot(1, snapshot_id)) == []
    store.commit_lake_snapshot(lake_snapshot(2, 5))
    assert store.list_lake_snapshot_ids(1) == [30, 10, 20]
    assert store.get_lake_snapshot(1) == lake_snapshot(1, 20)
    assert store.get_lake_snapshot(1, 30) == lake_snapshot(1, 30)
    assert store.get_lake_snapshot(1, 5) is None
    assert store.get_lake_snapshot(3) is None


def test_committing_a_known_lake_snapshot_id_replaces_it_as_the_newest(store: MetadataStore) -> None:
    store.commit_lake_snapshot(lake_snapshot(1, 1))
    store.commit_lake_snapshot(lake_snapshot(1, 2))
    replaced = LakeSnapshotRecord(1, 1, False, b'{"s":"again"}')
    store.commit_lake_snapshot(replaced)
    assert store.list_lake_snapshot_ids(1) == [2, 1]
    assert store.get_lake_snapshot(1) == replaced


def test_a_lake_commit_discards_snapshots_in_the_same_transaction(store: MetadataStore) -> None:
    for snapshot_id in (1, 2, 3):
        store.commit_lake_snapshot(lake_snapshot(1, snapshot_id))
    discarded = store.commit_lake_snapshot(lake_snapshot(1, 4), discard_snapshot_ids=[1, 2, 99])
    assert discarded == [lake_snapshot(1, 1), lake_snapshot(1, 2)]
    assert store.list_lake_snapshot_ids(1) == [3, 4]


def test_the_latest_readable_lake_snapshot_skips_unreadable_ones(store: MetadataStore) -> None:
    store.commit_lake_snapshot(lake_snapshot(1, 1, readable=True))
    store.commit_lake_snapshot(lake_snapshot(1, 2, readable=False))
    assert store.get_lake_snapshot(1).snapshot_id == 2  # type: ignore[union-attr]
    assert store.get_lake_snapshot(1, readable=True) == lake_snapshot(1, 1, readable=True)
    assert store.get_lake_snapshot(1, 2, readable=True) is None


def test_dropping_a_table_drops_its_lake_state_and_snapshots_only(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    other = store.create_table("db", "u", TABLE_JSON, 1, T0_MS)
    for table_id in (table.table_id, other.table_id):
        store.put_lake_tiering_state(table_id, b"state")
        store.commit_lake_snapshot(lake_snapshot(table_id, 1))
    store.drop_table(table.table_id)
    assert store.list_lake_tiering_states() == {other.table_id: b"state"}
    assert store.list_lake_snapshot_ids(table.table_id) == []
    assert store.list_lake_snapshot_ids(other.table_id) == [1]


def test_everything_written_survives_reopen(store_location: tuple[str, str]) -> None:
    store = open_store(*store_location)
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    partition = store.create_partition(table.table_id, "x", (("p", "x"),), T0_MS)
    store.add_kv_snapshot(KvSnapshotRecord(table.table_id, partition.partition_id, 0, 0, b'{"s":1}'))
    store.put_lease("lease", b"payload")
    store.put_lake_tiering_state(table.table_id, b"tiering")
    store.commit_lake_snapshot(lake_snapshot(table.table_id, 8))
    store.close()

    reopened = open_store(*store_location)
    try:
        assert reopened.list_databases() == ["db"]
        assert reopened.get_table("db", "t") == table
        assert reopened.list_partitions(table.table_id) == [partition]
        assert reopened.list_kv_snapshots(table.table_id) == [
            KvSnapshotRecord(table.table_id, partition.partition_id, 0, 0, b'{"s":1}')
        ]
        assert reopened.list_leases() == {"lease": b"payload"}
        assert reopened.list_lake_tiering_states() == {table.table_id: b"tiering"}
        assert reopened.get_lake_snapshot(table.table_id) == lake_snapshot(table.table_id, 8)
    finally:
        reopened.close()


def test_an_unknown_store_kind_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"sqlite.*zookeeper"):
        open_store("etcd", str(tmp_path / "metadata"))


# ---- ACLs ----


def acl(resource_type: int, resource_name: str, principal: str, operation: int = 3) -> AclRecord:
    return AclRecord(resource_type, resource_name, "User", principal, "*", operation, 3)


def test_acls_are_stored_once_deleted_and_listed_sorted(store: MetadataStore) -> None:
    table_acl = acl(4, "db.t", "bob")
    cluster_acls = [acl(2, "fluss-cluster", "alice"), acl(2, "fluss-cluster", "alice", operation=4)]
    store.add_acls([table_acl, *cluster_acls])
    store.add_acls([table_acl])
    assert store.list_acls() == sorted([table_acl, *cluster_acls])

    store.delete_acls([cluster_acls[0], acl(3, "db", "nobody")])
    assert store.list_acls() == sorted([table_acl, cluster_acls[1]])
    store.delete_acls([table_acl, cluster_acls[1]])
    assert store.list_acls() == []
    store.add_acls([])
    store.delete_acls([])


def test_acls_survive_reopen(store_location: tuple[str, str]) -> None:
    store = open_store(*store_location)
    store.add_acls([acl(4, "db.t", "bob")])
    store.close()
    reopened = open_store(*store_location)
    try:
        assert reopened.list_acls() == [acl(4, "db.t", "bob")]
    finally:
        reopened.close()


# ---- names ----


@pytest.mark.parametrize("name", ["with/slash", ".", "..", "per%cent", "ünï code", "a.b"])
def test_any_name_reads_back_as_written(store: MetadataStore, name: str) -> None:
    with_database(store, name)
    table = store.create_table(name, name, TABLE_JSON, 1, T0_MS)
    partition = store.create_partition(table.table_id, name, (("p", name),), T0_MS)
    store.put_lease(name, b"lease")
    assert store.list_databases() == [name]
    assert store.list_tables(name) == [name]
    assert store.get_table_by_id(table.table_id) == table
    assert store.get_partition_by_id(partition.partition_id) == partition
    assert store.list_leases() == {name: b"lease"}


def test_a_dropped_table_is_gone_by_id_and_dropping_it_again_is_a_no_op(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    partition = store.create_partition(table.table_id, "x", (("p", "x"),), T0_MS)
    store.drop_table(table.table_id)
    store.drop_table(table.table_id)
    store.drop_table(12345)
    assert store.get_table_by_id(table.table_id) is None
    assert store.get_partition(table.table_id, "x") is None
    assert store.get_partition_by_id(partition.partition_id) is None
    with pytest.raises(TableNotExistError):
        store.create_partition(table.table_id, "y", (("p", "y"),), T0_MS)
    store.drop_database("db")


# ---- bucket assignment ----


def test_a_bucket_assignment_reads_back_and_a_new_one_replaces_it(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    assert store.get_bucket_assignment(table.table_id, None) is None
    store.put_bucket_assignment(table.table_id, None, {0: 1, 1: 2, 2: 1})
    assert store.get_bucket_assignment(table.table_id, None) == {0: 1, 1: 2, 2: 1}
    store.put_bucket_assignment(table.table_id, None, {0: 3, 1: 3})
    assert store.get_bucket_assignment(table.table_id, None) == {0: 3, 1: 3}
    assert store.get_bucket_assignment(table.table_id + 1, None) is None
    assert store.get_bucket_assignment(table.table_id, 0) is None


def test_bucket_assignments_survive_reopen(store_location: tuple[str, str]) -> None:
    store = open_store(*store_location)
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    partition = store.create_partition(table.table_id, "x", (("p", "x"),), T0_MS)
    store.put_bucket_assignment(table.table_id, partition.partition_id, {0: 5})
    store.close()
    reopened = open_store(*store_location)
    try:
        assert reopened.get_bucket_assignment(table.table_id, partition.partition_id) == {0: 5}
    finally:
        reopened.close()


def test_each_partition_and_the_table_have_their_own_bucket_assignment(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    x = store.create_partition(table.table_id, "x", (("p", "x"),), T0_MS)
    y = store.create_partition(table.table_id, "y", (("p", "y"),), T0_MS)
    store.put_bucket_assignment(table.table_id, x.partition_id, {0: 1, 1: 2})
    assert store.get_bucket_assignment(table.table_id, y.partition_id) is None
    assert store.get_bucket_assignment(table.table_id, None) is None
    store.put_bucket_assignment(table.table_id, y.partition_id, {0: 2})
    store.put_bucket_assignment(table.table_id, x.partition_id, {0: 3, 1: 3})
    assert store.get_bucket_assignment(table.table_id, x.partition_id) == {0: 3, 1: 3}
    assert store.get_bucket_assignment(table.table_id, y.partition_id) == {0: 2}
    # the partitions' assignments leave their registration intact
    assert store.get_partition_by_id(x.partition_id) == x
    assert [p.name for p in store.list_partitions(table.table_id)] == ["x", "y"]


def test_dropping_a_partition_drops_its_bucket_assignment_only(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    x = store.create_partition(table.table_id, "x", (("p", "x"),), T0_MS)
    y = store.create_partition(table.table_id, "y", (("p", "y"),), T0_MS)
    store.put_bucket_assignment(table.table_id, x.partition_id, {0: 1})
    store.put_bucket_assignment(table.table_id, y.partition_id, {0: 2})
    store.drop_partition(x.partition_id)
    assert store.get_bucket_assignment(table.table_id, x.partition_id) is None
    assert store.get_bucket_assignment(table.table_id, y.partition_id) == {0: 2}


def test_dropping_a_table_drops_its_and_its_partitions_bucket_assignments(store: MetadataStore) -> None:
    with_database(store)
    table = store.create_table("db", "t", TABLE_JSON, 1, T0_MS)
    kept = store.create_table("db", "kept", TABLE_JSON, 1, T0_MS)
    partition = store.create_partition(table.table_id, "x", (("p", "x"),), T0_MS)
    store.put_bucket_assignment(table.table_id, None, {0: 1})
    store.put_bucket_assignment(table.table_id, partition.partition_id, {0: 2})
    store.put_bucket_assignment(kept.table_id, None, {0: 3})
    store.drop_table(table.table_id)
    assert store.get_bucket_assignment(table.table_id, None) is None
    assert store.get_bucket_assignment(table.table_id, partition.partition_id) is None
    assert store.get_bucket_assignment(kept.table_id, None) == {0: 3}
    assert store.list_tables("db") == ["kept"]


# ---- producer offsets ----


def test_producer_offsets_are_created_once_read_back_listed_and_deleted(store: MetadataStore) -> None:
    assert store.create_producer_offsets("job-1", b'{"a":1}')
    assert not store.create_producer_offsets("job-1", b'{"a":2}')  # created once: the first stays
    assert store.create_producer_offsets("__job_2", b'{"b":1}')
    assert store.get_producer_offsets("job-1") == b'{"a":1}'
    assert store.get_producer_offsets("missing") is None
    assert store.list_producer_ids() == ["__job_2", "job-1"]
    store.delete_producer_offsets("job-1")
    store.delete_producer_offsets("missing")  # a no-op
    assert store.get_producer_offsets("job-1") is None
    assert store.create_producer_offsets("job-1", b'{"a":3}')
    assert store.get_producer_offsets("job-1") == b'{"a":3}'


def test_producer_offsets_survive_reopen(store_location: tuple[str, str]) -> None:
    first = open_store(*store_location)
    try:
        assert first.create_producer_offsets("job", b"offsets")
    finally:
        first.close()
    second = open_store(*store_location)
    try:
        assert second.get_producer_offsets("job") == b"offsets"
        assert not second.create_producer_offsets("job", b"other")
    finally:
        second.close()


# ---- cluster configs ----


def test_cluster_configs_are_one_document_replaced_whole_and_kept_across_reopen(
    store_location: tuple[str, str]
) -> None:
    first = open_store(*store_location)
    try:
        assert first.get_cluster_configs() is None
        first.put_cluster_configs(b'{"kv.snapshot.interval":"1 min"}')
        first.put_cluster_configs(b'{"auto-partition.check.interval":"5 min"}')
        assert first.get_cluster_configs() == b'{"auto-partition.check.interval":"5 min"}'
    finally:
        first.close()
    second = open_store(*store_location)
    try:
        assert second.get_cluster_configs() == b'{"auto-partition.check.interval":"5 min"}'
    finally:
        second.close()


# ---- server tags and the rebalance task ----


def test_server_tags_and_the_rebalance_task_are_documents_kept_across_reopen(store_location: tuple[str, str]) -> None:
    first = open_store(*store_location)
    try:
        assert first.get_server_tags() is None and first.get_rebalance_task() is None
        first.put_server_tags(b'{"server_tags":{"1":0}}')
        first.put_rebalance_task(b'{"rebalance_id":"a"}')
        first.put_rebalance_task(b'{"rebalance_id":"b"}')
        assert first.get_server_tags() == b'{"server_tags":{"1":0}}'
        assert first.get_rebalance_task() == b'{"rebalance_id":"b"}'
    finally:
        first.close()
    second = open_store(*store_location)
    try:
        assert second.get_server_tags() == b'{"server_tags":{"1":0}}'
        assert second.get_rebalance_task() == b'{"rebalance_id":"b"}'
    finally:
        second.close()
