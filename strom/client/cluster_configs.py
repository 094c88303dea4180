"""Cluster configs from the client: Fluss's DescribeClusterConfigs (1045) and AlterClusterConfigs (1046);
see ``strom/coordinator/cluster_configs.py`` for which settings change at run time."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from strom.client.rpc_client import ClusterRpc
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb

OP_SET, OP_DELETE = 0, 1


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    key: str
    value: str | None
    """None where the server leaves a secret out."""
    source: str
    """INITIAL_SERVER_CONFIG (set when the server started) or DYNAMIC_SERVER_CONFIG (set at run time)."""


class ClusterConfigsAdmin:
    """The cluster-configs part of :class:`~strom.client.admin.Admin`."""

    _connection: ClusterRpc

    async def describe_cluster_configs(self) -> list[ConfigEntry]:
        response = await self._connection.coordinator_request(
            ApiKey.DESCRIBE_CLUSTER_CONFIGS, pb.DescribeClusterConfigsRequest()
        )
        return [ConfigEntry(entry.config_key, entry.config_value if entry.HasField("config_value") else None,
                            entry.config_source) for entry in response.configs]

    async def alter_cluster_configs(
        self, set_configs: Mapping[str, str] | None = None, reset_configs: Iterable[str] = ()
    ) -> None:
        """Set and reset (back to the server's initial value) settings at run time, all or none.

        Raises InvalidConfigError for a key that cannot change at run time or a value that does not parse,
        AuthorizationError without ALTER on the cluster."""
        request = pb.AlterClusterConfigsRequest()
        for key, value in (set_configs or {}).items():
            request.alter_configs.add(config_key=key, config_value=value, op_type=OP_SET)
        for key in reset_configs:
            request.alter_configs.add(config_key=key, op_type=OP_DELETE)
        await self._connection.coordinator_request(ApiKey.ALTER_CLUSTER_CONFIGS, request)


__all__ = ["ClusterConfigsAdmin", "ConfigEntry"]
