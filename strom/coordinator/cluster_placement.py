"""Buckets placed over a cluster's tablet servers, with each bucket's leadership kept in ZooKeeper.

The coordinator of a cluster answers metadata from :class:`ClusterPlacement`; ``strom server`` (one process)
uses :class:`~strom.coordinator.placement.SingleNodePlacement` and never loads ZooKeeper's client.
"""

from __future__ import annotations

from collections.abc import Callable

from strom.coordinator.placement import BucketHealth, BucketLeadership, LiveServers, replica_assignment
from strom.errors import InvalidReplicationFactorError
from strom.ids import TableBucket
from strom.membership.contract import BucketStates, LeaderAndIsr
from strom.metadata.rebalance_plan import decode_tags
from strom.metadata.store import MetadataStore
from strom.metadata.table_info import TableInfo
from strom.rpc.peers import ServerNode


class ClusterPlacement:
    """Buckets spread over the tablet servers registered in ZooKeeper, round robin at creation.

    Each bucket gets ``table.replication.factor`` replicas on distinct servers; the first is its first
    leader. Where each bucket's leadership stands (leader, epoch, ISR) lives in ZooKeeper
    (:mod:`strom.zk.bucket_state`): the coordinator moves it when a leader's server is gone. The
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
        return [node for _, node in sorted(self._servers.live().items())]

    def describe(self, table: TableInfo, partition_id: int | None = None) -> dict[int, BucketLeadership]:
        buckets = table.buckets(partition_id)
        return self._described(buckets, self.states.leaderships(buckets))

    def describe_known(self, table: TableInfo, partition_id: int | None = None) -> dict[int, BucketLeadership] | None:
        buckets = table.buckets(partition_id)
        states = self.states.remembered(buckets)  # the active coordinator's, without a ZooKeeper read
        return None if states is None else self._described(buckets, states)

    def _described(self, buckets: list[TableBucket], states: dict[TableBucket, LeaderAndIsr]) -> dict[int, BucketLeadership]:
        live = self._servers.live()
        described = {}
        for bucket in buckets:
            state = states.get(bucket)
            if state is None:
                continue  # created before the cluster had tablet servers, or a record was lost
            leader = state.leader if state.leader in live else None
            described[bucket.bucket] = BucketLeadership(leader, state.replicas, state.leader_epoch, tuple(state.isr))
        return described

    def health(self, table: TableInfo, partition_id: int | None = None) -> list[BucketHealth]:
        """From each bucket's ZooKeeper state: a bucket without one (created before the cluster had tablet
        servers) counts its replication factor's replicas, none in sync, and no active leader."""
        buckets = table.buckets(partition_id)
        states = self.states.get_many(buckets)
        live = self._servers.live()
        factor = table.options.replication_factor
        found = []
        for bucket in buckets:
            state = states.get(bucket)
            if state is None:
                found.append(BucketHealth(factor, 0, False))
                continue
            in_sync = sum(1 for server in state.isr if server in live)
            found.append(BucketHealth(len(state.replicas), in_sync, state.leader in live))
        return found

    def assign(self, table: TableInfo, partition_id: int | None = None) -> dict[int, int]:
        existing = self._store.get_bucket_assignment(table.table_id, partition_id)
        if existing is not None:
            return existing
        live = self._servers.live()
        factor = table.options.replication_factor
        tagged = decode_tags(self._store.get_server_tags())
        untagged = {server: node for server, node in live.items() if server not in tagged}
        if len(untagged) >= factor:
            live = untagged  # servers tagged offline take no new replicas while enough others are there
        if len(live) < factor:
            raise InvalidReplicationFactorError(
                f"Replication factor: {factor} larger than available tablet servers: {len(live)}."
            )
        # start each table (and partition) at a different server so small tables spread too
        start = (table.table_id + (partition_id or 0)) % len(live)
        placed = replica_assignment(table.bucket_count, factor, {s: node.rack for s, node in live.items()}, start)
        assignment = {}
        for bucket, replicas in zip(table.buckets(partition_id), placed, strict=True):
            self.states.create(bucket, LeaderAndIsr(replicas[0], 0, replicas, replicas))
            assignment[bucket.bucket] = replicas[0]
        self._store.put_bucket_assignment(table.table_id, partition_id, assignment)
        return assignment


__all__ = ["ClusterPlacement"]
