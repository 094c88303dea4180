"""The ZooKeeper metadata store's simple concerns: opaque values its callers encode, one node each, read and
written whole (the :class:`~strom.metadata.store.LeaseStore`, :class:`~strom.metadata.store.ProducerOffsetStore`,
:class:`~strom.metadata.store.ClusterConfigStore`, :class:`~strom.metadata.store.RebalanceStore` and
:class:`~strom.metadata.store.LakeTieringStateStore` contracts).

None of them needs a transaction: each call creates, replaces or deletes one node (:meth:`_put`, :meth:`_delete`
of :class:`~strom.zk.session.ZooKeeperSession`), or lists one parent's children.
"""

from __future__ import annotations

from urllib.parse import unquote

from kazoo.exceptions import NodeExistsError

from strom.metadata.store import (
    ClusterConfigStore,
    LakeTieringStateStore,
    LeaseStore,
    ProducerOffsetStore,
    RebalanceStore,
)
from strom.zk.documents import escape
from strom.zk.session import ZooKeeperSession, check_value_size


class ZooKeeperValueStores(
    ZooKeeperSession, LeaseStore, ProducerOffsetStore, ClusterConfigStore, RebalanceStore, LakeTieringStateStore
):
    """Leases, producer offsets, cluster configs, rebalance state and lake tiering states in ZooKeeper."""

    # ---- leases ----
    def put_lease(self, lease_id: str, payload: bytes) -> None:
        self._put(self._path(f"/leases/kv_snapshot/{escape(lease_id)}"), payload)

    def delete_lease(self, lease_id: str) -> None:
        self._delete(self._path(f"/leases/kv_snapshot/{escape(lease_id)}"))

    def list_leases(self) -> dict[str, bytes]:
        return self._run(lambda: self._values_of(self._path("/leases/kv_snapshot")))

    # ---- producer offsets ----
    def _producer_path(self, producer_id: str) -> str:
        return self._path(f"/producers/{escape(producer_id)}")

    def create_producer_offsets(self, producer_id: str, payload: bytes) -> bool:
        path = self._producer_path(producer_id)
        check_value_size(path, payload)

        def create() -> bool:
            try:
                self._client.create(path, payload)
            except NodeExistsError:
                return False
            return True

        return self._run(create)

    def get_producer_offsets(self, producer_id: str) -> bytes | None:
        return self._value(self._producer_path(producer_id))

    def delete_producer_offsets(self, producer_id: str) -> None:
        self._delete(self._producer_path(producer_id))

    def list_producer_ids(self) -> list[str]:
        return sorted(unquote(name) for name in self._run(lambda: self._children(self._path("/producers"))))

    # ---- cluster configs ----
    def get_cluster_configs(self) -> bytes | None:
        return self._value(self._path("/config/cluster"))

    def put_cluster_configs(self, payload: bytes) -> None:
        self._put(self._path("/config/cluster"), payload)

    # ---- rebalance (Fluss's nodes) ----
    def get_server_tags(self) -> bytes | None:
        return self._value(self._path("/tabletservers/server_tags"))

    def put_server_tags(self, payload: bytes) -> None:
        self._put(self._path("/tabletservers/server_tags"), payload)

    def get_rebalance_task(self) -> bytes | None:
        return self._value(self._path("/cluster/rebalance"))

    def put_rebalance_task(self, payload: bytes) -> None:
        self._put(self._path("/cluster/rebalance"), payload)

    # ---- lake tiering state ----
    def put_lake_tiering_state(self, table_id: int, payload: bytes) -> None:
        self._put(self._path(f"/lake/tiering/{table_id}"), payload)

    def delete_lake_tiering_state(self, table_id: int) -> None:
        self._delete(self._path(f"/lake/tiering/{table_id}"))

    def list_lake_tiering_states(self) -> dict[int, bytes]:
        values = self._run(lambda: self._values_of(self._path("/lake/tiering")))
        return {int(name): value for name, value in values.items()}
