"""The coordinator's services over one metadata store, wired once for ``strom server`` and for a cluster's
active coordinator: the catalog (:class:`CoordinatorService`), KV snapshot records, retention and leases
(:class:`KvSnapshotService`), the lake tiering manager (:class:`LakeTieringService`), the buckets' remote
log manifests (:class:`RemoteLogManifestService`), producer offsets (:class:`ProducerOffsetsManager`) and
auto-partitioning (:class:`AutoPartitionManager`).

Built in two steps because the one-process server's tablet role needs the snapshot store (to restore a
bucket from its latest snapshot) before the catalog hands it its buckets.
"""

from __future__ import annotations

import asyncio
import logging

from strom.clock import Clock
from strom.config import (
    AUTO_PARTITION_CHECK_INTERVAL,
    COORDINATOR_PRODUCER_OFFSETS_CLEANUP_INTERVAL,
    COORDINATOR_PRODUCER_OFFSETS_TTL,
    KV_LEADER_REPLICA_MEMORY_RESERVED,
    KV_SNAPSHOT_LEASE_EXPIRATION_CHECK_INTERVAL,
    KV_SNAPSHOT_NUM_RETAINED,
    LAKE_TIERING_HEARTBEAT_CHECK_INTERVAL,
    LAKE_TIERING_HEARTBEAT_TIMEOUT,
    SUPER_USERS,
    TABLE_DATALAKE_FRESHNESS,
    Configuration,
    DynamicConfig,
)
from strom.coordinator.acl_service import AclService
from strom.coordinator.auto_partitions import AutoPartitionManager
from strom.coordinator.cluster_configs import ClusterConfigService
from strom.coordinator.cluster_health import ClusterHealthService
from strom.coordinator.gateway import TabletServerGateway
from strom.coordinator.kv_snapshot_leases import KvSnapshotLeaseManager
from strom.coordinator.kv_snapshot_service import KvSnapshotService
from strom.coordinator.kv_snapshot_store import KvSnapshotStore
from strom.coordinator.lake_service import LakeTieringService
from strom.coordinator.lake_tiering import LakeTableTieringManager
from strom.coordinator.placement import BucketPlacement
from strom.coordinator.producer_offsets import ProducerOffsetsManager, ProducerOffsetsService
from strom.coordinator.rebalance import BucketMover, RebalanceManager
from strom.coordinator.remote_log_manifests import LeaderEpochOf, NotifyFollowers, RemoteLogManifestService
from strom.coordinator.service import CoordinatorService
from strom.metadata.off_loop import off_loop
from strom.metadata.store import MetadataStore
from strom.metadata.table_info import TableInfo
from strom.remote.storage import RemoteStorage
from strom.rpc.api_keys import ApiKey
from strom.rpc.server import Handler

log = logging.getLogger(__name__)


