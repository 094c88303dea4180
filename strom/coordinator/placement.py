"""Where buckets live: the servers of the cluster and the tablet server leading each bucket.

The coordinator answers metadata requests from a :class:`BucketPlacement`, and so does a tablet server of a
cluster (clients ask whichever server they know). One process serving both roles places every bucket on
itself (:class:`SingleNodePlacement`); a cluster records each table's (and partition's) assignment in the
metadata store when it is created and knows the live tablet servers from their ZooKeeper registrations
(:class:`ClusterPlacement`). Buckets are not replicated yet: each has one replica, its leader.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from strom.errors import FencedLeaderEpochError, UnknownTableOrBucketError
from strom.ids import TableBucket
from strom.metadata.store import CatalogStore
from strom.metadata.table_info import TableInfo
from strom.rpc.peers import ServerNode


@dataclass(frozen=True, slots=True)
class BucketLeadership:
    """What metadata tells clients of one bucket."""

    leader: int | None
    """None while no replica can lead it (its servers are down)."""
    replicas: tuple[int, ...]
    leader_epoch: int = 0
    isr: tuple[int, ...] = ()
    """The replicas in sync with the leader (strom's metadata extension)."""


@dataclass(frozen=True, slots=True)
class BucketHealth:
    """What GetClusterHealth counts of one bucket."""

    replicas: int
    in_sync: int
    """Replicas in the ISR whose servers are live."""
    leader_active: bool
    """Its leader's server is live."""


LeaderEpochOf = Callable[[TableBucket], "int | None"]
"""A bucket's current leader epoch (None: no such bucket or no leader)."""


def fence_leader_epoch(bucket: TableBucket, leader_epoch_of: LeaderEpochOf, requested: int, what: str) -> None:
    """Refuse ``what`` (a commit a bucket's leader sends) made under an older leader epoch than the bucket's,
    as Fluss's coordinator does: its replica was deposed, and what it held may include writes the new leader
    never had.

    Raises:
        UnknownTableOrBucketError: the bucket has no leader.
        FencedLeaderEpochError: ``requested`` is older than the bucket's leader epoch.
    """
    current = leader_epoch_of(bucket)
    if current is None:
        raise UnknownTableOrBucketError(f"{bucket} has no leader")
    if requested < current:
        raise FencedLeaderEpochError(
            f"{what} was made under leader epoch {requested}; the bucket's leader epoch is {current}"
        )


class LiveServers(Protocol):
    """The tablet servers currently registered (``strom.zk.registry.TabletServerRegistry``)."""

    def live(self) -> dict[int, ServerNode]: ...


class BucketPlacement(Protocol):
    def coordinator(self) -> ServerNode: ...

    def tablet_servers(self) -> list[ServerNode]:
        """The live tablet servers, by id."""

    def describe(self, table: TableInfo, partition_id: int | None = None) -> dict[int, BucketLeadership]:
        """Every bucket's leader and replicas (may read ZooKeeper: blocks)."""

    def describe_known(self, table: TableInfo, partition_id: int | None = None) -> dict[int, BucketLeadership] | None:
        """:meth:`describe` from memory alone, None when that would need a read (safe on an event loop)."""

    def health(self, table: TableInfo, partition_id: int | None = None) -> list[BucketHealth]:
        """Every bucket's replica, ISR and leader counts."""

    def assign(self, table: TableInfo, partition_id: int | None = None) -> dict[int, int]:
        """Place the buckets of a new table (or partition) and record where; returns the assignment.
        Raises InvalidReplicationFactorError when no tablet server is there to take them."""


class SingleNodePlacement:
    """One process hosts every bucket."""

    def __init__(self, node: ServerNode) -> None:
        self._node = node

    def coordinator(self) -> ServerNode:
        return self._node

    def tablet_servers(self) -> list[ServerNode]:
        return [self._node]

    def describe(self, table: TableInfo, partition_id: int | None = None) -> dict[int, BucketLeadership]:
        me = self._node.node_id
        return {bucket: BucketLeadership(me, (me,), isr=(me,)) for bucket in range(table.bucket_count)}

    def describe_known(self, table: TableInfo, partition_id: int | None = None) -> dict[int, BucketLeadership]:
        return self.describe(table, partition_id)

    def health(self, table: TableInfo, partition_id: int | None = None) -> list[BucketHealth]:
        return [BucketHealth(1, 1, True)] * table.bucket_count  # this process leads every bucket it serves

    def assign(self, table: TableInfo, partition_id: int | None = None) -> dict[int, int]:
        return dict.fromkeys(range(table.bucket_count), self._node.node_id)


def replica_assignment(
    bucket_count: int, factor: int, servers: Mapping[int, str | None], start: int
) -> list[tuple[int, ...]]:
    """Each bucket's replicas (its first leader first) over ``servers`` (id -> rack), ``factor`` distinct
    servers per bucket, first replicas round robin from position ``start``.

    Without a rack on every server, bucket ``b``'s replicas are the ``factor`` servers from position
    ``start + b`` of the id-sorted list. With racks, the list alternates racks (the first server of each
    rack, then the second of each, …) and each bucket takes, after its first replica, the next servers of
    racks it has no replica on yet, until every rack has one, then the next servers of any rack: a bucket
    spans min(factor, racks) racks, and a rack lost takes at most that share of its replicas.
    """
    ids = sorted(servers)
    if not ids or factor > len(ids):
        raise ValueError(f"{factor} replicas need as many servers, there are {len(ids)}")
    racks = {server: servers[server] for server in ids}
    if any(rack is None for rack in racks.values()):
        return [tuple(ids[(start + bucket + i) % len(ids)] for i in range(factor)) for bucket in range(bucket_count)]
    by_rack: dict[str | None, list[int]] = {}
    for server in ids:
        by_rack.setdefault(racks[server], []).append(server)
    columns = [by_rack[rack] for rack in sorted(by_rack, key=str)]
    order = [column[row] for row in range(max(map(len, columns))) for column in columns if row < len(column)]
    rack_count = len(columns)
    assignment = []
    for bucket in range(bucket_count):
        first = (start + bucket) % len(order)
        following = [order[(first + step) % len(order)] for step in range(1, len(order))]
        shift = (bucket // len(order)) % max(1, len(following))  # later rounds pair servers differently
        following = following[shift:] + following[:shift]
        replicas = [order[first]]
        used_racks = {racks[order[first]]}
        for server in following:
            if len(replicas) == factor:
                break
            if racks[server] not in used_racks or len(used_racks) == rack_count:
                replicas.append(server)
                used_racks.add(racks[server])
        for server in following:  # more replicas than racks: fill from any rack
            if len(replicas) == factor:
                break
            if server not in replicas:
                replicas.append(server)
        assignment.append(tuple(replicas))
    return assignment


def placed_tables(store: CatalogStore, table_of: Callable[[int], TableInfo | None]) -> list[tuple[TableInfo, int | None]]:
    """Every table with each of its partitions (None for an unpartitioned table): what has buckets."""
    found: list[tuple[TableInfo, int | None]] = []
    for database in store.list_databases():
        for name in store.list_tables(database):
            record = store.get_table(database, name)
            table = table_of(record.table_id) if record is not None else None
            if table is None:
                continue
            if table.is_partitioned:
                found += [(table, partition.partition_id) for partition in store.list_partitions(table.table_id)]
            else:
                found.append((table, None))
    return found


__all__ = ["BucketHealth", "BucketLeadership", "BucketPlacement", "LiveServers", "ServerNode", "SingleNodePlacement", "placed_tables", "replica_assignment"]
