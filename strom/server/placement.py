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

from strom.errors import InvalidReplicationFactorError
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


class LiveServers(Protocol):
    """The tablet servers currently registered (``strom.cluster.registry.TabletServerRegistry``)."""

    def live(self) -> dict[int, Any]: ...


class BucketPlacement(Protocol):
    def coordinator(self) -> ServerNode: ...

    def tablet_servers(self) -> list[ServerNode]:
        """The live tablet servers, by id."""

    def leaders(self, table: TableInfo, partition_id: int | None = None) -> dict[int, int]:
        """Bucket id -> the id of the tablet server leading it (buckets without a leader are left out)."""

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

    def leaders(self, table: TableInfo, partition_id: int | None = None) -> dict[int, int]:
        return dict.fromkeys(range(table.bucket_count), self._node.node_id)

    def assign(self, table: TableInfo, partition_id: int | None = None) -> dict[int, int]:
        return self.leaders(table, partition_id)


class ClusterPlacement:
    """Buckets spread over the tablet servers registered in ZooKeeper, round robin at creation.

    The assignment is stored (``MetadataStore.put_bucket_assignment``) and never moves by itself: a bucket's
    data lives on its server's disk, so while that server is down the bucket has no leader (clients get
    NotLeaderOrFollower-style errors and retry) until it comes back.
    """

    def __init__(
        self, store: MetadataStore, servers: LiveServers, coordinator: ServerNode | Callable[[], ServerNode]
    ) -> None:
        """``coordinator``: this process's node on the coordinator, a function (following ZooKeeper) elsewhere."""
        self._store = store
        self._servers = servers
        self._coordinator = coordinator

    def coordinator(self) -> ServerNode:
        return self._coordinator if isinstance(self._coordinator, ServerNode) else self._coordinator()

    def tablet_servers(self) -> list[ServerNode]:
        return [ServerNode(i, s.host, s.port) for i, s in sorted(self._servers.live().items())]

    def leaders(self, table: TableInfo, partition_id: int | None = None) -> dict[int, int]:
        assignment = self._store.get_bucket_assignment(table.table_id, partition_id)
        if assignment is None:  # created before the cluster had tablet servers, or the record was lost
            return {}
        live = self._servers.live()
        return {bucket: server for bucket, server in assignment.items() if server in live}

    def assign(self, table: TableInfo, partition_id: int | None = None) -> dict[int, int]:
        existing = self._store.get_bucket_assignment(table.table_id, partition_id)
        if existing is not None:
            return existing
        servers = sorted(self._servers.live())
        if not servers:
            raise InvalidReplicationFactorError("Replication factor: 1 larger than available tablet servers: 0.")
        # start each table (and partition) at a different server so small tables spread too
        start = (table.table_id + (partition_id or 0)) % len(servers)
        assignment = {bucket: servers[(start + bucket) % len(servers)] for bucket in range(table.bucket_count)}
        self._store.put_bucket_assignment(table.table_id, partition_id, assignment)
        return assignment


__all__ = ["BucketPlacement", "ClusterPlacement", "LiveServers", "ServerNode", "SingleNodePlacement"]
