"""The two processes of a strom cluster: :class:`CoordinatorNode` (``strom coordinator``) and
:class:`TabletServerNode` (``strom tablet-server``), sharing their metadata and membership through ZooKeeper
or, with every process on one machine, through a shared SQLite file (:mod:`strom.server.cluster_membership`).

The coordinator owns the catalog, bucket placement, KV snapshot records, leases and retention, the lake
tiering manager and ACLs; it publishes its address (the active coordinator's entry) and tells tablet servers
what changed. A tablet server registers itself, hosts the buckets assigned to it, and serves their logs and
KV state; it reads table definitions and assignments from the store and commits KV snapshots through the
coordinator. Both answer metadata requests, so a client may bootstrap from either. ``strom server``
(:class:`strom.server.node.StromServer`) stays the one-process default; ``strom server --workers N`` runs
this pair of roles as N + 1 processes (:mod:`strom.server.workers`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIServer

from strom.clock import SYSTEM_CLOCK, Clock
from strom.config import (
    ADVERTISED_HOST,
    ADVERTISED_LISTENERS,
    BIND_LISTENERS,
    DATALAKE_FORMAT,
    INTERNAL_LISTENER_NAME,
    LOG_REPLICA_FETCH_MAX_BYTES_FOR_BUCKET,
    LOG_REPLICA_FETCH_WAIT_MAX_TIME,
    LOG_REPLICA_MAX_LAG_TIME,
    LOG_REPLICA_MAX_SILENCE_TIME,
    METRICS_PORT,
    REMOTE_DATA_DIR,
    SECURITY_INTERNAL_ALLOW_UNAUTHENTICATED,
    SECURITY_INTERNAL_SECRET,
    TABLET_SERVER_CONTROLLED_SHUTDOWN_MAX_RETRIES,
    TABLET_SERVER_CONTROLLED_SHUTDOWN_RETRY_INTERVAL,
    TABLET_SERVER_ID,
    TABLET_SERVER_RACK,
    Configuration,
    DynamicConfig,
    reporter_enabled,
)
from strom.coordinator.acl_service import AclService
from strom.coordinator.catalog import TABLET_SERVER_METADATA_MAX_AGE_S, CatalogReader
from strom.coordinator.cluster_configs import stored_dynamic
from strom.coordinator.cluster_placement import ClusterPlacement
from strom.coordinator.isr_changes import IsrChanges
from strom.coordinator.leader_election import LeaderElector
from strom.coordinator.placement import placed_tables
from strom.coordinator.remote_tablets import RemoteTabletServers
from strom.coordinator.replica_mover import ReplicaMover
from strom.coordinator.role import CoordinatorRole
from strom.coordinator.service import CoordinatorService
from strom.errors import (
    InvalidConfigError,
    InvalidCoordinatorError,
    NotCoordinatorLeaderError,
    StorageError,
    StromError,
)
from strom.ids import TableBucket
from strom.kv import rocksdb
from strom.membership.contract import CoordinatorDirectory, RegisteredServer, ServerRegistry
from strom.metadata.off_loop import off_loop
from strom.metadata.store import MetadataStore
from strom.metadata.table_info import TableInfo
from strom.remote.s3_credentials import remote_storage, token_provider
from strom.rpc.api_keys import ApiKey
from strom.rpc.endpoints import Endpoint, internal_listener
from strom.rpc.messages import pb
from strom.rpc.peers import PeerConnections, ServerNode
from strom.rpc.server import Handler
from strom.security.internal import COORDINATOR_NAME, tablet_server_name
from strom.security.server_security import ServerSecurity, parse_listeners
from strom.server.catalog_access import guard_with_catalog
from strom.server.cluster_membership import ClusterMembership, cluster_membership
from strom.server.listeners import ServerListeners
from strom.server.metrics import CoordinatorParts, StromCollector, serve_metrics
from strom.server.node import (
    WAREHOUSE_OPTIONS,
    ServerPaths,
    lake_warehouse,
    remote_root,
    rpc_server_factory,
    scanner_config,
)
from strom.server.resources import advertised_memory_bytes
from strom.tablet.cluster_tablet import (
    ClusterTables,
    CoordinatorIsrChanges,
    RemoteSnapshotCommitter,
    TabletControlService,
    remove_dropped_table_data,
    remove_moved_bucket_data,
)
from strom.tablet.data_dirs import configured_paths
from strom.tablet.remote_log_manager import RemoteLogManager, handle_reader
from strom.tablet.replica import ReplicaManager
from strom.tablet.replication import ReplicationManager
from strom.tablet.role import TabletRole

log = logging.getLogger(__name__)

COORDINATOR_NODE_ID = 0
REGISTRATION_SLACK_S = 10.0
"""How much longer than the ZooKeeper session timeout a restarted tablet server waits for its id's previous
registration to expire."""
REGISTRATION_RETRY_S = 0.25
COORDINATOR_WAIT_S = 30.0
"""How long a starting tablet server waits for a coordinator to publish its address."""


T = TypeVar("T")
ACL_REFRESH_S = 1.0
"""How often a cluster's server rereads the ACLs from ZooKeeper (the active coordinator changes them)."""
CONFIG_REFRESH_S = 1.0
"""How often a cluster's server rereads the cluster configs (AlterClusterConfigs goes to the active
coordinator)."""


