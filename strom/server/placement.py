"""Where buckets live: the servers of the cluster and the tablet server leading each bucket.

The coordinator answers metadata requests from a :class:`BucketPlacement`, and so does a tablet server of a
cluster (clients ask whichever server they know). One process serving both roles places every bucket on
itself (:class:`SingleNodePlacement`); a cluster records each table's (and partition's) assignment in the
metadata store when it is created and knows the live tablet servers from their ZooKeeper registrations
(:class:`ClusterPlacement`). Buckets are not replicated yet: each has one replica, its leader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from strom.cluster.bucket_state import BucketStates, LeaderAndIsr
from strom.errors import InvalidReplicationFactorError
from strom.metadata import table_options
from strom.metadata.store import MetadataStore
from strom.metadata.table_info import TableInfo
from strom.rpc.messages import pb


@dataclass(frozen=True, slots=True)
class ServerNode:
    node_id: int
    host: str
    port: int

    def to_pb(self) -> Any:
        return pb.PbServerNode(node_id=self.node_id, host=self.host, port=self.port)


@dataclass(frozen=True, slots=True)
class BucketLeadership:
    """What metadata tells clients of one bucket."""

    leader: int | None
    """None while no replica can lead it (its servers are down)."""
    replicas: tuple[int, ...]
    leader_epoch: int = 0


class LiveServers(Protocol):
    """The tablet servers currently registered (``strom.cluster.registry.TabletServerRegistry``)."""

    def live(self) -> dict[int, Any]: ...


class BucketPlacement(Protocol):
    def coordinator(self) -> ServerNode: ...

    def tablet_servers(self) -> list[ServerNode]:
        """The live tablet servers, by id."""

    def describe(self, table: TableInfo, partition_id: int | None = None) -> dict[int, BucketLeadership]:
        """Every bucket's leader and replicas."""

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
        return {bucket: BucketLeadership(me, (me,)) for bucket in range(table.bucket_count)}

    def assign(self, table: TableInfo, partition_id: int | None = None) -> dict[int, int]:
        return dict.fromkeys(range(table.bucket_count), self._node.node_id)


class ClusterPlacement:
    """Buckets spread over the tablet servers registered in ZooKeeper, round robin at creation.

    Each bucket gets ``table.replication.factor`` replicas on distinct servers; the first is its first
    leader. Where each bucket's leadership stands (leader, epoch, ISR) lives in ZooKeeper
    (:mod:`strom.cluster.bucket_state`): the coordinator moves it when a leader's server is gone. The
    assignment is also stored in the metadata store (``put_bucket_assignment``), the replicas of each bucket.
    """

    def __init__(
        self,
        store: MetadataStore,
        servers: LiveServers,
        coordinator: ServerNode | Callable[[], ServerNode],
        states: BucketStates,
    ) -> None:
        """``coordinator``: this process's node on the coordinator, a function (following ZooKeeper) elsewhere."""
        self._store = store
        self._servers = servers
        self._coordinator = coordinator
        self.states = states

    def coordinator(self) -> ServerNode:
        return self._coordinator if isinstance(self._coordinator, ServerNode) else self._coordinator()

    def tablet_servers(self) -> list[ServerNode]:
        return [ServerNode(i, s.host, s.port) for i, s in sorted(self._servers.live().items())]

    def describe(self, table: TableInfo, partition_id: int | None = None) -> dict[int, BucketLeadership]:
        buckets = table.buckets(partition_id)
        states = self.states.get_many(buckets)
        live = self._servers.live()
        described = {}
        for bucket in buckets:
            state = states.get(bucket)
            if state is None:
                continue  # created before the cluster had tablet servers, or a record was lost
            leader = state.leader if state.leader in live else None
            described[bucket.bucket] = BucketLeadership(leader, state.replicas, state.leader_epoch)
        return described

    def assign(self, table: TableInfo, partition_id: int | None = None) -> dict[int, int]:
        existing = self._store.get_bucket_assignment(table.table_id, partition_id)
        if existing is not None:
            return existing
        servers = sorted(self._servers.live())
        factor = int(table.properties.get(table_options.REPLICATION_FACTOR, table_options.DEFAULT_REPLICATION_FACTOR))
        if len(servers) < factor:
            raise InvalidReplicationFactorError(
                f"Replication factor: {factor} larger than available tablet servers: {len(servers)}."
            )
        # start each table (and partition) at a different server so small tables spread too
        start = (table.table_id + (partition_id or 0)) % len(servers)
        assignment = {}
        for bucket in table.buckets(partition_id):
            replicas = tuple(servers[(start + bucket.bucket + i) % len(servers)] for i in range(factor))
            self.states.create(bucket, LeaderAndIsr(replicas[0], 0, replicas, replicas))
            assignment[bucket.bucket] = replicas[0]
        self._store.put_bucket_assignment(table.table_id, partition_id, assignment)
        return assignment


def placed_tables(store: MetadataStore, table_of: Callable[[int], TableInfo | None]) -> list[tuple[TableInfo, int | None]]:
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


__all__ = [
    "BucketLeadership", "BucketPlacement", "ClusterPlacement", "LiveServers", "ServerNode", "SingleNodePlacement",
    "placed_tables",
]
