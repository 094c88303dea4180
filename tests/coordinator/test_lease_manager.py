"""KvSnapshotLeaseManager against a real SQLite store, with time moved by hand."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from strom.clock import ManualClock
from strom.coordinator.kv_snapshot_leases import (
    KvSnapshotLease,
    KvSnapshotLeaseManager,
    decode_lease,
    encode_lease,
)
from strom.ids import TableBucket
from strom.metadata.sqlite_store import SqliteMetadataStore

T0 = TableBucket(1, 0)
T1 = TableBucket(1, 1)
T2 = TableBucket(1, 2)
P0 = TableBucket(2, 0, partition_id=7)


def everything_exists(bucket: TableBucket, snapshot_id: int) -> bool:
    return True


@pytest.fixture
def store(tmp_path: Path) -> SqliteMetadataStore:
    return SqliteMetadataStore(str(tmp_path / "meta.sqlite"))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.mark.asyncio
async def test_acquire_pins_and_sets_expiry_from_the_duration(store: SqliteMetadataStore, clock: ManualClock) -> None:
    leases = KvSnapshotLeaseManager(store, clock)
    change = await leases.acquire("l1", 1000, {T0: 0, T1: 0}, everything_exists)
    assert change.unavailable == {}
    lease = leases.get("l1")
    assert lease is not None
    assert lease.pins == {T0: 0, T1: 0}
    assert lease.expiration_ms == clock.now_ms() + 1000
    assert leases.is_leased(T0, 0) and leases.is_leased(T1, 0)
    assert not leases.is_leased(T0, 1)


@pytest.mark.asyncio
async def test_acquiring_a_bucket_again_moves_its_pin(store: SqliteMetadataStore, clock: ManualClock) -> None:
    leases = KvSnapshotLeaseManager(store, clock)
    await leases.acquire("l1", 1000, {T0: 0}, everything_exists)
    change = await leases.acquire("l1", 1000, {T0: 3}, everything_exists)
    assert change.released == [(T0, 0)]
    assert not leases.is_leased(T0, 0)
    assert leases.is_leased(T0, 3)
    assert leases.pin_count == 1


@pytest.mark.asyncio
async def test_two_leases_pinning_one_snapshot_keep_it_until_both_are_gone(
    store: SqliteMetadataStore, clock: ManualClock
) -> None:
    leases = KvSnapshotLeaseManager(store, clock)
    await leases.acquire("a", 1000, {T0: 5}, everything_exists)
    await leases.acquire("b", 1000, {T0: 5}, everything_exists)
    await leases.drop("a")
    assert leases.is_leased(T0, 5)
    await leases.release("b", [T0])
    assert not leases.is_leased(T0, 5)


@pytest.mark.asyncio
async def test_missing_snapshots_are_reported_unavailable_and_not_pinned(
    store: SqliteMetadataStore, clock: ManualClock
) -> None:
    leases = KvSnapshotLeaseManager(store, clock)
    existing = {(T0, 1), (T1, 1)}
    change = await leases.acquire("l1", 1000, {T0: 1, T1: 1, T2: 9}, lambda b, s: (b, s) in existing)
    assert change.unavailable == {T2: 9}
    lease = leases.get("l1")
    assert lease is not None and lease.pins == {T0: 1, T1: 1}


@pytest.mark.asyncio
async def test_releasing_the_last_bucket_deletes_the_lease_in_memory_and_in_the_store(
    store: SqliteMetadataStore, clock: ManualClock
) -> None:
    leases = KvSnapshotLeaseManager(store, clock)
    await leases.acquire("l1", 1000, {T0: 0, T1: 0}, everything_exists)
    await leases.release("l1", [T0])
    assert leases.get("l1") is not None
    assert "l1" in store.list_leases()
    await leases.release("l1", [T1])
    assert leases.get("l1") is None
    assert "l1" not in store.list_leases()


@pytest.mark.asyncio
async def test_releasing_or_dropping_unknown_things_succeeds_and_changes_nothing(
    store: SqliteMetadataStore, clock: ManualClock
) -> None:
    leases = KvSnapshotLeaseManager(store, clock)
    await leases.acquire("l1", 1000, {T0: 0}, everything_exists)
    assert (await leases.release("nope", [T0])).released == []
    assert (await leases.release("l1", [T2, TableBucket(99, 0)])).released == []
    assert (await leases.drop("nope")).released == []
    lease = leases.get("l1")
    assert lease is not None and lease.pins == {T0: 0}


@pytest.mark.asyncio
async def test_renew_creates_an_empty_lease_and_pushes_the_expiry(store: SqliteMetadataStore, clock: ManualClock) -> None:
    leases = KvSnapshotLeaseManager(store, clock)
    await leases.acquire("l1", 1000, {}, everything_exists)
    lease = leases.get("l1")
    assert lease is not None and lease.pins == {}
    clock.advance(ms=600)
    await leases.acquire("l1", 1000, {}, everything_exists)
    lease = leases.get("l1")
    assert lease is not None and lease.expiration_ms == clock.now_ms() + 1000


@pytest.mark.asyncio
async def test_expiry_drops_only_leases_whose_expiry_has_strictly_passed(
    store: SqliteMetadataStore, clock: ManualClock
) -> None:
    leases = KvSnapshotLeaseManager(store, clock)
    await leases.acquire("short", 1000, {T0: 0}, everything_exists)
    await leases.acquire("long", 2000, {T1: 0}, everything_exists)
    clock.advance(ms=1000)
    assert (await leases.expire()).released == []  # expiry == now is not yet expired
    clock.advance(ms=1)
    assert (await leases.expire()).released == [(T0, 0)]
    assert leases.get("short") is None and leases.get("long") is not None
    assert "short" not in store.list_leases()
    clock.advance(ms=1000)
    await leases.expire()
    assert leases.lease_count == 0


@pytest.mark.asyncio
async def test_dropping_a_table_removes_its_pins_from_every_lease(store: SqliteMetadataStore, clock: ManualClock) -> None:
    leases = KvSnapshotLeaseManager(store, clock)
    await leases.acquire("a", 1000, {T0: 0, P0: 4}, everything_exists)
    await leases.acquire("b", 1000, {T1: 2}, everything_exists)
    change = await leases.drop_table(1)
    assert sorted(change.released) == [(T0, 0), (T1, 2)]
    lease_a = leases.get("a")
    assert lease_a is not None and lease_a.pins == {P0: 4}
    assert leases.get("b") is None  # its only pin is gone, so the lease is gone
    reopened = KvSnapshotLeaseManager(store, clock)
    reopened_a = reopened.get("a")
    assert reopened_a is not None and reopened_a.pins == {P0: 4}


@pytest.mark.asyncio
async def test_leases_survive_a_restart(store: SqliteMetadataStore, clock: ManualClock, tmp_path: Path) -> None:
    leases = KvSnapshotLeaseManager(store, clock)
    await leases.acquire("l1", 5000, {T0: 3, P0: 1}, everything_exists)
    store.close()
    reopened = KvSnapshotLeaseManager(SqliteMetadataStore(str(tmp_path / "meta.sqlite")), clock)
    lease = reopened.get("l1")
    assert lease is not None
    assert lease.pins == {T0: 3, P0: 1}
    assert lease.expiration_ms == clock.now_ms() + 5000
    assert reopened.is_leased(T0, 3)


class FailingStore(SqliteMetadataStore):
    fail = False

    def put_lease(self, lease_id: str, payload: bytes) -> None:
        if self.fail:
            raise OSError("disk full")
        super().put_lease(lease_id, payload)

    def delete_lease(self, lease_id: str) -> None:
        if self.fail:
            raise OSError("disk full")
        super().delete_lease(lease_id)


@pytest.mark.asyncio
async def test_a_failed_persist_leaves_memory_and_store_unchanged(tmp_path: Path, clock: ManualClock) -> None:
    store = FailingStore(str(tmp_path / "meta.sqlite"))
    leases = KvSnapshotLeaseManager(store, clock)
    await leases.acquire("l1", 1000, {T0: 0}, everything_exists)
    before = store.list_leases()
    store.fail = True
    with pytest.raises(OSError):
        await leases.acquire("l1", 9000, {T0: 1, T1: 1}, everything_exists)
    with pytest.raises(OSError):
        await leases.release("l1", [T0])
    with pytest.raises(OSError):
        await leases.drop("l1")
    lease = leases.get("l1")
    assert lease is not None and lease.pins == {T0: 0}
    assert lease.expiration_ms == clock.now_ms() + 1000
    assert leases.is_leased(T0, 0) and not leases.is_leased(T0, 1) and not leases.is_leased(T1, 1)
    assert store.list_leases() == before


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lease_encoding_round_trips(seed: int) -> None:
    rng = random.Random(seed)
    pins = {}
    for _ in range(rng.randint(0, 300)):
        partition = rng.choice([None, rng.randint(0, 1000)])
        pins[TableBucket(rng.randint(0, 50), rng.randint(0, 4000), partition)] = rng.randint(0, 1 << 40)
    lease = KvSnapshotLease("x", rng.randint(0, 1 << 50), pins)
    decoded = decode_lease("x", encode_lease(lease))
    assert decoded.pins == lease.pins, f"seed {seed}"
    assert decoded.expiration_ms == lease.expiration_ms, f"seed {seed}"


def test_a_lease_pinning_100k_buckets_is_stored_far_below_one_megabyte() -> None:
    rng = random.Random(7)
    pins = {TableBucket(3, bucket): rng.randint(0, 10_000) for bucket in range(100_000)}
    size = len(encode_lease(KvSnapshotLease("big", 1, pins)))
    assert size < 300_000, size  # random snapshot ids: the worst case for the encoding


@pytest.mark.asyncio
async def test_an_unreadable_lease_holds_every_snapshot_until_an_operator_drops_it(
    store: SqliteMetadataStore, clock: ManualClock
) -> None:
    store.put_lease("readable", encode_lease(KvSnapshotLease("readable", clock.now_ms() + 60_000, {T0: 3})))
    store.put_lease("garbled", b"\x07not a lease")
    manager = KvSnapshotLeaseManager(store, clock)
    assert manager.unreadable_lease_ids == ["garbled"]
    assert manager.get("readable") is not None
    # it may pin anything: fail safe, nothing is released by retention
    assert manager.is_leased(T1, 1) and manager.is_leased(P0, 42)
    clock.advance(ms=10 * 365 * 86_400_000)
    assert (await manager.expire()).released_all is False  # its expiry is unreadable too: it never lapses by itself
    assert manager.is_leased(T2, 5)
    change = await manager.drop("garbled")
    assert change.released_all and manager.unreadable_lease_ids == []
    assert not manager.is_leased(T2, 5)
    assert "garbled" not in store.list_leases()


@pytest.mark.asyncio
async def test_an_unreadable_lease_with_an_intact_header_expires_at_its_recorded_time(
    store: SqliteMetadataStore, clock: ManualClock
) -> None:
    payload = encode_lease(KvSnapshotLease("cut", clock.now_ms() + 1_000, {T0: 3, T1: 4}))
    store.put_lease("cut", payload[:-3])  # the body is cut short; the header with the expiry survives
    manager = KvSnapshotLeaseManager(store, clock)
    assert manager.unreadable_lease_ids == ["cut"] and manager.is_leased(T2, 9)
    assert (await manager.expire()).released_all is False
    clock.advance(ms=1_001)
    assert (await manager.expire()).released_all is True
    assert not manager.is_leased(T2, 9) and store.list_leases() == {}


@pytest.mark.asyncio
async def test_acquiring_an_unreadable_lease_id_replaces_it(store: SqliteMetadataStore, clock: ManualClock) -> None:
    store.put_lease("holder", b"\x02garbage")
    manager = KvSnapshotLeaseManager(store, clock)
    change = await manager.acquire("holder", 60_000, {T0: 1}, everything_exists)
    assert change.released_all and manager.unreadable_lease_ids == []
    assert manager.is_leased(T0, 1) and not manager.is_leased(T0, 2)
    assert decode_lease("holder", store.list_leases()["holder"]).pins == {T0: 1}


def test_a_lease_keeps_its_owner_and_an_older_ownerless_lease_still_reads() -> None:
    owned = KvSnapshotLease("job", 123, {T0: 3, T1: 4}, owner="User:alice")
    assert decode_lease("job", encode_lease(owned)) == owned
    # format 2 (before owners): version, expiry, then the compressed pins, as an older strom wrote it
    older = b"\x02" + encode_lease(owned)[1:9] + encode_lease(owned)[9 + 2 + len("User:alice"):]
    assert decode_lease("job", older) == KvSnapshotLease("job", 123, {T0: 3, T1: 4}, owner=None)


@pytest.mark.asyncio
async def test_acquire_sets_the_owner_once_and_renewals_keep_it(tmp_path: Path) -> None:
    clock = ManualClock(1_000)
    manager = KvSnapshotLeaseManager(SqliteMetadataStore(str(tmp_path / "m.sqlite")), clock)
    await manager.acquire("job", 60_000, {T0: 1}, lambda _b, _s: True, owner="User:alice")
    await manager.acquire("job", 60_000, {}, lambda _b, _s: True, owner="User:bob")  # the service refuses this first
    await manager.release("job", [T1])
    lease = manager.get("job")
    assert lease is not None and lease.owner == "User:alice"
