"""The bytes of the ZooKeeper metadata store's nodes: node names and the JSON documents the nodes hold.

Kept apart from the store's ZooKeeper calls, as Fluss keeps its ZooKeeper JSON serdes in classes of their
own: what one node holds is read and written here, in one place per kind of node, while the store modules
decide which nodes to read and change. No ZooKeeper call is made here.

A node's value is a one-line JSON header (keys sorted, no spaces), a newline, then the raw payload; names
are percent-encoded so any database, table, partition, lease or producer name is one node name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from strom.metadata.store import DatabaseRecord, LakeSnapshotRecord, PartitionRecord, TableRecord

AclEntry = tuple[str, str, str, int, int]
"""(principal type, principal name, host, operation, permission) of one ACL of a resource."""


def escape(name: str) -> str:
    """``name`` as one node name (percent-encoded; "." and ".." encoded too)."""
    escaped = quote(name, safe="")
    return escaped.replace(".", "%2E") if escaped in (".", "..") else escaped


def pack(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """A node's value: ``header`` as one line of JSON, a newline, then ``payload``."""
    return json.dumps(header, separators=(",", ":"), sort_keys=True).encode() + b"\n" + payload


def unpack(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, payload) of a value written by :func:`pack`."""
    line, _, payload = data.partition(b"\n")
    header = json.loads(line) if line else {}
    assert isinstance(header, dict), "a metadata node's header is a JSON object"
    return header, payload


def nonce_of(data: bytes) -> Any:
    """The nonce a create wrote into the node's header (None when it carries none)."""
    return unpack(data)[0].get("nonce")


# ---- /metadata/databases/<db> ----
def database_value(created_ms: int, modified_ms: int, database_json: bytes, nonce: str | None = None) -> bytes:
    header: dict[str, Any] = {"created_ms": created_ms, "modified_ms": modified_ms}
    if nonce is not None:
        header["nonce"] = nonce
    return pack(header, database_json)


def database_record(name: str, data: bytes) -> DatabaseRecord:
    header, payload = unpack(data)
    return DatabaseRecord(name, payload, int(header["created_ms"]), int(header["modified_ms"]))


# ---- /metadata/databases/<db>/tables/<table> ----
def table_value(
    table_id: int, schema_id: int, created_ms: int, modified_ms: int, table_json: bytes, nonce: str | None = None
) -> bytes:
    header: dict[str, Any] = {
        "table_id": table_id,
        "schema_id": schema_id,
        "created_ms": created_ms,
        "modified_ms": modified_ms,
    }
    if nonce is not None:
        header["nonce"] = nonce
    return pack(header, table_json)


def table_record(database: str, name: str, data: bytes) -> TableRecord:
    header, payload = unpack(data)
    return TableRecord(
        int(header["table_id"]),
        database,
        name,
        payload,
        int(header["schema_id"]),
        int(header["created_ms"]),
        int(header["modified_ms"]),
    )


# ---- /tabletservers/tables/<table_id> ----
def table_id_value(database: str, table: str) -> bytes:
    """The table id's node: the path of the table it names."""
    return pack({"database": database, "table": table})


def table_location(data: bytes) -> tuple[str, str] | None:
    """(database, table) a table id's node names; None for a node without them (snapshots recorded ahead)."""
    header, _ = unpack(data)
    if "database" not in header:
        return None
    return str(header["database"]), str(header["table"])


# ---- /metadata/databases/<db>/tables/<table>/partitions/<partition> ----
def partition_value(partition_id: int, spec: tuple[tuple[str, str], ...], created_ms: int, nonce: str) -> bytes:
    return pack({
        "partition_id": partition_id,
        "spec": [list(pair) for pair in spec],
        "created_ms": created_ms,
        "nonce": nonce,
    })


def partition_record(table_id: int, name: str, data: bytes) -> PartitionRecord:
    header, _ = unpack(data)
    spec = tuple((str(key), str(value)) for key, value in header["spec"])
    return PartitionRecord(int(header["partition_id"]), table_id, name, spec, int(header["created_ms"]))


# ---- /tabletservers/partitions/<partition_id> ----
def partition_owner_value(table_id: int) -> bytes:
    """A partition id's node made before (or without) its registration: it names only its table."""
    return pack({"table_id": table_id})


def partition_id_value(table_id: int, database: str, table: str, partition: str) -> bytes:
    """A registered partition id's node: its table, and the path of its registration."""
    return pack({"table_id": table_id, "database": database, "table": table, "partition": partition})


def partition_location(data: bytes) -> tuple[int, Any, Any, Any] | None:
    """(table id, database, table, partition) a partition id's node names; None when it names only its
    table."""
    header, _ = unpack(data)
    if "partition" not in header:
        return None
    return int(header["table_id"]), header["database"], header["table"], header["partition"]


# ---- /tabletservers/{tables/<table_id>,partitions/<partition_id>}/assignment ----
def assignment_value(leaders: Mapping[int, int]) -> bytes:
    return pack({str(bucket): int(server) for bucket, server in leaders.items()})


def assignment_of(data: bytes) -> dict[int, int]:
    """Each bucket's leader."""
    header, _ = unpack(data)
    return {int(bucket): int(server) for bucket, server in header.items()}


# ---- /tabletservers/tables/<table_id>/laketable/<snapshot id>-<commit seq> ----
def lake_value(record: LakeSnapshotRecord) -> bytes:
    return pack({"readable": record.readable}, record.snapshot_json)


def lake_record(table_id: int, snapshot_id: int, data: bytes) -> LakeSnapshotRecord:
    header, payload = unpack(data)
    return LakeSnapshotRecord(table_id, snapshot_id, bool(header["readable"]), payload)


def lake_children_by_commit(names: list[str]) -> list[tuple[int, str]]:
    """(snapshot id, node name) oldest commit first."""
    parsed = [(int(name.rsplit("-", 1)[1]), int(name.rsplit("-", 1)[0]), name) for name in names]
    return [(snapshot_id, name) for _, snapshot_id, name in sorted(parsed)]


# ---- /fluss-acls/<resource type code>/<resource name> ----
def acl_value(entries: set[AclEntry]) -> bytes:
    return pack({"acls": sorted(list(entry) for entry in entries)})


def acl_entries(data: bytes) -> set[AclEntry]:
    header, _ = unpack(data)
    return {(str(a), str(b), str(c), int(d), int(e)) for a, b, c, d, e in header["acls"]}
