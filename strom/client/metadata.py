"""What the client knows about the cluster: servers, tables, partitions and bucket leaders.

Filled from GetMetadata responses and refreshed on demand (an unknown table or bucket, or a retriable
error that says the leader moved).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from strom.errors import LeaderNotAvailableError, TableNotExistError, UnknownTableOrBucketError
from strom.ids import TableBucket, TablePath
from strom.metadata.table_info import TableInfo
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import Message, pb


class BootstrapRequests(Protocol):
    """Where metadata requests go (``ClusterRpc.bootstrap_request``: the first bootstrap server that answers)."""

    async def bootstrap_request(self, key: ApiKey, message: Message) -> Message: ...


class MetadataCache:
    """Owned by one connection; used from one event loop."""

    def __init__(self, connection: BootstrapRequests) -> None:
        self._connection = connection
        self._coordinator: str | None = None
        self._servers: dict[int, str] = {}
        self._tables: dict[TablePath, TableInfo] = {}
        self._tables_by_id: dict[int, TableInfo] = {}
        self._leaders: dict[TableBucket, int] = {}
        self._partition_ids: dict[tuple[int, str], int] = {}
        self._partition_names: dict[int, str] = {}
        self.leaders_version = 0
        """Moves whenever a bucket's leader or a server's address may have changed: a blocking reader keeps
        the leaders it looked up until it moves."""

    def _absorb(self, response: Any) -> None:
        self.leaders_version += 1
        if response.HasField("coordinator_server"):
            node = response.coordinator_server
            self._coordinator = f"{node.host}:{node.port}"
        for node in response.tablet_servers:
            self._servers[node.node_id] = f"{node.host}:{node.port}"
        for table in response.table_metadata:
            info = TableInfo(
                table.table_id,
                TablePath(table.table_path.database_name, table.table_path.table_name),
                table.schema_id,
                bytes(table.table_json),
                table.created_time,
                table.modified_time,
            )
            stale = self._tables.get(info.path)
            if stale is not None and stale.table_id != info.table_id:
                self._forget_table(stale.table_id)
            self._tables[info.path] = info
            self._tables_by_id[info.table_id] = info
            for bucket in table.bucket_metadata:
                self._set_leader(TableBucket(info.table_id, bucket.bucket_id), bucket)
        for partition in response.partition_metadata:
            self._partition_ids[(partition.table_id, partition.partition_name)] = partition.partition_id
            self._partition_names[partition.partition_id] = partition.partition_name
            for bucket in partition.bucket_metadata:
                self._set_leader(TableBucket(partition.table_id, bucket.bucket_id, partition.partition_id), bucket)

    def _set_leader(self, bucket: TableBucket, metadata: Any) -> None:
        if metadata.HasField("leader_id"):
            self._leaders[bucket] = metadata.leader_id
        else:
            self._leaders.pop(bucket, None)

    def _forget_table(self, table_id: int) -> None:
        self._tables_by_id.pop(table_id, None)
        for bucket in [b for b in self._leaders if b.table_id == table_id]:
            del self._leaders[bucket]

    async def refresh(self) -> None:
        """Refresh the server list from a bootstrap server."""
        self._absorb(await self._connection.bootstrap_request(ApiKey.GET_METADATA, pb.MetadataRequest()))

    async def refresh_table(self, path: TablePath) -> TableInfo:
        """Reload a table's metadata (its schema, buckets and leaders). Raises TableNotExistError."""
        request = pb.MetadataRequest()
        request.table_path.add(database_name=path.database_name, table_name=path.table_name)
        self._absorb(await self._connection.bootstrap_request(ApiKey.GET_METADATA, request))
        found = self._tables.get(path)
        if found is None:  # a secured server leaves out what the caller may not DESCRIBE, as Fluss's does
            raise TableNotExistError(f"Table '{path}' does not exist, or this principal may not describe it.")
        return found

    async def table(self, path: TablePath) -> TableInfo:
        cached = self._tables.get(path)
        return cached if cached is not None else await self.refresh_table(path)

    async def partition_id(self, table: TableInfo, partition_name: str) -> int:
        """The id of a partition. Raises PartitionNotExistError (36) if it does not exist."""
        cached = self._partition_ids.get((table.table_id, partition_name))
        if cached is not None:
            return cached
        request = pb.MetadataRequest()
        request.table_path.add(database_name=table.path.database_name, table_name=table.path.table_name)
        request.partitions_path.add(
            database_name=table.path.database_name, table_name=table.path.table_name, partition_name=partition_name
        )
        self._absorb(await self._connection.bootstrap_request(ApiKey.GET_METADATA, request))
        return self._partition_ids[(table.table_id, partition_name)]

    def cached_partition_id(self, table_id: int, partition_name: str) -> int | None:
        return self._partition_ids.get((table_id, partition_name))

    def cached_leader_address(self, bucket: TableBucket) -> str | None:
        """The bucket's leader as last reported, without asking the cluster (for blocking callers)."""
        leader = self._leaders.get(bucket)
        return None if leader is None else self._servers.get(leader)

    def partition_name(self, partition_id: int) -> str | None:
        return self._partition_names.get(partition_id)

    async def coordinator_address(self) -> str:
        if self._coordinator is None:
            await self.refresh()
        if self._coordinator is None:
            raise LeaderNotAvailableError("the cluster reported no coordinator")
        return self._coordinator

    async def leader_address(self, bucket: TableBucket) -> str:
        leader = self._leaders.get(bucket)
        if leader is None or leader not in self._servers:
            await self._refresh_bucket(bucket)
            leader = self._leaders.get(bucket)
        if leader is None:
            raise LeaderNotAvailableError(f"no leader is known for {bucket}")
        address = self._servers.get(leader)
        if address is None:
            raise LeaderNotAvailableError(f"leader {leader} of {bucket} is not a known tablet server")
        return address

    async def by_leader(self, buckets: Iterable[TableBucket]) -> dict[str, list[TableBucket]]:
        """``buckets`` grouped by their leader's address, in the order given (one request per leader).

        Raises:
            LeaderNotAvailableError: a bucket has no known leader.
        """
        grouped: dict[str, list[TableBucket]] = {}
        for bucket in buckets:
            grouped.setdefault(await self.leader_address(bucket), []).append(bucket)
        return grouped

    async def _refresh_bucket(self, bucket: TableBucket) -> None:
        table = self._tables_by_id.get(bucket.table_id)
        if table is None:
            raise UnknownTableOrBucketError(f"table id {bucket.table_id} is unknown to this client; load the table first")
        request = pb.MetadataRequest()
        request.table_path.add(database_name=table.path.database_name, table_name=table.path.table_name)
        if bucket.partition_id is not None:
            request.partitions_id.append(bucket.partition_id)
        self._absorb(await self._connection.bootstrap_request(ApiKey.GET_METADATA, request))

    def invalidate(self, bucket: TableBucket) -> None:
        """Forget a bucket's leader after a NotLeaderOrFollower / UnknownTableOrBucket answer."""
        self._leaders.pop(bucket, None)
        self.leaders_version += 1
