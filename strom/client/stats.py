"""Table statistics and cluster health from the client: Fluss's GetTableStats (1059), asked of each
bucket's leader, and GetClusterHealth (1062), asked of the coordinator."""

from __future__ import annotations

from dataclasses import dataclass

from strom.client.rpc_client import ClusterRpc
from strom.errors import error_for_code
from strom.ids import TableBucket
from strom.metadata.cluster_health import ClusterHealth, ClusterHealthStatus
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb


@dataclass(frozen=True, slots=True)
class BucketStats:
    row_count: int | None
    """Live keys of a primary-key bucket (None with a WAL changelog image), records of a log bucket."""
    log_size_bytes: int | None
    """The leader's local log segments (strom's extension; None from a Fluss server)."""
    kv_size_bytes: int | None
    """The leader's RocksDB files and memtables (strom's extension; None for log tables and Fluss servers)."""


class StatsAdmin:
    """The statistics part of :class:`~strom.client.admin.Admin`."""

    _connection: ClusterRpc

    async def get_bucket_row_counts(self, buckets: list[TableBucket]) -> dict[TableBucket, int | None]:
        """Each bucket's row count: a primary-key bucket's live keys (None where the server cannot count
        them: a WAL changelog image), a log bucket's records from its earliest offset. One request per
        leader; a bucket's error (no leader, unknown bucket) is raised."""
        return {bucket: stats.row_count for bucket, stats in (await self.get_bucket_stats(buckets)).items()}

    async def get_bucket_stats(self, buckets: list[TableBucket]) -> dict[TableBucket, BucketStats]:
        """Each bucket's row count and, from a strom server, its local log and RocksDB sizes in bytes."""
        counts: dict[TableBucket, BucketStats] = {}
        for address, led in (await self._connection.metadata.by_leader(buckets)).items():
            for table_id in sorted({bucket.table_id for bucket in led}):
                request = pb.GetTableStatsRequest(table_id=table_id)
                for bucket in (b for b in led if b.table_id == table_id):
                    entry = request.buckets_req.add(bucket_id=bucket.bucket)
                    if bucket.partition_id is not None:
                        entry.partition_id = bucket.partition_id
                response = await self._connection.request(address, ApiKey.GET_TABLE_STATS, request)
                for answer in response.buckets_resp:
                    if answer.HasField("error_code") and answer.error_code != 0:
                        raise error_for_code(answer.error_code, answer.error_message)
                    partition_id = answer.partition_id if answer.HasField("partition_id") else None
                    bucket = TableBucket(table_id, answer.bucket_id, partition_id)
                    counts[bucket] = BucketStats(
                        answer.row_count if answer.HasField("row_count") else None,
                        answer.log_size_bytes if answer.HasField("log_size_bytes") else None,
                        answer.kv_size_bytes if answer.HasField("kv_size_bytes") else None,
                    )
        return counts

    async def get_cluster_health(self) -> ClusterHealth:
        response = await self._connection.coordinator_request(ApiKey.GET_CLUSTER_HEALTH, pb.GetClusterHealthRequest())
        try:
            status = ClusterHealthStatus(response.status)
        except ValueError:  # a code this client does not know
            status = ClusterHealthStatus.UNKNOWN
        return ClusterHealth(response.num_replicas, response.in_sync_replicas, response.num_leader_replicas,
                             response.active_leader_replicas, status)


__all__ = ["BucketStats", "ClusterHealth", "ClusterHealthStatus", "StatsAdmin"]
