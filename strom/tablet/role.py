"""The tablet server's services, wired once for ``strom server`` and for a cluster's tablet server: the
buckets (:class:`ReplicaManager`), their RPCs (:class:`TabletService`, :class:`ScanKvService`) and the loop
that takes KV snapshots and applies log retention (:class:`KvSnapshotScheduler`), and the one that copies
closed log segments to remote storage (:class:`RemoteLogManager`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from strom.clock import Clock
from strom.config import (
    KV_SNAPSHOT_INTERVAL,
    LOG_INDEX_INTERVAL_SIZE,
    LOG_REPLICA_MIN_IN_SYNC_REPLICAS_NUMBER,
    LOG_RETENTION_CHECK_INTERVAL,
    REMOTE_LOG_TASK_INTERVAL_DURATION,
    REMOTE_LOG_TASK_MAX_UPLOAD_SEGMENTS,
    TABLE_LOG_TTL,
    TABLET_SERVER_ID,
    Configuration,
)
from strom.ids import TableBucket
from strom.kv.auto_increment import IdCounter
from strom.kv.scan import ScannerConfig, ScannerManager
from strom.kv.snapshot import CompletedKvSnapshot
from strom.metadata.table_info import TableInfo
from strom.remote.storage import RemoteStorage
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.rpc.server import Handler, WithBodyPath
from strom.tablet.data_dirs import open_configured
from strom.tablet.disk_guard import DiskWriteGuard
from strom.tablet.historical_lookups import HistoricalLookups
from strom.tablet.kv_snapshot_scheduler import KvSnapshotScheduler, SnapshotCommitter
from strom.tablet.remote_log_manager import (
    CommitManifest,
    OldestSnapshot,
    PartitionName,
    ReadHandle,
    RemoteLogManager,
    RemoteLogSettings,
)
from strom.tablet.replica import ReplicaManager
from strom.tablet.scan_service import ScanKvService
from strom.tablet.tablet_service import TabletService


class TabletRole:
    """Owned by the event loop. Scan sessions start with the role; the snapshot loop with
    :meth:`start_snapshots` (once the side that commits snapshots is up)."""

    def __init__(
        self,
        data_dir: Path,
        config: Configuration,
        clock: Clock,
        remote: RemoteStorage,
        scanner_config: ScannerConfig,
        latest_snapshot: Callable[[TableBucket], CompletedKvSnapshot | None],
        id_counter: IdCounter,
        resolve_bucket: Callable[[TableBucket], TableInfo | None] | None = None,
    ) -> None:
        """``data_dir``: ``data.dir``, the buckets' directory unless ``data.dirs`` names others
        (:func:`~strom.tablet.data_dirs.open_configured`); ``resolve_bucket``: in a cluster, the table of a
        bucket assigned to this server it does not host yet (:class:`~strom.tablet.replica.ReplicaManager`)."""
        self.config = config
        self.clock = clock
        self.remote = remote
        self.directories = open_configured(config, data_dir)
        scanners = ScannerManager(scanner_config, clock)
        self.replicas = ReplicaManager(self.directories, config, remote, latest_snapshot, id_counter,
                                       before_reopen=scanners.close_scanners_for_bucket, resolve_bucket=resolve_bucket)
        self.tablet = TabletService(self.replicas, config, clock)
        self.disk = DiskWriteGuard(config.get(TABLET_SERVER_ID), self.directories.online_paths, config)
        self.disk.start()
        self.directories.start()
        self.tablet.guard_disk(self.disk)
        self.scans = ScanKvService(self.replicas, scanners, clock)
        self.scans.start()
        self.snapshot_scheduler: KvSnapshotScheduler | None = None
        self.remote_logs: RemoteLogManager | None = None
        self.historical = HistoricalLookups(config)
        """Lookups of expired partitions, read from the lake (served once :meth:`serve_historical` ran)."""

    def serve_historical(self, partition_name: PartitionName) -> None:
        """Answer lookups of expired partitions (``partition_name``: a partition id's name, from the catalog)."""
        self.tablet.serve_historical(self.historical, partition_name)

    def start_snapshots(self, committer: SnapshotCommitter, staging_dir: Path) -> KvSnapshotScheduler:
        self.snapshot_scheduler = KvSnapshotScheduler(
            self.replicas,
            committer,
            self.remote,
            interval_ms=self.config.get_ms(KV_SNAPSHOT_INTERVAL),
            retention_check_interval_ms=self.config.get_ms(LOG_RETENTION_CHECK_INTERVAL),
            local_dir=staging_dir,
            clock=self.clock,
            default_log_ttl=self.config.get(TABLE_LOG_TTL),
        )
        self.snapshot_scheduler.start()
        return self.snapshot_scheduler

    def apply(self, config: Configuration) -> None:
        """Cluster configs changed at run time: the snapshot interval, the minimum of in-sync replicas and
        the data disk's write ratios."""
        self.config = config
        self.tablet.set_min_in_sync(config.get(LOG_REPLICA_MIN_IN_SYNC_REPLICAS_NUMBER))
        self.disk.apply(config)
        if self.snapshot_scheduler is not None:
            self.snapshot_scheduler.set_interval_ms(config.get_ms(KV_SNAPSHOT_INTERVAL))

    def start_remote_logs(
        self,
        *,
        read_handle: ReadHandle,
        commit: CommitManifest,
        partition_name: PartitionName,
        oldest_snapshot: OldestSnapshot,
        coordinator_epoch: Callable[[], int] = lambda: 0,
    ) -> RemoteLogManager:
        """Copy closed segments to remote storage and serve reads below the local logs from there (off when
        ``remote.log.task-interval-duration`` is 0)."""
        config = self.config
        settings = RemoteLogSettings(
            interval_ms=config.get_ms(REMOTE_LOG_TASK_INTERVAL_DURATION),
            max_upload_segments=config.get(REMOTE_LOG_TASK_MAX_UPLOAD_SEGMENTS),
            index_interval_bytes=config.get(LOG_INDEX_INTERVAL_SIZE),
            default_ttl=config.get(TABLE_LOG_TTL),
        )
        self.remote_logs = RemoteLogManager(
            self.replicas, self.remote, settings, self.clock, read_handle=read_handle, commit=commit,
            partition_name=partition_name, oldest_snapshot=oldest_snapshot, coordinator_epoch=coordinator_epoch,
        )
        if self.remote_logs.enabled:
            self.tablet.read_remote_logs(self.remote_logs)
            self.remote_logs.start()
        return self.remote_logs

    async def stop_replicas(self, table_id: int, partition_id: int | None, *, delete: bool) -> None:
        """Stop hosting a table's (or partition's) buckets, closing their scan sessions first."""
        self.scans.on_buckets_stopped(table_id, partition_id)  # before the RocksDB instances close
        if delete and self.remote_logs is not None:
            self.remote_logs.forget(table_id, partition_id)
        await self.replicas.stop_replicas(table_id, partition_id, delete=delete)

    def handlers(self) -> dict[ApiKey, Handler]:
        """The tablet-server role's requests: the buckets' logs and KV state."""
        tablet = self.tablet
        return {
            ApiKey.PRODUCE_LOG: tablet.produce_log,
            ApiKey.FETCH_LOG: tablet.fetch_log,
            ApiKey.LIST_OFFSETS: tablet.list_offsets,
            ApiKey.PUT_KV: tablet.put_kv,
            ApiKey.LOOKUP: WithBodyPath(tablet.lookup, tablet.answer_plain_lookup),
            ApiKey.PREFIX_LOOKUP: tablet.prefix_lookup,
            ApiKey.LIMIT_SCAN: tablet.limit_scan,
            ApiKey.GET_TABLE_STATS: tablet.get_table_stats,
            ApiKey.GET_FILESYSTEM_SECURITY_TOKEN: tablet.get_file_system_security_token,
            ApiKey.SCAN_KV: self.scans.scan_kv,
            ApiKey.NOTIFY_REMOTE_LOG_OFFSETS: self._notify_remote_log_offsets,
        }

    async def _notify_remote_log_offsets(self, request: Any, context: object) -> Any:
        if self.remote_logs is None:
            return pb.NotifyRemoteLogOffsetsResponse()
        return await self.remote_logs.notify_remote_log_offsets(request, context)

    async def stop(self) -> None:
        """Stop the snapshot and remote log loops and the scan sessions, then close every bucket."""
        if self.remote_logs is not None:
            await self.remote_logs.stop()
        if self.snapshot_scheduler is not None:
            await self.snapshot_scheduler.stop()
        await self.scans.stop()
        self.historical.close()
        await self.disk.stop()
        await self.directories.stop()
        self.replicas.close()
        self.directories.close()


__all__ = ["TabletRole"]
