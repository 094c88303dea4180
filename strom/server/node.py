"""A single-node strom cluster: the coordinator and tablet-server roles behind one RPC port.

Start-up order: metadata store and remote storage, the coordinator's snapshot store and lease manager,
the tablet server (replicas), the coordinator (which hands the tablet server its buckets), background
loops, then the RPC listener. Shutdown reverses it: stop accepting, cancel in-flight requests, stop the
loops, close the buckets, close the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from strom.clock import SYSTEM_CLOCK, Clock
from strom.config import (
    ADVERTISED_HOST,
    ADVERTISED_LISTENERS,
    CONNECTION_MAX_IDLE_TIME,
    DATALAKE_DELTA_WAREHOUSE,
    DATALAKE_FORMAT,
    DATALAKE_ICEBERG_WAREHOUSE,
    DATALAKE_LANCE_WAREHOUSE,
    DATALAKE_PAIMON_WAREHOUSE,
    KV_SCANNER_EXPIRATION_INTERVAL,
    KV_SCANNER_MAX_BATCH_SIZE,
    KV_SCANNER_MAX_PER_BUCKET,
    KV_SCANNER_MAX_PER_SERVER,
    KV_SCANNER_TTL,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    MAX_CONNECTIONS_PER_IP_OVERRIDES,
    MAX_REQUEST_SIZE,
    METRICS_PORT,
    REMOTE_DATA_DIR,
    SECURITY_FAILED_AUTHENTICATION_BLOCK_TIME,
    SECURITY_FAILED_AUTHENTICATION_MAX_PER_ADDRESS,
    SECURITY_INTERNAL_LOGIN_ON_ALL_LISTENERS,
    SECURITY_UNAUTHENTICATED_MAX_BUFFERED_BYTES,
    SECURITY_UNAUTHENTICATED_MAX_IDLE_TIME,
    SERVER_MAX_BUFFERED_REQUEST_BYTES,
    SERVER_MAX_IN_FLIGHT_PER_CONNECTION,
    TABLET_SERVER_ID,
    Configuration,
    DynamicConfig,
    reporter_enabled,
    zookeeper_location,
)
from strom.coordinator.acl_service import AclService
from strom.coordinator.cluster_configs import stored_dynamic
from strom.coordinator.kv_snapshot_service import KvSnapshotService
from strom.coordinator.lake_service import LakeTieringService
from strom.coordinator.placement import SingleNodePlacement
from strom.coordinator.role import CoordinatorRole
from strom.coordinator.service import CoordinatorService
from strom.errors import InvalidConfigError
from strom.ids import TableBucket
from strom.kv import rocksdb
from strom.kv.scan import ScannerConfig
from strom.metadata.off_loop import off_loop
from strom.metadata.store import MetadataStore
from strom.metadata.table_info import TableInfo
from strom.remote.s3_credentials import remote_storage, token_provider
from strom.rpc.admission import AdmissionLimits, ConnectionAdmission
from strom.rpc.api_keys import ApiKey
from strom.rpc.peers import ServerNode
from strom.rpc.server import Handler, RpcServer
from strom.security.authenticator import PlainAuthenticator
from strom.security.internal import COORDINATOR_NAME, InternalAuthenticator, ListenerAuthenticator
from strom.security.server_security import ServerSecurity
from strom.server.catalog_access import guard_with_catalog
from strom.server.listeners import RpcServerFactory, ServerListeners
from strom.server.metadata_stores import open_store
from strom.server.metrics import CoordinatorParts, StromCollector, serve_metrics
from strom.server.resources import advertised_memory_bytes
from strom.tablet.data_dirs import configured_paths
from strom.tablet.kv_snapshot_scheduler import KvSnapshotScheduler
from strom.tablet.remote_log_manager import handle_reader
from strom.tablet.replica import ReplicaManager
from strom.tablet.retained_offsets import LakeOffset
from strom.tablet.role import TabletRole
from strom.tablet.scan_service import ScanKvService
from strom.tablet.tablet_service import TabletService

log = logging.getLogger(__name__)

WAREHOUSE_OPTIONS = {
    "delta": DATALAKE_DELTA_WAREHOUSE, "iceberg": DATALAKE_ICEBERG_WAREHOUSE, "lance": DATALAKE_LANCE_WAREHOUSE,
    "paimon": DATALAKE_PAIMON_WAREHOUSE,
}
"""The warehouse option of each lake format: defaulted to ``<data.dir>/lake`` at start."""


def scanner_config(config: Configuration) -> ScannerConfig:
    """The ``kv.scanner.*`` limits of ScanKv sessions."""
    return ScannerConfig(
        ttl_ms=config.get_ms(KV_SCANNER_TTL),
        expiration_interval_ms=config.get_ms(KV_SCANNER_EXPIRATION_INTERVAL),
        scanners_per_bucket_max=config.get(KV_SCANNER_MAX_PER_BUCKET),
        scanners_per_server_max=config.get(KV_SCANNER_MAX_PER_SERVER),
        batch_size_bytes_max=min(config.get(KV_SCANNER_MAX_BATCH_SIZE), 0x7FFFFFFF),
    )


def rpc_server_factory(
    config: Configuration,
    on_connection_closed: Callable[[int], None] | None = None,
    servers: InternalAuthenticator | None = None,
    internal_listener: str | None = None,
) -> RpcServerFactory:
    """Builds the RPC servers of a process (one per listener) with the configured limits. Each takes its
    listener's client authenticator (None: PLAINTEXT) and name and, with ``servers``, the logins of the
    cluster's servers: on the ``internal_listener`` only, unless ``security.internal.login-on-all-listeners``
    (or no listener is named internal)."""
    everywhere = internal_listener is None or config.get(SECURITY_INTERNAL_LOGIN_ON_ALL_LISTENERS)

    admission = ConnectionAdmission(admission_limits(config))  # one for every listener of the process

    def build(served: Mapping[ApiKey, Handler], clients: PlainAuthenticator | None, listener: str) -> RpcServer:
        server_logins = servers if everywhere or listener == internal_listener else None
        logins = ListenerAuthenticator(clients, server_logins) if clients is not None or server_logins is not None else None
        return RpcServer(
            served,
            authenticator=logins,
            authentication_required=clients is not None,
            frame_size_bytes_max=config.get(MAX_REQUEST_SIZE),
            in_flight_count_max=config.get(SERVER_MAX_IN_FLIGHT_PER_CONNECTION),
            idle_timeout_ms=config.get_ms(CONNECTION_MAX_IDLE_TIME),
            buffered_request_bytes_max=config.get(SERVER_MAX_BUFFERED_REQUEST_BYTES),
            on_connection_closed=on_connection_closed,
            listener=listener,
            admission=admission,
            unauthenticated_idle_timeout_ms=config.get_ms(SECURITY_UNAUTHENTICATED_MAX_IDLE_TIME),
        )

    return build


def admission_limits(config: Configuration) -> AdmissionLimits:
    """The limits before login (``max.connections``, ``max.connections.per.ip`` and its overrides, the
    unauthenticated memory cap, failed logins per address)."""
    overrides: dict[str, int] = {}
    for entry in filter(None, (e.strip() for e in (config.get(MAX_CONNECTIONS_PER_IP_OVERRIDES) or "").split(","))):
        address, sep, count = entry.rpartition(":")
        if not sep or not address or not count.isdigit():
            raise InvalidConfigError(f"{MAX_CONNECTIONS_PER_IP_OVERRIDES.key}: entries are ADDRESS:COUNT, got {entry!r}")
        overrides[address] = int(count)
    return AdmissionLimits(
        connections_max=config.get(MAX_CONNECTIONS),
        connections_per_address_max=config.get(MAX_CONNECTIONS_PER_IP),
        per_address_overrides=overrides,
        unauthenticated_bytes_max=config.get(SECURITY_UNAUTHENTICATED_MAX_BUFFERED_BYTES),
        failed_logins_max=config.get(SECURITY_FAILED_AUTHENTICATION_MAX_PER_ADDRESS),
        block_s=config.get_ms(SECURITY_FAILED_AUTHENTICATION_BLOCK_TIME) / 1000,
    )


def lake_warehouse(configured: str | None, paths: ServerPaths) -> str:
    """Tables record where their lake lives, and the tiering service may run elsewhere: a local warehouse is
    given as an absolute path."""
    if configured is None:
        return str(paths.default_lake.resolve())
    if "://" in configured:
        return configured
    return str(Path(configured).expanduser().resolve())


def remote_root(configured: str | None, paths: ServerPaths) -> str:
    """Where KV snapshots (and remote files) go. Clients and Spark tasks read snapshot files by the paths the
    server records, from their own working directories, so a local root is made absolute."""
    if configured is not None and "://" in configured:
        return configured
    return str(Path(configured).expanduser().resolve() if configured else paths.default_remote.resolve())


@dataclass(frozen=True, slots=True)
class ServerPaths:
    """The layout of ``data.dir``."""

    data_dir: Path

    @property
    def metadata_db(self) -> Path:
        return self.data_dir / "metadata.sqlite"

    @property
    def tablets(self) -> Path:
        """The buckets' directory unless ``data.dirs`` names others (strom.tablet.data_dirs)."""
        return self.data_dir / "tablets"

    @property
    def snapshot_staging(self) -> Path:
        return self.data_dir / "snapshot-staging"

    @property
    def default_remote(self) -> Path:
        return self.data_dir / "remote"

    @property
    def default_lake(self) -> Path:
        return self.data_dir / "lake"


