"""GetClusterHealth (1062): is every bucket led, and is every replica in sync?

Fluss's readiness answer for rolling restarts: over every bucket of every table and partition, the count
of replicas, of replicas in the ISR, of buckets (each has one leader replica) and of buckets whose leader
is active. GREEN: every leader active and every replica in sync; YELLOW: every leader active, some
replica out of sync; RED: some bucket without an active leader. Counted by the active coordinator from
its placement (``strom server``: one process leads everything it serves; a cluster: each bucket's
leadership in ZooKeeper and the live tablet servers).
"""

from __future__ import annotations

from typing import Any

from strom.coordinator.placement import BucketPlacement, placed_tables
from strom.coordinator.service import CoordinatorService
from strom.metadata.cluster_health import ClusterHealth
from strom.metadata.off_loop import off_loop
from strom.metadata.store import MetadataStore
from strom.rpc.messages import pb


class ClusterHealthService:
    def __init__(self, coordinator: CoordinatorService, store: MetadataStore, placement: BucketPlacement) -> None:
        self._coordinator = coordinator
        self._store = store
        self._placement = placement

    def health(self) -> ClusterHealth:
        """Counted over every bucket (blocks: store and ZooKeeper reads; run it with :func:`off_loop`)."""
        replicas = in_sync = leaders = active = 0
        for table, partition_id in placed_tables(self._store, self._coordinator.table_info_by_id):
            for bucket in self._placement.health(table, partition_id):
                replicas += bucket.replicas
                in_sync += bucket.in_sync
                leaders += 1
                active += bucket.leader_active
        return ClusterHealth.counted(replicas, in_sync, leaders, active)

    async def get_cluster_health(self, _request: Any, _context: object) -> Any:
        health = await off_loop(self.health)
        return pb.GetClusterHealthResponse(
            num_replicas=health.num_replicas, in_sync_replicas=health.in_sync_replicas,
            num_leader_replicas=health.num_leader_replicas, active_leader_replicas=health.active_leader_replicas,
            status=int(health.status),
        )


__all__ = ["ClusterHealthService"]
