"""KV snapshot leases (Fluss FIP-22): named, expiring sets of pins that keep snapshots from being deleted.

A lease pins at most one snapshot per bucket; acquiring a bucket again moves its pin; every acquire (an
empty one is a renew) sets the expiry to now + duration; releasing the last pin deletes the lease;
dropping or releasing unknown things succeeds. Where Fluss leaves gaps, this manager closes them:

* acquire reports snapshots that do not exist (never taken, or already deleted) as unavailable instead of
  pinning them, using the snapshot store's in-memory index — no metadata read per bucket;
* a failed persist leaves memory unchanged: the new state is built aside, persisted, then swapped in;
* dropping a table removes its pins from every lease;
* a lease belongs to the principal that created it (:attr:`KvSnapshotLease.owner`): the RPCs let no other
  principal (super users and the cluster's servers aside) renew, release or drop it;
* leases are persisted compactly (dense id arrays + zlib), so a lease pinning 100 000 buckets stays far below
  ZooKeeper's 1 MB node limit, and survive restarts.

Owned by the event loop. ``refcounts`` maps (bucket, snapshot id) to the number of leases pinning it.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from strom.clock import Clock
from strom.errors import InvalidConfigError
from strom.ids import TableBucket
from strom.metadata.off_loop import off_loop
from strom.metadata.store import LeaseStore

log = logging.getLogger(__name__)

_FORMAT_VERSION = 3
_OWNERLESS_VERSION = 2
"""Leases written before they had owners: read as owned by nobody in particular (anyone may touch them)."""
_HEADER = struct.Struct("<Bq")  # version, expiration ms
_OWNER_LENGTH = struct.Struct("<H")  # then the owner, UTF-8 (version 3)
_COUNT = struct.Struct("<I")
_GROUP = struct.Struct("<qqI")  # table id, partition id (-1: none), bucket array width
assert array("q").itemsize == 8


@dataclass(slots=True)
class KvSnapshotLease:
    lease_id: str
    expiration_ms: int
    pins: dict[TableBucket, int] = field(default_factory=dict)
    owner: str | None = None
    """The principal (``TYPE:NAME``) that created it; None for a lease of an older format."""


@dataclass(frozen=True, slots=True)
class LeaseChange:
    """What one call changed: pins it dropped (candidates for cleanup) and snapshots it could not pin."""

    released: list[tuple[TableBucket, int]]
    unavailable: dict[TableBucket, int]
    released_all: bool = False
    """The last unreadable lease went: any snapshot of any bucket may have been released."""


def encode_lease(lease: KvSnapshotLease) -> bytes:
    """Compact form, zlib-compressed: per (table, partition) a dense int64 array of snapshot ids indexed by
    bucket (-1 where the bucket is not pinned) — arrays of similar ids compress to almost nothing."""
    groups: dict[tuple[int, int | None], dict[int, int]] = {}
    for bucket, snapshot_id in lease.pins.items():
        groups.setdefault((bucket.table_id, bucket.partition_id), {})[bucket.bucket] = snapshot_id
    body = bytearray()
    body += _COUNT.pack(len(groups))
    for (table_id, partition_id), pins in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1] or -1)):
        width = max(pins) + 1
        body += _GROUP.pack(table_id, -1 if partition_id is None else partition_id, width)
        body += array("q", [pins.get(bucket, -1) for bucket in range(width)]).tobytes()
    owner = (lease.owner or "").encode()
    return (
        _HEADER.pack(_FORMAT_VERSION, lease.expiration_ms) + _OWNER_LENGTH.pack(len(owner)) + owner
        + zlib.compress(bytes(body), 6)
    )


def _readable_expiration(payload: bytes) -> int | None:
    """The expiry in a lease's header, if the header at least is intact (known version)."""
    try:
        version, expiration_ms = _HEADER.unpack_from(payload, 0)
    except struct.error:
        return None
    return int(expiration_ms) if version in (_FORMAT_VERSION, _OWNERLESS_VERSION) else None


def decode_lease(lease_id: str, payload: bytes) -> KvSnapshotLease:
    version, expiration_ms = _HEADER.unpack_from(payload, 0)
    position = _HEADER.size
    owner = None
    if version == _FORMAT_VERSION:
        (length,) = _OWNER_LENGTH.unpack_from(payload, position)
        position += _OWNER_LENGTH.size
        owner = payload[position : position + length].decode() or None
        position += length
    elif version != _OWNERLESS_VERSION:
        raise ValueError(f"lease {lease_id!r} has unknown format version {version}")
    body = zlib.decompress(payload[position:])
    lease = KvSnapshotLease(lease_id, expiration_ms, owner=owner)
    (group_count,) = _COUNT.unpack_from(body, 0)
    position = _COUNT.size
    for _ in range(group_count):
        table_id, partition, width = _GROUP.unpack_from(body, position)
        position += _GROUP.size
        snapshot_ids = array("q")
        snapshot_ids.frombytes(body[position : position + 8 * width])
        position += 8 * width
        partition_id = None if partition < 0 else partition
        for bucket, snapshot_id in enumerate(snapshot_ids):
            if snapshot_id >= 0:
                lease.pins[TableBucket(table_id, bucket, partition_id)] = snapshot_id
    if position != len(body):
        raise ValueError(f"lease {lease_id!r} has {len(body) - position} trailing bytes")
    return lease