class LocalTabletServer:
    """The tablet-server role as the coordinator sees it in a single process (a TabletServerGateway)."""

    def __init__(self, tablets: TabletRole) -> None:
        self._tablets = tablets

    def become_leader(self, table: TableInfo, buckets: Sequence[TableBucket]) -> None:
        self._tablets.replicas.become_leader(table, buckets)

    async def change_table(self, table: TableInfo) -> None:
        self._tablets.replicas.change_table(table)

    async def stop_replicas(self, table_id: int, partition_id: int | None, *, delete: bool) -> None:
        await self._tablets.stop_replicas(table_id, partition_id, delete=delete)

    async def high_watermarks(self, table: TableInfo, buckets: Sequence[TableBucket]) -> dict[TableBucket, int]:
        return {bucket: self._tablets.replicas.get(bucket).log.high_watermark for bucket in buckets}

    def notify_kv_snapshot_offset(self, table: TableInfo, bucket: TableBucket, min_retain_offset: int) -> None:
        self._tablets.replicas.retained.notify_kv_snapshot(bucket, min_retain_offset)

    def notify_lake_table_offsets(self, table: TableInfo, snapshot_id: int, log_end_offsets: Mapping[TableBucket, int],
                                  max_timestamps: Mapping[TableBucket, int]) -> None:
        for bucket, end in log_end_offsets.items():
            self._tablets.replicas.retained.notify_lake(bucket, LakeOffset(snapshot_id, end, max_timestamps.get(bucket)))


