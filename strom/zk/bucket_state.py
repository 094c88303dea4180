"""Each replicated bucket's leader, leader epoch, replicas and in-sync replicas (ISR), in ZooKeeper.

One node per bucket, ``/tabletservers/tables/<table id>/buckets/<bucket>/leader_isr`` (or under
``/tabletservers/partitions/<partition id>``), holding ``{"leader", "leader_epoch", "replicas", "isr"}``.
The coordinator creates it and rewrites it when it elects a leader; the leader rewrites it when a follower
joins or leaves the ISR. Every rewrite is a compare-and-set on the node's version and keeps the leader epoch
it read, so a leader that was replaced while it was paused cannot change the ISR any more: that is what
fences it (it then can no longer acknowledge writes alone).
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, replace

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from strom.ids import TableBucket

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    leader: int
    """The leading tablet server, NO_LEADER while none of the ISR is alive."""
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    def with_isr(self, isr: tuple[int, ...]) -> LeaderAndIsr:
        return replace(self, isr=isr)

    def to_json(self) -> bytes:
        document = {"leader": self.leader, "leader_epoch": self.leader_epoch, "replicas": list(self.replicas),
                    "isr": list(self.isr)}
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> LeaderAndIsr:
        value = json.loads(raw)
        return cls(int(value["leader"]), int(value["leader_epoch"]), tuple(value["replicas"]), tuple(value["isr"]))


class BucketStates:
    """Read and write the nodes through a started kazoo client (thread-safe, blocking calls)."""

    def __init__(self, client: KazooClient, root: str) -> None:
        self._client = client
        self._root = root
        self._lock = threading.Lock()
        self._known: dict[TableBucket, LeaderAndIsr] | None = None
        """Each bucket's state as last read or written here, once :meth:`remember_leadership` was called."""

    def remember_leadership(self) -> None:
        """Keep each bucket's state as last read or written here, so that :meth:`leaderships` answers
        without reading ZooKeeper. For the active coordinator alone: it is the only writer of leaders,
        epochs and replicas (a leader changes nothing but the ISR), so what it read or wrote last is their
        current value. Forgets what it knew (a coordinator that just became active)."""
        with self._lock:
            self._known = {}

    def _remember(self, states: dict[TableBucket, LeaderAndIsr]) -> None:
        if self._known is not None:
            with self._lock:
                self._known.update(states)

    def leaderships(self, buckets: list[TableBucket]) -> dict[TableBucket, LeaderAndIsr]:
        """The states of ``buckets`` that have one, their leader, epoch and replicas current (the ISR may
        lag): remembered ones without a ZooKeeper read, once :meth:`remember_leadership` was called."""
        if self._known is None:
            return self.get_many(buckets)
        with self._lock:
            found = {bucket: state for bucket in buckets if (state := self._known.get(bucket)) is not None}
        missing = [bucket for bucket in buckets if bucket not in found]
        if missing:
            found.update(self.get_many(missing))
        return found

    def remembered(self, buckets: list[TableBucket]) -> dict[TableBucket, LeaderAndIsr] | None:
        """The states of ``buckets`` from memory alone (no ZooKeeper read: safe on an event loop); None when
        one of them is not remembered, or nothing is."""
        if self._known is None:
            return None
        with self._lock:
            found = {bucket: state for bucket in buckets if (state := self._known.get(bucket)) is not None}
        return found if len(found) == len(buckets) else None

    def path(self, bucket: TableBucket) -> str:
        if bucket.partition_id is None:
            owner = f"{self._root}/tabletservers/tables/{bucket.table_id}"
        else:
            owner = f"{self._root}/tabletservers/partitions/{bucket.partition_id}"
        return f"{owner}/buckets/{bucket.bucket}/leader_isr"

    def create(self, bucket: TableBucket, state: LeaderAndIsr) -> None:
        """Create the node (an existing one, from a retried creation, is kept)."""
        with contextlib.suppress(NodeExistsError):
            self._client.create(self.path(bucket), state.to_json(), makepath=True)
            self._remember({bucket: state})

    def get(self, bucket: TableBucket) -> tuple[LeaderAndIsr, int] | None:
        """The state and its node version, None for a bucket without one (not replicated by a cluster)."""
        try:
            data, stat = self._client.get(self.path(bucket))
        except NoNodeError:
            return None
        state = LeaderAndIsr.from_json(bytes(data))
        self._remember({bucket: state})
        return state, stat.version

    def get_many(self, buckets: list[TableBucket]) -> dict[TableBucket, LeaderAndIsr]:
        """The states of ``buckets`` that have one, in one pipelined round."""
        pending = [(bucket, self._client.get_async(self.path(bucket))) for bucket in buckets]
        found: dict[TableBucket, LeaderAndIsr] = {}
        for bucket, result in pending:
            try:
                data, _stat = result.get()
            except NoNodeError:
                continue
            found[bucket] = LeaderAndIsr.from_json(bytes(data))
        self._remember(found)
        return found

    def compare_and_set(self, bucket: TableBucket, state: LeaderAndIsr, version: int) -> bool:
        """Write ``state`` if the node is still at ``version``; False when someone changed it first."""
        try:
            self._client.set(self.path(bucket), state.to_json(), version=version)
        except (BadVersionError, NoNodeError):
            return False
        self._remember({bucket: state})
        return True


__all__ = ["NO_LEADER", "BucketStates", "LeaderAndIsr"]