LEASE_ID_LENGTH_MAX = 256
LEASE_DURATION_MS_MAX = 365 * 24 * 3600 * 1000
"""A lease is renewed by its holder while it reads; a year bounds what a forgotten one can keep."""


def validate_lease_request(lease_id: str, duration_ms: int) -> None:
    """Reject what would be stored and then haunt the cluster: an empty, huge or unprintable id, a
    duration that is not positive or would overflow the expiry."""
    if not isinstance(lease_id, str):  # protobuf hands over a proto2 string that is not UTF-8 as bytes
        raise InvalidConfigError("Invalid lease request: the lease id is not valid UTF-8.")
    if not lease_id:
        raise InvalidConfigError("Invalid lease request: the lease id is empty.")
    if len(lease_id) > LEASE_ID_LENGTH_MAX:
        raise InvalidConfigError(
            f"Invalid lease request: the lease id has {len(lease_id)} characters (at most {LEASE_ID_LENGTH_MAX})."
        )
    if not lease_id.isprintable():
        raise InvalidConfigError(f"Invalid lease request: the lease id {lease_id[:64]!r} has unprintable characters.")
    if not 0 < duration_ms <= LEASE_DURATION_MS_MAX:
        raise InvalidConfigError(
            f"Invalid lease request: the lease duration must be in (0, {LEASE_DURATION_MS_MAX}] ms, got {duration_ms}."
        )