class StromServer:
    """Both roles in one process. ``start()`` then ``serve_forever()``; ``stop()`` shuts down cleanly."""

    def __init__(self, data_dir: Path, host: str, port: int, config: Configuration, clock: Clock = SYSTEM_CLOCK) -> None:
        self.paths = ServerPaths(data_dir)
        self.host = host
        self.port = port
        self.config = config
        self.clock = clock
        self.dynamic: DynamicConfig | None = None
        self.remote_root = remote_root(config.get(REMOTE_DATA_DIR), self.paths)
        self.store: MetadataStore | None = None
        self.replicas: ReplicaManager | None = None
        self.role: CoordinatorRole | None = None
        self.tablets: TabletRole | None = None
        self.coordinator: CoordinatorService | None = None
        self.lake: LakeTieringService | None = None
        self.tablet: TabletService | None = None
        self.snapshots: KvSnapshotService | None = None
        self.scans: ScanKvService | None = None
        self.tablet_server: LocalTabletServer | None = None
        self.snapshot_scheduler: KvSnapshotScheduler | None = None
        self.rpc: RpcServer | None = None
        self.security: ServerSecurity | None = None
        self.listeners: ServerListeners | None = None
        self.metrics_port: int | None = None
        self._metrics_server: WSGIServer | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        warehouse = WAREHOUSE_OPTIONS[self.config.get(DATALAKE_FORMAT)]
        self.config = self.config.with_values({warehouse.key: self._lake_warehouse(self.config.get(warehouse))})
        config = self.config
        self.paths.data_dir.mkdir(parents=True, exist_ok=True)
        configured_paths(config, self.paths.data_dir)  # a bad data.dirs stops the start before anything opens
        zookeeper_address = zookeeper_location(config)
        if zookeeper_address:
            from strom.zk.login import ZooKeeperLogin  # the ZooKeeper room loads only for a ZooKeeper store

            self.store = store = await off_loop(
                open_store, "zookeeper", zookeeper_address, ZooKeeperLogin.from_config(config)
            )
        else:
            self.store = store = await off_loop(open_store, "sqlite", str(self.paths.metadata_db))
        # a bad security setting stops the start here
        self.security = await off_loop(ServerSecurity.from_config, config, store)
        self.dynamic = dynamic = DynamicConfig(config)
        # the cluster configs set at run time before, over the initial ones
        dynamic.set_dynamic(await off_loop(stored_dynamic, store))
        self.config = config = dynamic.current
        self.security.apply(config)  # users added or removed at run time before this start
        dynamic.on_change(self.security.apply)
        remote = remote_storage(self.remote_root, config)
        # built on a store thread: it loads leases, snapshot records and tiering states from the store
        self.role = role = await off_loop(CoordinatorRole, store, config, self.clock, remote, dynamic)
        self.tablets = tablets = TabletRole(
            self.paths.data_dir, config, self.clock, remote, scanner_config(config), role.snapshot_store.latest,
            store.next_id,
        )
        self.replicas, self.tablet, self.scans = tablets.replicas, tablets.tablet, tablets.scans
        tablets.tablet.serve_file_system_tokens(token_provider(self.remote_root, config))
        self.tablet_server = LocalTabletServer(tablets)
        self.listeners = listeners = ServerListeners(self.security, self.host, self.port)
        listeners.bind()
        self.port = listeners.main_port
        endpoints = listeners.advertised(config.get(ADVERTISED_LISTENERS), config.get(ADVERTISED_HOST))
        # its own memory is the cluster's: the KV leader replica capacity (kv.leader-replica.memory-reserved)
        node = ServerNode(config.get(TABLET_SERVER_ID), endpoints[0].host, endpoints[0].port, endpoints,
                          memory_bytes=advertised_memory_bytes(config))
        self.coordinator = coordinator = await role.start(self.tablet_server, SingleNodePlacement(node))
        self.lake, self.snapshots = role.lake, role.snapshots
        assert self.snapshots is not None
        self.snapshot_scheduler = tablets.start_snapshots(self.snapshots, self.paths.snapshot_staging)
        dynamic.on_change(role.apply)
        dynamic.on_change(tablets.apply)
        remote_logs = role.remote_logs
        assert remote_logs is not None

        async def commit_remote_log_manifest(request: Any) -> Any:
            return await remote_logs.commit_remote_log_manifest(request, None)

        tablets.start_remote_logs(
            read_handle=handle_reader(store), commit=commit_remote_log_manifest,
            partition_name=lambda pid: p.name if (p := coordinator.partition_by_id(pid)) else None,
            oldest_snapshot=self.snapshots.oldest_snapshot,
        )
        tablets.serve_historical(lambda pid: p.name if (p := coordinator.partition_by_id(pid)) else None)
        handlers = guard_with_catalog(self.security, self._handlers(), coordinator, role)

        rpc_server = rpc_server_factory(config, tablets.scans.on_connection_closed,
                                         self.security.internal_authenticator(COORDINATOR_NAME),
                                         self.security.internal_listener or None)
        await listeners.start(handlers, rpc_server)
        self.rpc = listeners.main
        metrics_port = config.get(METRICS_PORT) if reporter_enabled(config, "prometheus") else 0
        if metrics_port:
            parts = CoordinatorParts(role.leases, role.snapshot_store, role.lake_tiering, coordinator.kv_leader_capacity)
            collector = StromCollector(
                asyncio.get_running_loop(), lambda: parts, self.replicas, lambda: self.rpc, self._table_name,
                self.clock, lambda: tablets.remote_logs,
            )
            self._metrics_server, self.metrics_port = serve_metrics(self.host, metrics_port, collector)
        log.info("strom serving on %s:%d (data in %s, remote storage %s, %s)", self.host, self.port,
                 self.paths.data_dir, self.remote_root, rocksdb.describe_binding())

    def _lake_warehouse(self, configured: str | None) -> str:
        return lake_warehouse(configured, self.paths)

    def _table_name(self, table_id: int) -> str:
        assert self.coordinator is not None
        table = self.coordinator.table_info_by_id(table_id)
        return str(table.path) if table else str(table_id)

    def _handlers(self) -> dict[ApiKey, Handler]:
        assert self.role is not None and self.tablets is not None and self.security is not None
        acls = AclService(self.security.authorizer)
        return {**self.role.handlers(acls), **self.tablets.handlers()}

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    async def stop(self) -> None:
        self._stopped.set()
        if self.listeners is not None:
            await self.listeners.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        if self.tablets is not None:
            await self.tablets.stop()
        if self.role is not None:
            await self.role.stop()
        if self.store is not None:
            await off_loop(self.store.close)
        log.info("strom stopped")
