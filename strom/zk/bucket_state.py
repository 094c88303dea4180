"""Each replicated bucket's leader, leader epoch, replicas and in-sync replicas (ISR), in ZooKeeper.

One node per bucket, ``/tabletservers/tables/<table id>/buckets/<bucket>/leader_isr`` (or under
``/tabletservers/partitions/<partition id>``), holding ``{"leader", "leader_epoch", "replicas", "isr"}``;
the node's version is the state's version, so a rewrite is a compare-and-set on it (what fences a leader
that was replaced while it was paused; :class:`~strom.membership.contract.BucketStates`).
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from strom.ids import TableBucket
from strom.membership.contract import BucketStates, LeaderAndIsr


class ZooKeeperBucketStates(BucketStates):
    """The states as ZooKeeper nodes, through a started kazoo client (blocking calls)."""

    def __init__(self, client: KazooClient, root: str) -> None:
        super().__init__()
        self._client = client
        self._root = root

    def path(self, bucket: TableBucket) -> str:
        if bucket.partition_id is None:
            owner = f"{self._root}/tabletservers/tables/{bucket.table_id}"
        else:
            owner = f"{self._root}/tabletservers/partitions/{bucket.partition_id}"
        return f"{owner}/buckets/{bucket.bucket}/leader_isr"

    def _create(self, bucket: TableBucket, state: LeaderAndIsr) -> bool:
        try:
            self._client.create(self.path(bucket), state.to_json(), makepath=True)
        except NodeExistsError:
            return False
        return True

    def _read(self, bucket: TableBucket) -> tuple[LeaderAndIsr, int] | None:
        try:
            data, stat = self._client.get(self.path(bucket))
        except NoNodeError:
            return None
        return LeaderAndIsr.from_json(bytes(data)), stat.version

    def _read_many(self, buckets: list[TableBucket]) -> dict[TableBucket, LeaderAndIsr]:
        pending = [(bucket, self._client.get_async(self.path(bucket))) for bucket in buckets]  # one pipelined round
        found: dict[TableBucket, LeaderAndIsr] = {}
        for bucket, result in pending:
            try:
                data, _stat = result.get()
            except NoNodeError:
                continue
            found[bucket] = LeaderAndIsr.from_json(bytes(data))
        return found

    def _write_if(self, bucket: TableBucket, state: LeaderAndIsr, version: int) -> bool:
        try:
            self._client.set(self.path(bucket), state.to_json(), version=version)
        except (BadVersionError, NoNodeError):
            return False
        return True


__all__ = ["ZooKeeperBucketStates"]