class CoordinatorRole:
    """Owned by the event loop: :meth:`start` once, :meth:`stop` once."""

    def __init__(
        self, store: MetadataStore, config: Configuration, clock: Clock, remote: RemoteStorage,
        dynamic: DynamicConfig | None = None,
    ) -> None:
        """Loads the persisted state (leases, snapshot records, lake tiering states) from ``store``.
        ``dynamic``: the process's configuration with its run-time changes (AlterClusterConfigs changes
        it); ``config`` is its current value."""
        self.store = store
        self.config = config
        self.dynamic = dynamic if dynamic is not None else DynamicConfig(config)
        self.clock = clock
        self.remote = remote
        self.leases = KvSnapshotLeaseManager(store, clock)
        self.snapshot_store = KvSnapshotStore(store, remote, config.get(KV_SNAPSHOT_NUM_RETAINED), self.leases.is_leased)
        self.lake_tiering = LakeTableTieringManager(
            store, clock, config.get_ms(LAKE_TIERING_HEARTBEAT_TIMEOUT),
            config.get_ms(LAKE_TIERING_HEARTBEAT_CHECK_INTERVAL),
        )
        self.producer_offsets = ProducerOffsetsManager(
            store, clock, config.get_ms(COORDINATOR_PRODUCER_OFFSETS_TTL),
            config.get_ms(COORDINATOR_PRODUCER_OFFSETS_CLEANUP_INTERVAL),
        )
        self.coordinator: CoordinatorService | None = None
        self.lake: LakeTieringService | None = None
        self.remote_logs: RemoteLogManifestService | None = None
        self.snapshots: KvSnapshotService | None = None
        self.auto_partitions: AutoPartitionManager | None = None
        self.health: ClusterHealthService | None = None
        self.rebalance: RebalanceManager | None = None
        self._applying: list[asyncio.Task[None]] = []

    async def start(
        self,
        tablets: TabletServerGateway,
        placement: BucketPlacement,
        *,
        leader_epoch_of: LeaderEpochOf | None = None,
        notify_followers: NotifyFollowers | None = None,
        mover: BucketMover | None = None,
    ) -> CoordinatorService:
        """Hand the tablet servers their buckets, start the lease expiry and tiering loops, and sweep remote
        files no snapshot references (before any upload of this run can be in flight). A cluster gives
        ``leader_epoch_of`` (remote log commits of deposed leaders are refused), ``notify_followers`` and
        ``mover`` (rebalance moves buckets; without it a plan that must move one is refused)."""
        self.coordinator = coordinator = CoordinatorService(
            self.store, tablets, self.config, self.clock, placement, self.lake_tiering, self._on_table_dropped
        )
        await coordinator.start()
        self.health = ClusterHealthService(coordinator, self.store, placement)
        self.lake = LakeTieringService(coordinator, self.lake_tiering, self.store, self.remote, tablets)
        self.lake.start()
        self.snapshots = KvSnapshotService(
            coordinator, self.snapshot_store, self.leases, self.clock,
            self.config.get_ms(KV_SNAPSHOT_LEASE_EXPIRATION_CHECK_INTERVAL), self.config.get(SUPER_USERS), tablets,
        )
        self.snapshots.start()
        self.remote_logs = RemoteLogManifestService(coordinator, self.store, self.remote, leader_epoch_of,
                                                    notify_followers)
        self.producer_offsets.start()
        self.auto_partitions = AutoPartitionManager(
            coordinator, self.clock, self.config.get_ms(AUTO_PARTITION_CHECK_INTERVAL)
        )
        await self.auto_partitions.catch_up()
        self.auto_partitions.start()
        self.rebalance = await off_loop(RebalanceManager, self.store, placement, coordinator.table_info_by_id, mover)
        self.rebalance.start()
        await self.snapshot_store.sweep_unreferenced()
        return coordinator

    def apply(self, config: Configuration) -> None:
        """Cluster configs changed at run time: the producer offsets' default TTL, the auto-partition check
        interval, the KV leader replica capacity's memory per leader, and the lake freshness of tables that
        do not set their own."""
        self.config = config
        self.producer_offsets.default_ttl_ms = config.get_ms(COORDINATOR_PRODUCER_OFFSETS_TTL)
        if self.auto_partitions is not None:
            self.auto_partitions.check_interval_ms = config.get_ms(AUTO_PARTITION_CHECK_INTERVAL)
        if self.coordinator is not None:
            self.coordinator.kv_leader_capacity.reserved_bytes = config.get(KV_LEADER_REPLICA_MEMORY_RESERVED)
            self._applying.append(asyncio.ensure_future(
                self.coordinator.set_default_freshness_ms(config.get_ms(TABLE_DATALAKE_FRESHNESS))
            ))

    async def settled(self) -> None:
        """Wait until what :meth:`apply` started has finished (lake tables rescheduled: store writes)."""
        while self._applying:
            try:
                await self._applying.pop(0)
            except Exception:
                log.exception("applying the changed cluster configs to the lake tables failed")

    async def _on_table_dropped(self, table: TableInfo, partition_id: int | None) -> None:
        """Release a dropped table's (or partition's) KV snapshots, leases and lake offsets files."""
        assert self.snapshots is not None and self.remote_logs is not None
        await self.snapshots.on_table_dropped(table, partition_id)
        await self.remote_logs.drop_table(table, partition_id)
        if partition_id is None and self.lake is not None:
            await self.lake.drop_table(table)

    def handlers(self, acls: AclService) -> dict[ApiKey, Handler]:
        """The coordinator role's requests: catalog, metadata, KV snapshot records and leases, lake, producer
        offsets, ACLs."""
        coordinator, snapshots, lake, remote_logs = self.coordinator, self.snapshots, self.lake, self.remote_logs
        assert coordinator is not None and snapshots is not None and lake is not None and remote_logs is not None, \
            "start() first"
        assert self.health is not None and self.rebalance is not None
        rebalance = self.rebalance
        producers = ProducerOffsetsService(self.producer_offsets,
                                           lambda table_id: coordinator.table_info_by_id(table_id) is not None)
        configs = ClusterConfigService(self.store, self.dynamic, self.settled)
        return {
            ApiKey.COMMIT_REMOTE_LOG_MANIFEST: remote_logs.commit_remote_log_manifest,
            ApiKey.LIST_REMOTE_LOG_MANIFESTS: remote_logs.list_remote_log_manifests,
            ApiKey.ALTER_TABLE: coordinator.alter_table,
            ApiKey.LAKE_TIERING_HEARTBEAT: lake.lake_tiering_heartbeat,
            ApiKey.PREPARE_LAKE_TABLE_SNAPSHOT: lake.prepare_lake_table_snapshot,
            ApiKey.COMMIT_LAKE_TABLE_SNAPSHOT: lake.commit_lake_table_snapshot,
            ApiKey.GET_LAKE_SNAPSHOT: lake.get_lake_snapshot,
            ApiKey.DESCRIBE_LAKE_TIERING: lake.describe_lake_tiering,
            ApiKey.CREATE_DATABASE: coordinator.create_database,
            ApiKey.DROP_DATABASE: coordinator.drop_database,
            ApiKey.ALTER_DATABASE: coordinator.alter_database,
            ApiKey.LIST_DATABASES: coordinator.list_databases,
            ApiKey.DATABASE_EXISTS: coordinator.database_exists,
            ApiKey.GET_DATABASE_INFO: coordinator.get_database_info,
            ApiKey.CREATE_TABLE: coordinator.create_table,
            ApiKey.DROP_TABLE: coordinator.drop_table,
            ApiKey.CREATE_PARTITION: coordinator.create_partition,
            ApiKey.DROP_PARTITION: coordinator.drop_partition,
            ApiKey.LIST_PARTITION_INFOS: coordinator.list_partition_infos,
            ApiKey.LIST_TABLES: coordinator.list_tables,
            ApiKey.TABLE_EXISTS: coordinator.table_exists,
            ApiKey.GET_LATEST_KV_SNAPSHOTS: snapshots.get_latest_kv_snapshots,
            ApiKey.GET_KV_SNAPSHOT_METADATA: snapshots.get_kv_snapshot_metadata,
            ApiKey.LIST_KV_SNAPSHOTS: snapshots.list_kv_snapshots,
            ApiKey.ACQUIRE_KV_SNAPSHOT_LEASE: snapshots.acquire_kv_snapshot_lease,
            ApiKey.RELEASE_KV_SNAPSHOT_LEASE: snapshots.release_kv_snapshot_lease,
            ApiKey.DROP_KV_SNAPSHOT_LEASE: snapshots.drop_kv_snapshot_lease,
            ApiKey.LIST_KV_SNAPSHOT_LEASES: snapshots.list_kv_snapshot_leases,
            ApiKey.REGISTER_PRODUCER_OFFSETS: producers.register_producer_offsets,
            ApiKey.GET_PRODUCER_OFFSETS: producers.get_producer_offsets,
            ApiKey.DELETE_PRODUCER_OFFSETS: producers.delete_producer_offsets,
            ApiKey.GET_CLUSTER_HEALTH: self.health.get_cluster_health,
            ApiKey.DESCRIBE_CLUSTER_CONFIGS: configs.describe_cluster_configs,
            ApiKey.ALTER_CLUSTER_CONFIGS: configs.alter_cluster_configs,
            ApiKey.ADD_SERVER_TAG: rebalance.add_server_tag,
            ApiKey.REMOVE_SERVER_TAG: rebalance.remove_server_tag,
            ApiKey.REBALANCE: rebalance.rebalance,
            ApiKey.LIST_REBALANCE_PROGRESS: rebalance.list_rebalance_progress,
            ApiKey.CANCEL_REBALANCE: rebalance.cancel_rebalance,
            ApiKey.CREATE_ACLS: acls.create_acls,
            ApiKey.LIST_ACLS: acls.list_acls,
            ApiKey.DROP_ACLS: acls.drop_acls,
            **coordinator.handlers(),
        }

    async def stop(self) -> None:
        if self.rebalance is not None:
            await self.rebalance.stop()
        if self.auto_partitions is not None:
            await self.auto_partitions.stop()
        await self.producer_offsets.stop()
        if self.remote_logs is not None:
            await self.remote_logs.stop()
        if self.snapshots is not None:
            await self.snapshots.stop()
        if self.lake is not None:
            await self.lake.stop()


__all__ = ["CoordinatorRole"]
