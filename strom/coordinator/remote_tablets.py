"""The coordinator's :class:`TabletServerGateway` in a cluster: Fluss's NotifyLeaderAndIsr, StopReplica and
UpdateMetadata requests to the tablet server processes, and ListOffsets to bucket leaders for their high
watermarks.

Leadership notices are sent in the background and are only a head start: a tablet server also takes a
bucket assigned to it (``MetadataStore.get_bucket_assignment``) on the first request for it, so a notice
lost while a server is down costs nothing. Stopping and deleting replicas is awaited; a server that is down
then deletes the dropped tables' data when it starts again (it hosts only buckets of existing tables).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from strom.coordinator.placement import BucketPlacement
from strom.errors import LeaderNotAvailableError, error_for_code
from strom.ids import TableBucket
from strom.metadata.table_info import TableInfo
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.rpc.peers import ALL_BUCKETS, PeerConnections, ServerNode
from strom.security.internal import tablet_server_name

log = logging.getLogger(__name__)

CHANGE_TABLE_WAIT_S = 5.0
"""How long AlterTable waits for the live tablet servers to take the changed table."""
LATEST_OFFSET = 1
"""ListOffsets' ``offset_type`` for the latest offset: the high watermark (0 earliest, 2 by timestamp)."""

class RemoteTabletServers:
    """Owned by the coordinator's event loop."""

    def __init__(self, placement: BucketPlacement, peers: PeerConnections, coordinator_epoch: int) -> None:
        """``coordinator_epoch``: this coordinator's election epoch, carried by every request so tablet
        servers refuse a deposed coordinator's."""
        self._placement = placement
        self._peers = peers
        self._epoch = coordinator_epoch
        self._background: set[asyncio.Task[None]] = set()

    def become_leader(self, table: TableInfo, buckets: Sequence[TableBucket]) -> None:
        """Tell every live replica of ``buckets`` that their leadership is (newly) set: each reads the state
        from ZooKeeper and leads or follows."""
        if not buckets:
            return
        described = self._placement.describe(table, buckets[0].partition_id)
        by_server: dict[int, list[TableBucket]] = {}
        for bucket in buckets:
            leadership = described.get(bucket.bucket)
            for replica in leadership.replicas if leadership is not None else ():
                by_server.setdefault(replica, []).append(bucket)
        for node in self._placement.tablet_servers():
            if node.node_id in by_server:
                leader = described[by_server[node.node_id][0].bucket].leader
                request = _leader_request(table, by_server[node.node_id], -1 if leader is None else leader, self._epoch)
                self._spawn(self._send(node, ApiKey.NOTIFY_LEADER_AND_ISR, request))

    async def notify_bucket(self, table: TableInfo, bucket: TableBucket, servers: Iterable[int]) -> None:
        """Tell the live ones of ``servers`` that ``bucket``'s state changed, and wait for their answers (a
        replica moving: those leaving the bucket are no longer in its state, so they are named here). A
        failed notice is logged; the replica mover tells a server again while it waits for it."""
        wanted = set(servers)
        nodes = [node for node in self._placement.tablet_servers() if node.node_id in wanted]
        leader = self._placement.describe(table, bucket.partition_id).get(bucket.bucket)
        request = _leader_request(table, [bucket], -1 if leader is None or leader.leader is None else leader.leader,
                                  self._epoch)
        await asyncio.gather(*(self._send(node, ApiKey.NOTIFY_LEADER_AND_ISR, request) for node in nodes),
                             return_exceptions=True)

    async def change_table(self, table: TableInfo) -> None:
        """UpdateMetadata to every live tablet server, awaited for at most CHANGE_TABLE_WAIT_S: a server
        that does not answer in time (or is down) reads the table again from the store when it is next
        told of it, or when its metadata cache's bound passes."""
        request = pb.UpdateMetadataRequest(coordinator_epoch=self._epoch)
        request.table_metadata.add(
            table_path=pb.PbTablePath(database_name=table.path.database_name, table_name=table.path.table_name),
            table_id=table.table_id, schema_id=table.schema_id, table_json=table.table_json,
            created_time=table.created_ms, modified_time=table.modified_ms,
        )
        sends = [asyncio.ensure_future(self._send(node, ApiKey.UPDATE_METADATA, request))
                 for node in self._placement.tablet_servers()]
        if not sends:
            return
        _done, pending = await asyncio.wait(sends, timeout=CHANGE_TABLE_WAIT_S)
        for send in pending:  # finishes in the background, logged by _send
            self._spawn(send)
        for send in sends:
            if send.done() and not send.cancelled():
                send.exception()  # retrieved: logged by _send already

    async def stop_replicas(self, table_id: int, partition_id: int | None, *, delete: bool) -> None:
        """Every live tablet server stops (and with ``delete`` removes) the table's or partition's buckets
        it hosts; StopReplica names the table and partition with bucket -1 (all of its buckets)."""
        request = pb.StopReplicaRequest(coordinator_epoch=self._epoch)
        target = request.stop_replicas_req.add(leader_epoch=0, delete=delete)
        target.table_bucket.table_id = table_id
        target.table_bucket.bucket_id = ALL_BUCKETS
        if partition_id is not None:
            target.table_bucket.partition_id = partition_id
        results = await asyncio.gather(
            *(self._send(node, ApiKey.STOP_REPLICA, request) for node in self._placement.tablet_servers()),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                log.warning("StopReplica of table %d failed on a tablet server: %s", table_id, result)

    def _replica_nodes(self, table: TableInfo, buckets: Iterable[TableBucket]) -> dict[int, list[TableBucket]]:
        """The live tablet servers holding a replica of each of ``buckets``, with the buckets each holds."""
        live = {node.node_id for node in self._placement.tablet_servers()}
        described: dict[int | None, dict[int, Any]] = {}
        holders: dict[int, list[TableBucket]] = {}
        for bucket in buckets:
            if bucket.partition_id not in described:
                described[bucket.partition_id] = self._placement.describe(table, bucket.partition_id)
            leadership = described[bucket.partition_id].get(bucket.bucket)
            for replica in leadership.replicas if leadership is not None else ():
                if replica in live:
                    holders.setdefault(replica, []).append(bucket)
        return holders

    def _notify(self, holders: dict[int, list[TableBucket]], key: ApiKey, request_for: Any) -> None:
        nodes = {node.node_id: node for node in self._placement.tablet_servers()}
        for server_id, buckets in holders.items():
            self._spawn(self._send(nodes[server_id], key, request_for(buckets)))

    def notify_kv_snapshot_offset(self, table: TableInfo, bucket: TableBucket, min_retain_offset: int) -> None:
        """NotifyKvSnapshotOffset to every replica of ``bucket`` (Fluss tells the followers; strom's leaders
        read the offset too instead of the snapshot records)."""
        def request(_buckets: list[TableBucket]) -> Any:
            message = pb.NotifyKvSnapshotOffsetRequest(table_id=bucket.table_id, bucket_id=bucket.bucket,
                                                       coordinator_epoch=self._epoch, min_retain_offset=min_retain_offset)
            if bucket.partition_id is not None:
                message.partition_id = bucket.partition_id
            return message

        self._notify(self._replica_nodes(table, [bucket]), ApiKey.NOTIFY_KV_SNAPSHOT_OFFSET, request)

    def notify_lake_table_offsets(self, table: TableInfo, snapshot_id: int, log_end_offsets: Mapping[TableBucket, int],
                                  max_timestamps: Mapping[TableBucket, int]) -> None:
        """NotifyLakeTableOffset to every replica of the buckets, one request per tablet server."""
        def request(buckets: list[TableBucket]) -> Any:
            message = pb.NotifyLakeTableOffsetRequest(coordinator_epoch=self._epoch)
            for bucket in buckets:
                entry = message.notify_buckets_req.add(table_id=bucket.table_id, bucket_id=bucket.bucket,
                                                       snapshot_id=snapshot_id, log_end_offset=log_end_offsets[bucket])
                if bucket.partition_id is not None:
                    entry.partition_id = bucket.partition_id
                if bucket in max_timestamps:
                    entry.max_timestamp = max_timestamps[bucket]
            return message

        self._notify(self._replica_nodes(table, log_end_offsets), ApiKey.NOTIFY_LAKE_TABLE_OFFSET, request)

    async def high_watermarks(self, table: TableInfo, buckets: Sequence[TableBucket]) -> dict[TableBucket, int]:
        """ListOffsets (latest: the high watermark) to each bucket's leader, one request per leader and
        partition."""
        nodes = {node.node_id: node for node in self._placement.tablet_servers()}
        groups: dict[tuple[int, int | None], list[TableBucket]] = {}
        described: dict[int | None, dict[int, Any]] = {}
        for bucket in buckets:
            if bucket.partition_id not in described:
                described[bucket.partition_id] = self._placement.describe(table, bucket.partition_id)
            leadership = described[bucket.partition_id].get(bucket.bucket)
            if leadership is None or leadership.leader is None or leadership.leader not in nodes:
                raise LeaderNotAvailableError(f"{bucket} has no live leader to tell its high watermark")
            groups.setdefault((leadership.leader, bucket.partition_id), []).append(bucket)
        found: dict[TableBucket, int] = {}
        for (leader, partition_id), members in groups.items():
            request = pb.ListOffsetsRequest(follower_server_id=-1, offset_type=LATEST_OFFSET, table_id=table.table_id,
                                            bucket_id=[b.bucket for b in members])
            if partition_id is not None:
                request.partition_id = partition_id
            node = nodes[leader]
            response = await self._peers.request(node.host, node.port, ApiKey.LIST_OFFSETS, request,
                                                 server_name=tablet_server_name(node.node_id))
            for answer in response.buckets_resp:  # type: ignore[attr-defined]
                if answer.HasField("error_code") and answer.error_code != 0:
                    raise error_for_code(answer.error_code, answer.error_message or None)
                found[TableBucket(table.table_id, answer.bucket_id, partition_id)] = answer.offset
        return found

    async def _send(self, node: ServerNode, key: ApiKey, request: object) -> None:
        try:
            await self._peers.request(node.host, node.port, key, request,  # type: ignore[arg-type]
                                     server_name=tablet_server_name(node.node_id))
        except Exception as exc:
            log.warning("%s to tablet server %d (%s:%d) failed: %s", key.name, node.node_id, node.host, node.port, exc)
            raise

    def _spawn(self, work: Any) -> None:
        async def quietly() -> None:
            with contextlib.suppress(Exception):  # logged by _send; the tablet server catches up from the store
                await work  # type: ignore[misc]

        task = asyncio.ensure_future(quietly())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


"""StopReplica's bucket id meaning every bucket of the table or partition (strom's convention)."""


def _leader_request(table: TableInfo, buckets: Sequence[TableBucket], leader: int, epoch: int) -> object:
    request = pb.NotifyLeaderAndIsrRequest(coordinator_epoch=epoch)
    for bucket in buckets:
        entry = request.notify_buckets_leader_req.add(leader=leader, leader_epoch=0, bucket_epoch=0)
        entry.physical_table_path.database_name = table.path.database_name
        entry.physical_table_path.table_name = table.path.table_name
        entry.table_bucket.table_id = bucket.table_id
        entry.table_bucket.bucket_id = bucket.bucket
        if bucket.partition_id is not None:
            entry.table_bucket.partition_id = bucket.partition_id
        entry.replicas.append(leader)
        entry.isr.append(leader)
    return request


__all__ = ["RemoteTabletServers"]
