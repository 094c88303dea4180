"""Cluster metadata in ZooKeeper (through kazoo), behind the same contract as the SQLite store.

Location: ``host:port[,host:port...][/root]``; the root defaults to ``/fluss`` (Fluss's
``zookeeper.path.root``). Node layout under the root, Fluss's paths where Fluss has the node::

    /metadata/databases/<db>                            {"created_ms","modified_ms"} + database_json
    /metadata/databases/<db>/tables/<table>             {"table_id","schema_id","created_ms","modified_ms"} + table_json
    /metadata/databases/<db>/tables/<table>/partitions/<partition>   {"partition_id","spec","created_ms"}
    /metadata/table_seqid, /metadata/partition_seqid, /metadata/writer_id   id counters (the next value)
    /metadata/sequences/<name>                          every other counter (per-bucket snapshot ids)
    /tabletservers/tables/<table_id>                    {"database","table"}: the table id's path
    /tabletservers/tables/<table_id>/schemas/<schema_id>   the table document a schema change replaced
    /tabletservers/tables/<table_id>/assignment         {"<bucket>": <server id>, ...}: each bucket's leader
    /tabletservers/tables/<table_id>/buckets/<b>/snapshots/<snapshot_id>       a KV snapshot's document
    /tabletservers/tables/<table_id>/laketable/<snapshot_id>-<commit seq>      {"readable"} + lake snapshot
    /tabletservers/partitions/<partition_id>            {"table_id","database","table","partition"}
    /tabletservers/partitions/<partition_id>/buckets/<b>/snapshots/<snapshot_id>
    /tabletservers/partitions/<partition_id>/assignment {"<bucket>": <server id>, ...}: each bucket's leader
    /leases/kv_snapshot/<lease_id>                      the lease's compact encoding
    /lake/tiering/<table_id>                            the table's lake tiering state
    /producers/<producer_id>                            a producer's registered offsets and their expiry
    /config/cluster                                     the settings AlterClusterConfigs changed at run time
    /fluss-acls/<resource type code>/<resource name>    {"acls":[[principal type, name, host, op, permission]]}

A node's value is a one-line JSON header, a newline, then the raw payload (:mod:`strom.zk.documents`);
names are percent-encoded so any database, table, partition or lease name is one node name.

Every method that changes several nodes does so in one ZooKeeper multi-op transaction, built from what it
has just read and guarded by version checks; when another client got there first the transaction fails
as a whole and the method reads again and re-decides (bounded by CONFLICT_ATTEMPTS_MAX). Counters are
bumped with a version check, so an id is handed out once. A lost connection or an expired session is
waited out (kazoo reconnects, with a new session if needed) for at most ``operation_timeout_ms``; creations
carry a nonce so a create retried after its reply was lost returns the record it made instead of
"already exists". The store keeps no ephemeral nodes and no watches, so a new session loses nothing.

The store is thread-safe (kazoo's client is); its calls block for one or a few ZooKeeper round trips, so a
coroutine makes them through :func:`strom.metadata.off_loop.off_loop` (a store thread), never on its loop.

This module composes the store from one module per concern, each implementing its interfaces of
:mod:`strom.metadata.store` over the shared session and retry plumbing of :mod:`strom.zk.session`:
:mod:`~strom.zk.catalog_store` (databases, tables, partitions), :mod:`~strom.zk.bucket_store` (bucket
leaders, remote log manifests, sequences, KV snapshot records), :mod:`~strom.zk.value_stores` (leases,
producer offsets, cluster configs, rebalance, lake tiering states), :mod:`~strom.zk.lake_store` (lake
snapshots) and :mod:`~strom.zk.acl_store` (ACLs).
"""

from __future__ import annotations

# kazoo's client, imported here itself: without it (the strom[zookeeper] extra not installed) importing this
# module fails, which open_store reports as NotInstalledError, even if the concern modules were loaded before.
import kazoo.client  # noqa: F401

from strom.metadata.store import AclRecord, MetadataStore
from strom.zk.acl_store import ZooKeeperAclStore
from strom.zk.bucket_store import ZooKeeperBucketStore
from strom.zk.catalog_store import ZooKeeperCatalogStore
from strom.zk.lake_store import ZooKeeperLakeStore

# Re-exported for the tests, benches and tools that import them from here; strom's own modules import
# them from strom.zk.session.
from strom.zk.session import (
    TRANSACTION_DELETES_MAX,
    VALUE_SIZE_BYTES_MAX,
    MetadataValueTooLargeError,
    connect_kazoo,
    parse_location,
)
from strom.zk.value_stores import ZooKeeperValueStores


class ZooKeeperMetadataStore(
    ZooKeeperCatalogStore, ZooKeeperBucketStore, ZooKeeperValueStores, ZooKeeperLakeStore, ZooKeeperAclStore,
    MetadataStore,
):
    """Metadata under one root of a ZooKeeper ensemble. Several stores (processes) may share a root.

    Opened with ``location`` (``host:port[,host:port...][/root]``), the session, operation and connect
    timeouts, and ``login`` (the identity to act as, and TLS: :func:`~strom.zk.session.connect_kazoo`)."""


__all__ = [
    "TRANSACTION_DELETES_MAX",
    "VALUE_SIZE_BYTES_MAX",
    "AclRecord",
    "MetadataValueTooLargeError",
    "ZooKeeperMetadataStore",
    "connect_kazoo",
    "parse_location",
]
