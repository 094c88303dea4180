"""The coordinator's record of every bucket's remote log (Fluss's CommitRemoteLogManifest, 1027, and
ListRemoteLogManifests, 1063): which manifest is current, so a bucket's next leader continues from it and
everything a manifest does not lead to is an orphan its leader may delete.

A commit is the moment an upload counts: the tablet server writes segment files and a new manifest, then
commits the manifest's location here; only then does it delete the segments' local copies. In a cluster a
commit carries the bucket's leader epoch, and one from a deposed leader is refused (FencedLeaderEpoch), as
for KV snapshots; the followers are told the new remote offsets (NotifyRemoteLogOffsets, 1028).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from strom.coordinator.placement import LeaderEpochOf, fence_leader_epoch
from strom.coordinator.service import CoordinatorService
from strom.errors import PartitionNotExistError, UnknownTableOrBucketError
from strom.ids import TableBucket
from strom.metadata.off_loop import off_loop
from strom.metadata.store import MetadataStore
from strom.metadata.table_info import TableInfo
from strom.remote.log_layout import RemoteLogManifestHandle, table_log_dir
from strom.remote.storage import RemoteStorage
from strom.rpc.messages import pb

log = logging.getLogger(__name__)

NotifyFollowers = Callable[[TableBucket, Any], Awaitable[None]]


class RemoteLogManifestService:
    """Owned by the event loop; the store calls block briefly (as the catalog's do)."""

    def __init__(
        self,
        catalog: CoordinatorService,
        store: MetadataStore,
        remote: RemoteStorage,
        leader_epoch_of: LeaderEpochOf | None = None,
        notify_followers: NotifyFollowers | None = None,
    ) -> None:
        """``leader_epoch_of`` (a cluster): a bucket's current leader epoch, None for no such bucket.
        ``notify_followers(bucket, NotifyRemoteLogOffsetsRequest)`` tells the bucket's followers."""
        self._catalog = catalog
        self._store = store
        self._remote = remote
        self._leader_epoch_of = leader_epoch_of
        self._notify_followers = notify_followers
        self._notices: set[asyncio.Task[None]] = set()

    def _bucket(self, table_id: int, partition_id: int | None, bucket_id: int) -> tuple[TableInfo, TableBucket]:
        table = self._catalog.table_info_by_id(table_id)
        if table is None:
            raise UnknownTableOrBucketError.unknown_table_id(table_id)
        if partition_id is not None:
            partition = self._catalog.partition_by_id(partition_id)
            if partition is None or partition.table_id != table_id:
                raise PartitionNotExistError(f"Partition id {partition_id} of table '{table.path}' does not exist.")
        elif table.is_partitioned:
            raise PartitionNotExistError(f"Table '{table.path}' is partitioned: name the partition.")
        if not 0 <= bucket_id < table.bucket_count:
            raise UnknownTableOrBucketError(f"Table '{table.path}' has no bucket {bucket_id}.")
        return table, TableBucket(table_id, bucket_id, partition_id)

    async def commit_remote_log_manifest(self, request: Any, _context: object) -> Any:
        partition_id = request.partition_id if request.HasField("partition_id") else None
        _table, bucket = self._bucket(request.table_id, partition_id, request.bucket_id)
        if self._leader_epoch_of is not None:
            fence_leader_epoch(bucket, self._leader_epoch_of, request.bucket_leader_epoch,
                               f"the remote log manifest commit of {bucket}")
        handle = RemoteLogManifestHandle(
            request.remote_log_manifest_path, request.remote_log_end_offset, request.remote_log_start_offset
        )
        await off_loop(self._store.put_remote_log_manifest, bucket.table_id, bucket.partition_id, bucket.bucket,
                       handle.to_bytes())
        if self._notify_followers is not None:
            notice = pb.NotifyRemoteLogOffsetsRequest(
                table_id=bucket.table_id, bucket_id=bucket.bucket, coordinator_epoch=request.coordinator_epoch,
                remote_start_offset=request.remote_log_start_offset, remote_end_offset=request.remote_log_end_offset,
            )
            if partition_id is not None:
                notice.partition_id = partition_id
            task = asyncio.get_running_loop().create_task(self._notify(bucket, notice))
            self._notices.add(task)
            task.add_done_callback(self._notices.discard)
        return pb.CommitRemoteLogManifestResponse(commitSuccess=True)

    async def _notify(self, bucket: TableBucket, notice: Any) -> None:
        assert self._notify_followers is not None
        try:
            await self._notify_followers(bucket, notice)
        except Exception as exc:  # followers also reread the handle on their own schedule
            log.info("could not tell the followers of %s its remote log offsets: %s", bucket, exc)

    async def list_remote_log_manifests(self, request: Any, _context: object) -> Any:
        partition_id = request.partition_id if request.HasField("partition_id") else None
        table = self._catalog.table_info_by_id(request.table_id)
        if table is None:
            raise UnknownTableOrBucketError.unknown_table_id(request.table_id)
        response = pb.ListRemoteLogManifestsResponse()
        stored = await off_loop(self._store.list_remote_log_manifests, request.table_id, partition_id)
        for bucket_id, payload in stored.items():
            handle = RemoteLogManifestHandle.from_bytes(payload)
            entry = response.manifests.add(remote_log_manifest_path=handle.manifest_path,
                                           remote_log_end_offset=handle.end_offset)
            entry.table_bucket.table_id = request.table_id
            entry.table_bucket.bucket_id = bucket_id
            if partition_id is not None:
                entry.table_bucket.partition_id = partition_id
        return response

    async def drop_table(self, table: TableInfo, partition_id: int | None) -> None:
        """Delete a dropped table's (or partition's) remote log; the store dropped the handles with it."""
        directory = table_log_dir(table.path.database_name, table.path.table_name, table.table_id)
        if partition_id is not None:  # the partition's record is gone: find its directory by id
            suffix = f"-p{partition_id}"
            found = await asyncio.to_thread(self._remote.list_dirs, directory)
            targets = [f"{directory}/{name}" for name in found if name.endswith(suffix)]
        else:
            targets = [directory]
        for target in targets:
            try:
                await asyncio.to_thread(self._remote.delete_tree, target)
            except OSError as exc:  # the next drop of the same name does not reuse the id: an orphan at worst
                log.warning("could not delete the remote log %s: %s", target, exc)

    async def stop(self) -> None:
        for task in list(self._notices):
            task.cancel()
        if self._notices:
            await asyncio.gather(*self._notices, return_exceptions=True)


__all__ = ["RemoteLogManifestService"]
