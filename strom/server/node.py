"""A single-node strom cluster: the coordinator and tablet-server roles behind one RPC port.

Start-up order: metadata store, tablet server (replicas), coordinator (which hands the tablet server its
buckets), then the RPC listener. Shutdown reverses it: stop accepting, finish or cancel in-flight
requests, close the buckets, close the store.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from strom.clock import SYSTEM_CLOCK, Clock
from strom.config import (
    ADVERTISED_HOST,
    CONNECTION_MAX_IDLE_TIME,
    MAX_REQUEST_SIZE,
    REMOTE_DATA_DIR,
    SERVER_MAX_IN_FLIGHT_PER_CONNECTION,
    TABLET_SERVER_ID,
    Configuration,
)
from strom.metadata.store import MetadataStore, open_store
from strom.rpc.api_keys import ApiKey
from strom.rpc.server import Handler, RpcServer, bind_listener
from strom.server.coordinator import CoordinatorService, ServerNode
from strom.server.replica import ReplicaManager
from strom.server.tablet_server import TabletService

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerPaths:
    """The layout of ``data.dir``."""

    data_dir: Path

    @property
    def metadata_db(self) -> Path:
        return self.data_dir / "metadata.sqlite"

    @property
    def tablets(self) -> Path:
        return self.data_dir / "tablets"

    @property
    def default_remote(self) -> Path:
        return self.data_dir / "remote"


class StromServer:
    """Both roles in one process. ``start()`` then ``serve_forever()`` or ``stop()``."""

    def __init__(self, data_dir: Path, host: str, port: int, config: Configuration, clock: Clock = SYSTEM_CLOCK) -> None:
        self.paths = ServerPaths(data_dir)
        self.host = host
        self.port = port
        self.config = config
        self.clock = clock
        self.remote_dir = config.get(REMOTE_DATA_DIR) or str(self.paths.default_remote)
        self.store: MetadataStore | None = None
        self.replicas: ReplicaManager | None = None
        self.coordinator: CoordinatorService | None = None
        self.tablet: TabletService | None = None
        self.rpc: RpcServer | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        self.paths.data_dir.mkdir(parents=True, exist_ok=True)
        self.paths.tablets.mkdir(parents=True, exist_ok=True)
        self.store = open_store("sqlite", str(self.paths.metadata_db))
        self.replicas = ReplicaManager(self.paths.tablets, self.config)
        self.tablet = TabletService(self.replicas, self.config, self.clock)
        sock = bind_listener(self.host, self.port)
        self.port = sock.getsockname()[1]
        advertised = self.config.get(ADVERTISED_HOST) or self.host
        if advertised in ("0.0.0.0", "::", ""):
            advertised = "127.0.0.1"
        node = ServerNode(self.config.get(TABLET_SERVER_ID), advertised, self.port)
        self.coordinator = CoordinatorService(self.store, self.replicas, self.config, self.clock, node)
        self.coordinator.start()
        self.rpc = RpcServer(
            self._handlers(),
            frame_size_bytes_max=self.config.get(MAX_REQUEST_SIZE),
            in_flight_count_max=self.config.get(SERVER_MAX_IN_FLIGHT_PER_CONNECTION),
            idle_timeout_ms=self.config.get_ms(CONNECTION_MAX_IDLE_TIME),
        )
        await self.rpc.start(sock)
        log.info("strom serving on %s:%d (data in %s)", self.host, self.port, self.paths.data_dir)

    def _handlers(self) -> dict[ApiKey, Handler]:
        coordinator = self.coordinator
        tablet = self.tablet
        assert coordinator is not None and tablet is not None
        return {
            ApiKey.CREATE_DATABASE: coordinator.create_database,
            ApiKey.DROP_DATABASE: coordinator.drop_database,
            ApiKey.LIST_DATABASES: coordinator.list_databases,
            ApiKey.DATABASE_EXISTS: coordinator.database_exists,
            ApiKey.GET_DATABASE_INFO: coordinator.get_database_info,
            ApiKey.CREATE_TABLE: coordinator.create_table,
            ApiKey.DROP_TABLE: coordinator.drop_table,
            ApiKey.GET_TABLE_INFO: coordinator.get_table_info,
            ApiKey.LIST_TABLES: coordinator.list_tables,
            ApiKey.TABLE_EXISTS: coordinator.table_exists,
            ApiKey.GET_TABLE_SCHEMA: coordinator.get_table_schema,
            ApiKey.LIST_PARTITION_INFOS: coordinator.list_partition_infos,
            ApiKey.CREATE_PARTITION: coordinator.create_partition,
            ApiKey.DROP_PARTITION: coordinator.drop_partition,
            ApiKey.GET_METADATA: coordinator.metadata,
            ApiKey.INIT_WRITER: coordinator.init_writer,
            ApiKey.PRODUCE_LOG: tablet.produce_log,
            ApiKey.FETCH_LOG: tablet.fetch_log,
            ApiKey.LIST_OFFSETS: tablet.list_offsets,
            ApiKey.PUT_KV: tablet.put_kv,
            ApiKey.LOOKUP: tablet.lookup,
            ApiKey.PREFIX_LOOKUP: tablet.prefix_lookup,
            ApiKey.LIMIT_SCAN: tablet.limit_scan,
            ApiKey.GET_FILESYSTEM_SECURITY_TOKEN: tablet.get_file_system_security_token,
        }

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    async def stop(self) -> None:
        self._stopped.set()
        if self.rpc is not None:
            await self.rpc.stop()
        if self.replicas is not None:
            self.replicas.close()
        if self.store is not None:
            self.store.close()
        log.info("strom stopped")
