"""How many primary-key bucket leaders the cluster can hold: Fluss's ``kv.leader-replica.memory-reserved``.

The option is the memory one KV leader replica is assumed to take. The coordinator divides the live tablet
servers' memory by it: the memory each server registered (``tablet-server.advertised-resource.memory-size``,
else its cgroup limit, else the machine's; ``strom.server.resources``), a server that reported none counted
as the average of those that did. When half or fewer of the live servers reported their memory the estimate
is not trusted and the check is off, as it is with the option at 0 (its default) or no live tablet server.

Observed are the buckets of primary-key tables and of primary-key tables' partitions (one leader each);
creating a primary-key table (its buckets; a partitioned one has none until its partitions come) or a
partition of one is refused with InsufficientKvLeaderReplicaCapacity (71) when its buckets do not fit.
Log tables are not counted. Nothing already created is touched when the capacity shrinks (a server gone,
the option raised): only new ones are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from strom.errors import InsufficientKvLeaderReplicaCapacityError

UNLIMITED = -1
"""The capacity while the check is off."""


def kv_leader_replica_capacity(reserved_bytes: int, memories: Sequence[int | None]) -> int:
    """The KV leader replicas ``memories`` (one per live tablet server, None or ≤ 0: unknown) hold at
    ``reserved_bytes`` each; :data:`UNLIMITED` when ``reserved_bytes`` is 0, there is no server, or half or
    fewer of them know their memory."""
    if reserved_bytes <= 0 or not memories:
        return UNLIMITED
    known = [memory for memory in memories if memory is not None and memory > 0]
    if len(known) * 2 <= len(memories):
        return UNLIMITED
    known_total = sum(known)
    estimated_total = known_total + known_total // len(known) * (len(memories) - len(known))
    return estimated_total // reserved_bytes


class KvLeaderCapacity:
    """The coordinator's check before it creates KV leader replicas. Owned by the event loop."""

    def __init__(
        self, reserved_bytes: int, live_memories: Callable[[], Sequence[int | None]], observed: Callable[[], int],
    ) -> None:
        """``live_memories()``: the memory of each live tablet server (None: not reported);
        ``observed()``: the KV leader replicas the cluster has."""
        self.reserved_bytes = reserved_bytes
        """``kv.leader-replica.memory-reserved``; set again when the cluster config changes."""
        self._live_memories = live_memories
        self._observed = observed

    @property
    def enabled(self) -> bool:
        return self.reserved_bytes > 0

    def capacity(self) -> int:
        """The leaders the cluster holds now, :data:`UNLIMITED` while the check is off."""
        if not self.enabled:
            return UNLIMITED
        return kv_leader_replica_capacity(self.reserved_bytes, list(self._live_memories()))

    def count(self) -> int:
        """The KV leader replicas the cluster has."""
        return self._observed()

    def check(self, requested: int, what: str) -> None:
        """Refuse creating ``requested`` more KV leader replicas (for ``what``, named in the message).

        Raises:
            InsufficientKvLeaderReplicaCapacityError: the cluster is at or over its capacity, or they do not fit.
        """
        if requested <= 0:
            return
        capacity = self.capacity()
        if capacity == UNLIMITED:
            return
        observed = self.count()
        if observed > capacity or requested > capacity - observed:
            raise InsufficientKvLeaderReplicaCapacityError(
                f"Not enough KV leader replica capacity for {what}: it needs {requested} KV leader replicas, the "
                f"cluster has {observed} of its capacity of {capacity} (the live tablet servers' memory divided "
                f"by kv.leader-replica.memory-reserved = {self.reserved_bytes} bytes). Drop primary-key tables "
                "or partitions, add tablet servers, or lower kv.leader-replica.memory-reserved "
                "(0 turns the check off)."
            )


__all__ = ["UNLIMITED", "KvLeaderCapacity", "kv_leader_replica_capacity"]
