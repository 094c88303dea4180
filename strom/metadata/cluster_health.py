"""A cluster's health as Fluss's GetClusterHealth (1062) reports it: replica counts and a status, shared
by the coordinator that counts them and the clients that read them."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ClusterHealthStatus(enum.IntEnum):
    """Fluss's PbClusterHealthStatus codes."""

    GREEN = 0
    YELLOW = 1
    RED = 2
    UNKNOWN = 3


@dataclass(frozen=True, slots=True)
class ClusterHealth:
    num_replicas: int
    in_sync_replicas: int
    num_leader_replicas: int
    """One per bucket."""
    active_leader_replicas: int
    status: ClusterHealthStatus

    @classmethod
    def counted(cls, replicas: int, in_sync: int, leaders: int, active_leaders: int) -> ClusterHealth:
        """Fluss's rule: RED while a bucket has no active leader, else YELLOW while a replica is out of
        sync, else GREEN."""
        if active_leaders < leaders:
            status = ClusterHealthStatus.RED
        elif in_sync < replicas:
            status = ClusterHealthStatus.YELLOW
        else:
            status = ClusterHealthStatus.GREEN
        return cls(replicas, in_sync, leaders, active_leaders, status)


__all__ = ["ClusterHealth", "ClusterHealthStatus"]
