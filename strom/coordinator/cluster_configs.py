"""DescribeClusterConfigs (1045) and AlterClusterConfigs (1046): server settings changed while the cluster
runs, persisted in the metadata store.

Fluss's semantics. Describe answers the settings the server was started with (INITIAL_SERVER_CONFIG: what
its configuration file and ``-D`` options set) and those changed at run time (DYNAMIC_SERVER_CONFIG, which
win over an initial value of the same key); values of keys that look secret (password, secret, key) are
left out. Alter applies a list of changes as one: SET a value, DELETE (back to the initial value), APPEND
and SUBTRACT (for list-valued settings, of which strom has no dynamic one); a key that cannot change at run
time, or a value that does not parse, refuses the whole list and changes nothing.

Which keys can change (``strom.config.DYNAMIC_OPTIONS``) differs from Fluss's list, because it is what
strom applies without a restart: ``kv.snapshot.interval`` (Fluss's too), ``table.datalake.freshness``
(the default of tables without their own), ``coordinator.producer-offsets.ttl``,
``auto-partition.check.interval`` and ``kv.leader-replica.memory-reserved`` (Fluss's too). The dynamic
values live in one document of the metadata store: the active coordinator applies a change at once, a
cluster's other servers within a second (``strom.server.cluster_node``), and every server starts with them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from strom.config import ALL_OPTIONS, DYNAMIC_OPTIONS, DynamicConfig
from strom.errors import InvalidConfigError
from strom.metadata.off_loop import off_loop
from strom.metadata.store import MetadataStore
from strom.rpc.messages import pb
from strom.table_properties import AUTO_PARTITION_KEY

log = logging.getLogger(__name__)

INITIAL_SERVER_CONFIG = "INITIAL_SERVER_CONFIG"
DYNAMIC_SERVER_CONFIG = "DYNAMIC_SERVER_CONFIG"
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
SECRET_WORDS = ("password", "secret", "key", "credential", "token", "jaas")
"""A key containing one of these is described without its value."""
_NOT_SECRET = (AUTO_PARTITION_KEY,)


def is_secret(key: str) -> bool:
    lowered = key.lower()
    return key not in _NOT_SECRET and any(word in lowered for word in SECRET_WORDS)


def stored_dynamic(store: MetadataStore) -> dict[str, str]:
    """The dynamic values the store holds that this server accepts; a key or value it does not (one
    written by another version) is logged and left out."""
    accepted = {}
    for key, value in DynamicConfig.decode(store.get_cluster_configs()).items():
        try:
            if key not in DYNAMIC_OPTIONS:
                raise ValueError("not a dynamic option here")
            ALL_OPTIONS[key].parse(value)
        except (TypeError, ValueError) as exc:
            log.warning("ignoring stored cluster config %s=%r: %s", key, value, exc)
            continue
        accepted[key] = value
    return accepted


class ClusterConfigService:
    """Served by the active coordinator."""

    def __init__(
        self, store: MetadataStore, dynamic: DynamicConfig, settled: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``settled``: awaited after a change was applied, until what the change started has finished
        (lake tables rescheduled with a new default freshness), before the request is answered."""
        self._store = store
        self._dynamic = dynamic
        self._settled = settled
        self._changing = asyncio.Lock()

    def describe_cluster_configs(self, _request: Any, _context: object) -> Any:
        response = pb.DescribeClusterConfigsResponse()
        dynamic = self._dynamic.dynamic
        entries = [(key, str(value), INITIAL_SERVER_CONFIG) for key, value in self._dynamic.initial.to_dict().items()
                   if key not in dynamic]
        entries += [(key, value, DYNAMIC_SERVER_CONFIG) for key, value in dynamic.items()]
        for key, value, source in sorted(entries):
            entry = response.configs.add(config_key=key, config_source=source)
            if not is_secret(key):
                entry.config_value = value
        return response

    async def alter_cluster_configs(self, request: Any, _context: object) -> Any:
        """Raises InvalidConfigError (nothing changed) for a key that cannot change at run time, a value
        that does not parse, a SET without a value, or APPEND/SUBTRACT."""
        if not request.alter_configs:
            return pb.AlterClusterConfigsResponse()
        async with self._changing:  # each change applies to what the one before it stored
            return await self._alter(request)

    async def _alter(self, request: Any) -> Any:
        values = dict(self._dynamic.dynamic)
        for change in request.alter_configs:
            key = change.config_key
            if key not in DYNAMIC_OPTIONS:
                raise InvalidConfigError(
                    f"The config key {key} is not allowed to be changed dynamically. Keys that can: "
                    f"{', '.join(sorted(DYNAMIC_OPTIONS))}."
                )
            if change.op_type == OP_SET:
                if not change.HasField("config_value"):
                    raise InvalidConfigError(f"Setting '{key}' needs a value.")
                try:
                    ALL_OPTIONS[key].parse(change.config_value)
                except (TypeError, ValueError) as exc:
                    raise InvalidConfigError(f"Invalid value for config '{key}': {exc}") from None
                values[key] = change.config_value
            elif change.op_type == OP_DELETE:
                values.pop(key, None)
            elif change.op_type in (OP_APPEND, OP_SUBTRACT):
                raise InvalidConfigError(f"'{key}' is not a list: APPEND and SUBTRACT do not apply to it.")
            else:
                raise InvalidConfigError(f"Unsupported config operation type {change.op_type}.")
        if values != self._dynamic.dynamic:
            # persisted first: applied only if stored
            await off_loop(self._store.put_cluster_configs, DynamicConfig.encode(values))
            self._dynamic.set_dynamic(values)
            if self._settled is not None:
                await self._settled()
            log.info("cluster configs changed: %s", {k: v for k, v in values.items() if not is_secret(k)})
        return pb.AlterClusterConfigsResponse()


__all__ = ["ClusterConfigService", "is_secret", "stored_dynamic"]