class KvSnapshotLeaseManager:
    """Every lease of the cluster, persisted in the metadata store."""

    def __init__(self, store: LeaseStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._leases: dict[str, KvSnapshotLease] = {}
        self._refcounts: dict[tuple[TableBucket, int], int] = {}
        self._unreadable: dict[str, int | None] = {}
        self._changing = asyncio.Lock()
        """One change at a time: each decides on the state the one before it left (and stored)."""
        for lease_id, payload in store.list_leases().items():
            try:
                lease = decode_lease(lease_id, payload)
            except (ValueError, zlib.error, IndexError, struct.error) as exc:
                self._unreadable[lease_id] = _readable_expiration(payload)
                log.error(
                    "lease %r cannot be read (%s): until it expires (%s) or an operator drops it "
                    "(`strom lease drop`), no snapshot outside the retention "
                    "window is deleted, since it may pin any of them",
                    lease_id, exc, self._unreadable[lease_id] or "never: its expiry is unreadable too",
                )
                continue
            self._leases[lease_id] = lease
            self._count(lease.pins, +1)

    def _count(self, pins: Mapping[TableBucket, int], delta: int) -> None:
        for bucket, snapshot_id in pins.items():
            key = (bucket, snapshot_id)
            count = self._refcounts.get(key, 0) + delta
            assert count >= 0, key
            if count:
                self._refcounts[key] = count
            else:
                del self._refcounts[key]

    async def _replace(self, lease_id: str, new: KvSnapshotLease | None) -> None:
        """Persist (on a store thread), then swap memory: a store failure leaves the old state in memory and
        in the store."""
        if new is None:
            await off_loop(self._store.delete_lease, lease_id)
        else:
            await off_loop(self._store.put_lease, lease_id, encode_lease(new))
        old = self._leases.pop(lease_id, None)
        old_pins = old.pins if old is not None else {}
        new_pins = new.pins if new is not None else {}
        if new is not None:
            self._leases[lease_id] = new
        # only the pins that changed move a refcount (a renew of 10 000 pins touches none)
        self._count({b: s for b, s in old_pins.items() if new_pins.get(b) != s}, -1)
        self._count({b: s for b, s in new_pins.items() if old_pins.get(b) != s}, +1)

    # ---- queries ----
    def is_leased(self, bucket: TableBucket, snapshot_id: int) -> bool:
        """Whether a lease pins the snapshot; while an unreadable lease is in force, every snapshot may be
        pinned (fail safe: keep rather than delete what a reader may hold)."""
        return bool(self._unreadable) or (bucket, snapshot_id) in self._refcounts

    @property
    def unreadable_lease_ids(self) -> list[str]:
        """Leases found unreadable at start-up and not yet expired or dropped."""
        return sorted(self._unreadable)

    def get(self, lease_id: str) -> KvSnapshotLease | None:
        return self._leases.get(lease_id)

    def is_anothers(self, lease_id: str, principal: str) -> bool:
        """Whether ``lease_id`` is a lease with an owner other than ``principal`` (a lease recorded before
        owners were is nobody's). The one rule of lease ownership: requests touching another's lease are
        answered as for a missing one."""
        lease = self._leases.get(lease_id)
        return lease is not None and lease.owner is not None and lease.owner != principal

    def own_table_ids(self, lease_id: str, principal: str) -> set[int]:
        """The tables ``lease_id`` pins, when it is not another principal's (none otherwise): what a
        request on the lease by ``principal`` is authorized against."""
        lease = self._leases.get(lease_id)
        if lease is None or self.is_anothers(lease_id, principal):
            return set()
        return {bucket.table_id for bucket in lease.pins}

    def leases(self) -> list[KvSnapshotLease]:
        return [self._leases[lease_id] for lease_id in sorted(self._leases)]

    @property
    def lease_count(self) -> int:
        return len(self._leases)

    @property
    def pin_count(self) -> int:
        return sum(len(lease.pins) for lease in self._leases.values())

    # ---- changes ----
    async def acquire(
        self,
        lease_id: str,
        duration_ms: int,
        pins: Mapping[TableBucket, int],
        snapshot_exists: Callable[[TableBucket, int], bool],
        owner: str | None = None,
    ) -> LeaseChange:
        """Pin ``pins`` (an empty mapping renews), setting the expiry to now + ``duration_ms``; a new lease
        belongs to ``owner``, an existing one keeps its owner."""
        validate_lease_request(lease_id, duration_ms)
        async with self._changing:
            old = self._leases.get(lease_id)
            new = KvSnapshotLease(
                lease_id, self._clock.now_ms() + duration_ms, dict(old.pins) if old else {}, old.owner if old else owner
            )
            unavailable: dict[TableBucket, int] = {}
            released: list[tuple[TableBucket, int]] = []
            for bucket, snapshot_id in pins.items():
                if not snapshot_exists(bucket, snapshot_id):
                    unavailable[bucket] = snapshot_id
                    continue
                previous = new.pins.get(bucket)
                if previous is not None and previous != snapshot_id:
                    released.append((bucket, previous))
                new.pins[bucket] = snapshot_id
            await self._replace(lease_id, new)
            if self._unreadable.pop(lease_id, False) is not False:  # its holder re-stated it: the new state rules
                log.warning("unreadable lease %r replaced by a new acquire", lease_id)
                return LeaseChange(released, unavailable, released_all=not self._unreadable)
            return LeaseChange(released, unavailable)

    async def release(self, lease_id: str, buckets: Iterable[TableBucket]) -> LeaseChange:
        """Unpin ``buckets``; an unknown lease or bucket is a no-op; an emptied lease is deleted."""
        async with self._changing:
            return await self._release(lease_id, buckets)

    async def _release(self, lease_id: str, buckets: Iterable[TableBucket]) -> LeaseChange:
        old = self._leases.get(lease_id)
        if old is None:
            return LeaseChange([], {})
        new = KvSnapshotLease(lease_id, old.expiration_ms, dict(old.pins), old.owner)
        released = []
        for bucket in buckets:
            snapshot_id = new.pins.pop(bucket, None)
            if snapshot_id is not None:
                released.append((bucket, snapshot_id))
        if released:
            await self._replace(lease_id, new if new.pins else None)
        return LeaseChange(released, {})

    async def drop(self, lease_id: str) -> LeaseChange:
        """Delete a lease; dropping an unknown lease succeeds and changes nothing. Dropping an unreadable
        lease lifts the hold it put on every snapshot."""
        async with self._changing:
            return await self._drop(lease_id)

    async def _drop(self, lease_id: str) -> LeaseChange:
        if lease_id in self._unreadable:
            await off_loop(self._store.delete_lease, lease_id)
            del self._unreadable[lease_id]
            log.warning("unreadable lease %r dropped", lease_id)
            return LeaseChange([], {}, released_all=not self._unreadable)
        old = self._leases.get(lease_id)
        if old is None:
            return LeaseChange([], {})
        await self._replace(lease_id, None)
        return LeaseChange(list(old.pins.items()), {})

    async def expire(self) -> LeaseChange:
        """Drop every lease whose expiry has passed (strictly before now)."""
        async with self._changing:
            return await self._expire()

    async def _expire(self) -> LeaseChange:
        now = self._clock.now_ms()
        released: list[tuple[TableBucket, int]] = []
        released_all = False
        for lease_id, expiration_ms in list(self._unreadable.items()):
            if expiration_ms is not None and expiration_ms < now:
                try:
                    released_all |= (await self._drop(lease_id)).released_all
                except Exception:
                    log.exception("cannot drop expired unreadable lease %r; will retry", lease_id)
        for lease in [lease for lease in self._leases.values() if lease.expiration_ms < now]:
            try:
                released += (await self._drop(lease.lease_id)).released
            except Exception:
                log.exception("cannot drop expired lease %r; will retry", lease.lease_id)
            else:
                log.info("lease %r expired", lease.lease_id)
        return LeaseChange(released, {}, released_all=released_all)

    async def drop_table(self, table_id: int, partition_id: int | None = None) -> LeaseChange:
        """Remove a dropped table's (or partition's) pins from every lease."""
        async with self._changing:
            return await self._drop_table(table_id, partition_id)

    async def _drop_table(self, table_id: int, partition_id: int | None) -> LeaseChange:
        released: list[tuple[TableBucket, int]] = []
        for lease in list(self._leases.values()):
            gone = [
                b for b in lease.pins
                if b.table_id == table_id and (partition_id is None or b.partition_id == partition_id)
            ]
            if gone:
                released += (await self._release(lease.lease_id, gone)).released
        return LeaseChange(released, {})