def _reread_every(interval_s: float, read: Callable[[], T], apply: Callable[[T], object], what: str) -> asyncio.Task[None]:
    """A task that every ``interval_s`` reads ``what`` from the metadata store (on a thread) and applies it
    on the event loop; a failed round is logged and the next one tries again."""

    async def reread() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                apply(await off_loop(read))
            except Exception as exc:
                log.warning("could not reread %s: %s", what, exc)

    return asyncio.create_task(reread())


def _require_internal_secret(config: Configuration) -> None:
    """Secure by default: the servers of a cluster authenticate each other, or the operator says in so many
    words that the network is trusted."""
    if not config.get(SECURITY_INTERNAL_SECRET) and not config.get(SECURITY_INTERNAL_ALLOW_UNAUTHENTICATED):
        raise InvalidConfigError(
            f"a cluster's servers authenticate each other: set {SECURITY_INTERNAL_SECRET.key} to the same secret "
            f"on every server (`strom cluster start` generates one), or, on an isolated network only, "
            f"{SECURITY_INTERNAL_ALLOW_UNAUTHENTICATED.key}=true (then any client may send control requests)"
        )


class _ClusterProcess:
    """What both processes share: data directory, ZooKeeper, security, the RPC listener, shutdown."""

    def __init__(self, data_dir: Path, host: str, port: int, config: Configuration, clock: Clock) -> None:
        self.paths = ServerPaths(data_dir)
        self.host = host
        self.port = port
        self.clock = clock
        warehouse = WAREHOUSE_OPTIONS[config.get(DATALAKE_FORMAT)]
        self.config = config.with_values({warehouse.key: lake_warehouse(config.get(warehouse), self.paths)})
        self.dynamic = DynamicConfig(self.config)
        """The configuration with the cluster configs set at run time; reread from the store every second."""
        self.remote_root = remote_root(config.get(REMOTE_DATA_DIR), self.paths)
        self.store: MetadataStore | None = None
        self.membership: ClusterMembership | None = None
        self.security: ServerSecurity | None = None
        self.listeners: ServerListeners | None = None
        self.endpoints: tuple[Endpoint, ...] = ()
        """Every listener's advertised endpoint, once bound."""
        self.peers = PeerConnections()
        self._stopped = asyncio.Event()
        self._acl_refresh: asyncio.Task[None] | None = None
        self._config_refresh: asyncio.Task[None] | None = None
        self._metrics_server: WSGIServer | None = None
        self.metrics_port: int | None = None
        """Where the Prometheus endpoint listens (``metrics.reporter.prometheus.port``; None: off)."""

    @property
    def server_name(self) -> str:
        """Who this process is to the others (its principal ``Server:<name>``)."""
        raise NotImplementedError

    def _open(self) -> tuple[MetadataStore, str]:
        """Check the settings, open the metadata store and bind every listener (so a taken port stops the
        start before this process registers anywhere)."""
        _require_internal_secret(self.config)
        internal_listener(parse_listeners(self.config.get(BIND_LISTENERS) or ""), self.config.get(INTERNAL_LISTENER_NAME))
        self.paths.data_dir.mkdir(parents=True, exist_ok=True)
        self.membership = membership = cluster_membership(self.config)
        self.store = store = membership.open_store()
        self.dynamic.set_dynamic(stored_dynamic(store))
        self.config = self.dynamic.current
        self.security = security = ServerSecurity.from_config(self.config, store, cluster=True)
        self.dynamic.on_change(security.apply)  # SASL users added or removed at run time
        self.peers = PeerConnections(credentials=security.internal_credentials(self.server_name), tls=security.peer_tls)
        self.listeners = listeners = ServerListeners(security, self.host, self.port)
        listeners.bind()
        self.port = listeners.main_port
        self.endpoints = listeners.advertised(self.config.get(ADVERTISED_LISTENERS), self.config.get(ADVERTISED_HOST))
        return store, membership.description

    @property
    def internal_endpoint(self) -> Endpoint:
        """Where the other servers reach this one."""
        assert self.security is not None and self.endpoints
        return next(e for e in self.endpoints if e.name == self.security.internal_listener)

    async def _serve(self, handlers: dict[ApiKey, Handler], catalog: CatalogReader,
                     on_connection_closed: Callable[[int], None] | None = None) -> None:
        assert self.security is not None and self.listeners is not None
        make_server = rpc_server_factory(self.config, on_connection_closed,
                                           self.security.internal_authenticator(self.server_name),
                                           self.security.internal_listener or None)
        await self.listeners.start(self._guard(handlers, catalog), make_server)
        self._start_acl_refresh()
        self._start_config_refresh()

    def _guard(
        self, handlers: dict[ApiKey, Handler], catalog: CatalogReader, role: CoordinatorRole | None = None
    ) -> dict[ApiKey, Handler]:
        """``handlers`` behind the ACL checks when authorization is on (``role``: the active coordinator's,
        whose leases and producer offsets name the tables their requests touch)."""
        assert self.security is not None
        return guard_with_catalog(self.security, handlers, catalog, role)

    @property
    def node(self) -> ServerNode:
        raise NotImplementedError

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    def _start_acl_refresh(self) -> None:
        """Keep this server's copy of the ACLs current (ACL changes go through the active coordinator);
        decisions use the last copy while a reread fails."""
        authorizer = self.security.authorizer if self.security is not None else None
        if authorizer is not None:
            self._acl_refresh = _reread_every(ACL_REFRESH_S, authorizer.store.list_acls, authorizer.reload, "the ACLs")

    def _start_config_refresh(self) -> None:
        """Apply the cluster configs the active coordinator changed (AlterClusterConfigs) within a second."""
        store = self.store
        assert store is not None
        self._config_refresh = _reread_every(
            CONFIG_REFRESH_S, lambda: stored_dynamic(store), self.dynamic.set_dynamic, "the cluster configs"
        )

    def _serve_metrics(self, coordinator: Callable[[], CoordinatorParts | None], replicas: ReplicaManager | None,
                       table_name: Callable[[int], str],
                       remote_logs: Callable[[], RemoteLogManager | None] = lambda: None) -> None:
        """The Prometheus endpoint of this process, when configured: a tablet server's buckets, or the
        active coordinator's bookkeeping (a standby's holds only its RPC counters)."""
        port = self.config.get(METRICS_PORT) if reporter_enabled(self.config, "prometheus") else 0
        if not port:
            return
        listeners = self.listeners
        collector = StromCollector(asyncio.get_running_loop(), coordinator, replicas,
                                   lambda: listeners.main if listeners is not None else None, table_name, self.clock,
                                   remote_logs)
        self._metrics_server, self.metrics_port = serve_metrics(self.host, port, collector)

    def request_stop(self) -> None:
        self._stopped.set()

    async def _close_common(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        if self._acl_refresh is not None:
            self._acl_refresh.cancel()
        if self._config_refresh is not None:
            self._config_refresh.cancel()
        if self.listeners is not None:
            await self.listeners.stop()
        await self.peers.close()
        if self.store is not None:
            await off_loop(self.store.close)


class CoordinatorNode(_ClusterProcess):
    """``strom coordinator``: the catalog and the cluster's bookkeeping, no buckets.

    Several may run: each starts as a standby that answers metadata requests (naming the active one) and
    refuses the rest with NotCoordinatorLeader (65), and campaigns in ZooKeeper; the winner loads the
    cluster's state from the store (snapshot records, leases, lake tiering states) and serves everything. A
    coordinator deposed while active (its ZooKeeper session expired) stops: run it under a supervisor to
    have it rejoin as a standby.
    """

    def __init__(self, data_dir: Path, host: str, port: int, config: Configuration, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(data_dir, host, port, config, clock)
        self.registry: ServerRegistry | None = None
        self.address: CoordinatorDirectory | None = None
        self.role: CoordinatorRole | None = None
        self.coordinator: CoordinatorService | None = None
        self.tablets: RemoteTabletServers | None = None
        self.elector: LeaderElector | None = None
        self.epoch: int | None = None
        """The coordinator epoch while active; None as a standby."""
        self.exit_code = 0
        self._stop_campaign = threading.Event()
        self._campaign_task: asyncio.Task[None] | None = None

    @property
    def node(self) -> ServerNode:
        internal = self.internal_endpoint
        return ServerNode(COORDINATOR_NODE_ID, internal.host, internal.port, self.endpoints)

    @property
    def server_name(self) -> str:
        return COORDINATOR_NAME

    def _active_node(self) -> ServerNode:
        """The active coordinator as metadata names it (this one when active)."""
        assert self.address is not None
        current = self.address.current()
        return self.node if current is None else current

    async def start(self) -> None:
        """Serve as a standby and campaign in the background; :attr:`epoch` is set once active."""
        store, backend = await off_loop(self._open)  # opens the store: blocks
        assert self.security is not None and self.membership is not None
        membership, listener = self.membership, self.security.internal_listener
        self.registry = registry = await off_loop(membership.registry, listener)
        loop = asyncio.get_running_loop()

        def on_deposed() -> None:  # on a backend thread
            loop.call_soon_threadsafe(self._deposed)

        self.address = await off_loop(membership.coordinator_directory, listener, on_deposed)
        states = await off_loop(membership.bucket_states, registry)  # the SQLite backend opens its file
        placement = ClusterPlacement(store, registry, self._active_node, states)
        standby_catalog = CatalogReader(store, placement)
        handlers: dict[ApiKey, Handler] = dict.fromkeys(COORDINATOR_ONLY_KEYS, _not_the_active_coordinator)
        handlers.update(standby_catalog.handlers())
        await self._serve(handlers, standby_catalog)

        def active_parts() -> CoordinatorParts | None:
            role = self.role
            if role is None:
                return None
            capacity = role.coordinator.kv_leader_capacity if role.coordinator is not None else None
            return CoordinatorParts(role.leases, role.snapshot_store, role.lake_tiering, capacity)

        self._serve_metrics(active_parts, None, _table_name(standby_catalog.table_info_by_id))
        self._campaign_task = asyncio.create_task(self._campaign(store, placement))
        log.info("strom coordinator on %s:%d (%s): standby until elected", self.host, self.port, backend)

    async def _campaign(self, store: MetadataStore, placement: ClusterPlacement) -> None:
        assert self.address is not None
        me = RegisteredServer(COORDINATOR_NODE_ID, self.endpoints)
        epoch = await asyncio.to_thread(
            self.address.campaign, me, lambda: store.next_id(COORDINATOR_EPOCH_SEQUENCE), self._stop_campaign
        )
        if epoch is None:
            return
        try:
            await self._become_active(store, placement, epoch)
        except Exception:
            log.exception("this coordinator won the election but could not start its services; stopping")
            self.exit_code = 1
            self.request_stop()
            return
        log.info("strom coordinator on %s:%d is active (coordinator epoch %d)", self.host, self.port, epoch)

    async def _become_active(self, store: MetadataStore, placement: ClusterPlacement, epoch: int) -> None:
        """Load the cluster's state from the store and serve every coordinator request."""
        placement.states.remember_leadership()  # the only writer of leaders from now on: GetMetadata reads no ZooKeeper
        # built on a store thread: it loads leases, snapshot records and tiering states from the store
        self.role = role = await off_loop(
            CoordinatorRole, store, self.config, self.clock, remote_storage(self.remote_root, self.config), self.dynamic
        )
        self.tablets = RemoteTabletServers(placement, self.peers, epoch)
        peers = self.peers

        def leader_epoch_of(bucket: TableBucket) -> int | None:
            known = placement.states.remembered([bucket])  # no ZooKeeper read on the event loop
            if known is not None:
                return known[bucket].leader_epoch
            found = placement.states.get(bucket)  # a bucket this coordinator has not seen since it became active
            return None if found is None else found[0].leader_epoch

        async def notify_followers(bucket: TableBucket, request: Any) -> None:
            found = placement.states.get(bucket)
            if found is None:
                return
            state = found[0]
            nodes = {node.node_id: node for node in placement.tablet_servers()}
            followers = [nodes[r] for r in state.replicas if r != state.leader and r in nodes]
            await asyncio.gather(*(peers.request(n.host, n.port, ApiKey.NOTIFY_REMOTE_LOG_OFFSETS, request,
                                                 server_name=tablet_server_name(n.node_id))
                                   for n in followers), return_exceptions=True)

        mover = ReplicaMover(placement.states, self.tablets.notify_bucket)
        self.coordinator = await role.start(self.tablets, placement, leader_epoch_of=leader_epoch_of,
                                            notify_followers=notify_followers, mover=mover)
        self.dynamic.on_change(role.apply)
        assert self.registry is not None
        self.elector = LeaderElector(store, placement.states, self.registry, self.tablets, self.coordinator.table_info_by_id)
        self.elector.start()
        assert self.security is not None and self.listeners is not None and role.snapshots is not None
        snapshots = role.snapshots

        async def commit_kv_snapshot(request: Any, context: object) -> Any:
            if request.coordinator_epoch != epoch:  # sent to a coordinator that is no longer (or not yet) active
                raise InvalidCoordinatorError(
                    f"CommitKvSnapshot for coordinator epoch {request.coordinator_epoch}; the active one is {epoch}"
                )
            return await snapshots.commit_kv_snapshot(request, leader_epoch_of)

        elector = self.elector

        async def controlled_shutdown(request: Any, context: object) -> Any:
            remaining = await elector.shut_down(request.tablet_server_id)
            log.info("controlled shutdown of tablet server %d: %d buckets it still leads",
                     request.tablet_server_id, len(remaining))
            response = pb.ControlledShutdownResponse()
            for bucket in remaining:
                entry = response.remaining_leader_buckets.add(table_id=bucket.table_id, bucket_id=bucket.bucket)
                if bucket.partition_id is not None:
                    entry.partition_id = bucket.partition_id
            return response

        handlers = role.handlers(AclService(self.security.authorizer))
        handlers[ApiKey.COMMIT_KV_SNAPSHOT] = commit_kv_snapshot
        handlers[ApiKey.CONTROLLED_SHUTDOWN] = controlled_shutdown
        registry = self.registry
        isr_changes = IsrChanges(placement.states, lambda: set(registry.live()), epoch)
        handlers[ApiKey.ADJUST_ISR] = isr_changes.adjust_isr
        self.listeners.set_handlers(self._guard(handlers, self.coordinator, role))
        self.epoch = epoch

    def _deposed(self) -> None:
        if self.epoch is None:
            return
        log.error("coordinator epoch %d was deposed: stopping", self.epoch)
        self.exit_code = 1
        self.request_stop()

    async def stop(self) -> None:
        self._stopped.set()
        self._stop_campaign.set()
        if self.address is not None:
            self.address.close()  # first: tablet servers stop sending it commits, a standby may take over
        if self._campaign_task is not None:
            await asyncio.gather(self._campaign_task, return_exceptions=True)
        if self.elector is not None:
            await self.elector.stop()
        if self.role is not None:
            await self.role.stop()
        if self.tablets is not None:
            await self.tablets.close()
        await self._close_common()
        if self.registry is not None:
            self.registry.close()
        log.info("strom coordinator stopped")


def _not_the_active_coordinator(_request: Any, _context: object) -> Any:
    raise NotCoordinatorLeaderError("This coordinator is a standby; send the request to the active coordinator.")


COORDINATOR_EPOCH_SEQUENCE = "coordinator_epoch"
COORDINATOR_ONLY_KEYS = (
    ApiKey.CREATE_DATABASE, ApiKey.DROP_DATABASE, ApiKey.ALTER_DATABASE, ApiKey.LIST_DATABASES,
    ApiKey.DATABASE_EXISTS, ApiKey.GET_DATABASE_INFO, ApiKey.CREATE_TABLE, ApiKey.DROP_TABLE, ApiKey.ALTER_TABLE,
    ApiKey.LIST_TABLES, ApiKey.TABLE_EXISTS, ApiKey.CREATE_PARTITION, ApiKey.DROP_PARTITION,
    ApiKey.LIST_PARTITION_INFOS, ApiKey.GET_LATEST_KV_SNAPSHOTS, ApiKey.GET_KV_SNAPSHOT_METADATA,
    ApiKey.LIST_KV_SNAPSHOTS, ApiKey.ACQUIRE_KV_SNAPSHOT_LEASE, ApiKey.RELEASE_KV_SNAPSHOT_LEASE,
    ApiKey.DROP_KV_SNAPSHOT_LEASE, ApiKey.LIST_KV_SNAPSHOT_LEASES, ApiKey.COMMIT_KV_SNAPSHOT,
    ApiKey.LAKE_TIERING_HEARTBEAT, ApiKey.PREPARE_LAKE_TABLE_SNAPSHOT, ApiKey.COMMIT_LAKE_TABLE_SNAPSHOT,
    ApiKey.GET_LAKE_SNAPSHOT, ApiKey.DESCRIBE_LAKE_TIERING, ApiKey.CREATE_ACLS, ApiKey.LIST_ACLS, ApiKey.DROP_ACLS,
    ApiKey.CONTROLLED_SHUTDOWN, ApiKey.REGISTER_PRODUCER_OFFSETS, ApiKey.GET_PRODUCER_OFFSETS,
    ApiKey.DELETE_PRODUCER_OFFSETS, ApiKey.GET_CLUSTER_HEALTH, ApiKey.DESCRIBE_CLUSTER_CONFIGS,
    ApiKey.ALTER_CLUSTER_CONFIGS, ApiKey.ADD_SERVER_TAG, ApiKey.REMOVE_SERVER_TAG, ApiKey.REBALANCE,
    ApiKey.LIST_REBALANCE_PROGRESS, ApiKey.CANCEL_REBALANCE,
)
"""What a standby coordinator refuses (NotCoordinatorLeader); metadata requests it answers itself."""


class TabletServerNode(_ClusterProcess):
    """``strom tablet-server``: hosts the buckets the coordinator assigned to it."""

    def __init__(self, data_dir: Path, host: str, port: int, config: Configuration, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(data_dir, host, port, config, clock)
        self.server_id = config.get(TABLET_SERVER_ID)
        self.registry: ServerRegistry | None = None
        self.address: CoordinatorDirectory | None = None
        self.tablets: TabletRole | None = None
        self.replicas: ReplicaManager | None = None
        self.replication: ReplicationManager | None = None
        self.catalog: CatalogReader | None = None
        self._last_coordinator: ServerNode | None = None

    @property
    def node(self) -> ServerNode:
        internal = self.internal_endpoint
        return ServerNode(self.server_id, internal.host, internal.port, self.endpoints)

    @property
    def server_name(self) -> str:
        return tablet_server_name(self.server_id)

    def _coordinator_node(self) -> ServerNode:
        """The active coordinator; while there is none (it restarts), the last one known."""
        assert self.address is not None
        current = self.address.current()
        if current is not None:
            self._last_coordinator = current
        if self._last_coordinator is None:
            raise StromError("no coordinator is active")
        return self._last_coordinator

    def _coordinator_epoch(self) -> int:
        assert self.address is not None
        epoch = self.address.current_epoch()
        return -1 if epoch is None else epoch

    async def start(self) -> None:
        configured_paths(self.config, self.paths.data_dir)  # a bad data.dirs stops the start before anything opens
        store, backend = await off_loop(self._open)  # opens the store: blocks
        config = self.config  # with the cluster configs changed at run time
        assert self.security is not None and self.membership is not None
        membership, listener = self.membership, self.security.internal_listener
        self.registry = await off_loop(membership.registry, listener)
        self.address = await off_loop(membership.coordinator_directory, listener)
        coordinator = await asyncio.to_thread(self.address.wait, COORDINATOR_WAIT_S)
        if coordinator is None:
            raise InvalidConfigError(f"no coordinator published its address in {backend} within "
                                     f"{COORDINATOR_WAIT_S:.0f} s: start `strom coordinator` first")
        remote = remote_storage(self.remote_root, config)
        committer = RemoteSnapshotCommitter(store, self.peers, self._coordinator_node, self._coordinator_epoch)
        states = await off_loop(membership.bucket_states, self.registry)  # the SQLite backend opens its file
        placement = ClusterPlacement(store, self.registry, self._coordinator_node, states)
        # the catalog answers metadata through a cache the coordinator's notices keep current; it never
        # changes anything here
        self.catalog = CatalogReader(store, placement, cache_max_age_s=TABLET_SERVER_METADATA_MAX_AGE_S)
        tables = ClusterTables(store, states, self.server_id, self.catalog.table_info_by_id)
        self.tablets = tablets = TabletRole(
            self.paths.data_dir, config, self.clock, remote, scanner_config(config), committer.latest_snapshot_now,
            store.next_id, resolve_bucket=tables.resolve,
        )
        self.replicas = tablets.replicas
        tablets.tablet.serve_file_system_tokens(token_provider(self.remote_root, config))
        self.replication = replication = ReplicationManager(
            self.server_id, self.replicas, states, self.registry, self.peers, self.catalog.table_info_by_id,
            config.get_ms(LOG_REPLICA_MAX_LAG_TIME),
            config.get_ms(LOG_REPLICA_MAX_SILENCE_TIME),
            config.get(LOG_REPLICA_FETCH_MAX_BYTES_FOR_BUCKET),
            config.get_ms(LOG_REPLICA_FETCH_WAIT_MAX_TIME),
            CoordinatorIsrChanges(self.server_id, self.peers, self._coordinator_node, self._coordinator_epoch),
        )
        tablets.tablet.serve_followers(replication.on_follower_fetch, replication.in_sync_count)
        placed = placed_tables(store, self.catalog.table_info_by_id)
        removed = remove_dropped_table_data(tablets.directories, {table.table_id for table, _ in placed})
        if removed:
            log.info("removed the data of %d tables dropped while this server was down", len(removed))
        moved = remove_moved_bucket_data(self.replicas, tables, placed)
        if moved:
            log.info("removed %d bucket copies moved to other servers while this server was down", len(moved))
        assigned = [(table, bucket) for table, buckets in tables.assigned(placed) for bucket in buckets]
        for (_table, bucket), failure in zip(assigned, await replication.apply_all(assigned), strict=True):
            if isinstance(failure, StorageError):  # led here, on a data directory that is offline: the others serve
                log.error("%s: %s", bucket, failure)
            elif failure is not None:
                raise failure
        replication.start()
        control = TabletControlService(
            self.replicas, self.catalog.resolve_table_by_id, tablets.stop_replicas, replication, self.catalog
        )
        tablets.start_snapshots(committer, self.paths.snapshot_staging)
        self.dynamic.on_change(tablets.apply)
        catalog = self.catalog

        async def commit_remote_log_manifest(request: Any) -> Any:
            request.coordinator_epoch = self._coordinator_epoch()
            coordinator = self._coordinator_node()
            return await self.peers.request(coordinator.host, coordinator.port, ApiKey.COMMIT_REMOTE_LOG_MANIFEST,
                                            request, server_name=COORDINATOR_NAME)

        tablets.start_remote_logs(
            read_handle=handle_reader(store), commit=commit_remote_log_manifest,
            partition_name=lambda pid: p.name if (p := catalog.partition_by_id(pid)) else None,
            oldest_snapshot=committer.oldest_snapshot, coordinator_epoch=self._coordinator_epoch,
        )
        tablets.serve_historical(lambda pid: p.name if (p := catalog.partition_by_id(pid)) else None)
        handlers = {
            **tablets.handlers(),
            **self.catalog.handlers(),
            ApiKey.NOTIFY_LEADER_AND_ISR: control.notify_leader_and_isr,
            ApiKey.NOTIFY_KV_SNAPSHOT_OFFSET: control.notify_kv_snapshot_offset,
            ApiKey.NOTIFY_LAKE_TABLE_OFFSET: control.notify_lake_table_offset,
            ApiKey.STOP_REPLICA: control.stop_replica,
            ApiKey.UPDATE_METADATA: control.update_metadata,
        }
        await self._serve(handlers, self.catalog, tablets.scans.on_connection_closed)
        self._serve_metrics(lambda: None, self.replicas, _table_name(catalog.table_info_by_id),
                            lambda: tablets.remote_logs)
        await self._register()
        log.info("strom tablet server %d serving on %s:%d (%s, %s)", self.server_id, self.host, self.port,
                 backend, rocksdb.describe_binding())

    async def _register(self) -> None:
        """Register in ZooKeeper. After a crash the previous process's node lives until its session times
        out, so a restart waits that long for the id to free up; a live server holding it fails the start."""
        assert self.registry is not None
        assert self.membership is not None
        wait_s = self.membership.registration_expiry_s + REGISTRATION_SLACK_S
        deadline = asyncio.get_running_loop().time() + wait_s
        memory_bytes = advertised_memory_bytes(self.config)  # for the coordinator's KV leader replica capacity
        while True:
            try:
                self.registry.register(RegisteredServer(self.server_id, self.endpoints, self.config.get(TABLET_SERVER_RACK),
                                                        memory_bytes=memory_bytes))
                return
            except InvalidConfigError as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                log.info("%s; waiting for it to expire (a restart after a crash)", exc)
                await asyncio.sleep(REGISTRATION_RETRY_S)

    async def controlled_shutdown(self) -> bool:
        """Ask the active coordinator to move this server's leaderships to other in-sync replicas (Fluss's
        ControlledShutdown), retrying as configured, then take the new states at once; True when no bucket
        is left led here. A server that cannot reach a coordinator stops anyway (its buckets then move when
        its registration is gone)."""
        if self.replication is None or self.address is None:
            return True
        attempts = self.config.get(TABLET_SERVER_CONTROLLED_SHUTDOWN_MAX_RETRIES)
        pause_s = self.config.get_ms(TABLET_SERVER_CONTROLLED_SHUTDOWN_RETRY_INTERVAL) / 1000
        request = pb.ControlledShutdownRequest(tablet_server_id=self.server_id, tablet_server_epoch=-1)
        for attempt in range(attempts):
            try:
                coordinator = self._coordinator_node()
                response = await self.peers.request(coordinator.host, coordinator.port, ApiKey.CONTROLLED_SHUTDOWN, request,
                                                    server_name=COORDINATOR_NAME)
            except Exception as exc:
                log.warning("controlled shutdown attempt %d failed: %s", attempt + 1, exc)
            else:
                await self.replication.refresh_leading()  # follow at once; the coordinator's notices may lag
                remaining = len(response.remaining_leader_buckets)  # type: ignore[attr-defined]
                if remaining == 0:
                    log.info("controlled shutdown: every leadership moved off tablet server %d", self.server_id)
                    return True
                log.warning("controlled shutdown: %d buckets have no other in-sync replica to lead them", remaining)
            if attempt + 1 < attempts:
                await asyncio.sleep(pause_s)
        log.warning("controlled shutdown did not move every leadership; stopping anyway")
        return False

    async def stop(self) -> None:
        self._stopped.set()
        await self.controlled_shutdown()
        if self.registry is not None:
            self.registry.close()  # first: the cluster stops routing to this server
        if self.listeners is not None:
            await self.listeners.stop()
        if self.replication is not None:
            await self.replication.stop()
        if self.tablets is not None:
            await self.tablets.stop()
        await self._close_common()
        if self.address is not None:
            self.address.close()
        log.info("strom tablet server %d stopped", self.server_id)


def _table_name(table_info_by_id: Callable[[int], TableInfo | None]) -> Callable[[int], str]:
    """A table's name for metric labels (its id once it is gone)."""
    def name(table_id: int) -> str:
        table = table_info_by_id(table_id)
        return str(table.path) if table is not None else str(table_id)
    return name


__all__ = ["CoordinatorNode", "TabletServerNode"]
