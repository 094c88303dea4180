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

A node's value is a one-line JSON header, a newline, then the raw payload (``_pack``/``_unpack``); names
are percent-encoded so any database, table, partition or lease name is one node name.

Every method that changes several nodes does so in one ZooKeeper multi-op transaction, built from what it
has just read and guarded by version checks; when another client got there first the transaction fails
as a whole and the method reads again and re-decides (bounded by CONFLICT_ATTEMPTS_MAX). Counters are
bumped with a version check, so an id is handed out once. A lost connection or an expired session is
waited out (kazoo reconnects, with a new session if needed) for at most ``operation_timeout_ms``; creations
carry a nonce so a create retried after its reply was lost returns the record it made instead of
"already exists". The store keeps no ephemeral nodes and no watches, so a new session loses nothing.

The store is thread-safe (kazoo's client is); its calls block for one or a few ZooKeeper round trips.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar
from urllib.parse import quote, unquote

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.security import ACL, make_digest_acl

from strom.errors import (
    DatabaseAlreadyExistError,
    DatabaseNotEmptyError,
    DatabaseNotExistError,
    InvalidAlterTableError,
    InvalidConfigError,
    PartitionAlreadyExistsError,
    StorageError,
    TableAlreadyExistError,
    TableNotExistError,
    UnknownServerError,
)
from strom.metadata.store import (
    AclRecord,
    DatabaseRecord,
    KvSnapshotRecord,
    LakeSnapshotRecord,
    MetadataStore,
    PartitionRecord,
    TableRecord,
)
from strom.zk.login import ZooKeeperLogin

T = TypeVar("T")

ROOT_DEFAULT = "/fluss"
# ZooKeeper refuses a request larger than jute.maxbuffer (1 MiB - 1 by default) by closing the connection,
# which a client would see as an endless connection loss: values and transactions are checked here first.
VALUE_SIZE_BYTES_MAX = 512 * 1024
TRANSACTION_SIZE_BYTES_MAX = 900 * 1024
# Per operation in a multi-op request: its header, version and the path's length prefix.
TRANSACTION_OP_OVERHEAD_BYTES = 64
assert VALUE_SIZE_BYTES_MAX + 2 * TRANSACTION_OP_OVERHEAD_BYTES < TRANSACTION_SIZE_BYTES_MAX < (1 << 20) - 1
# How many deletes one transaction of drop_table/drop_partition carries; a larger tree is emptied in
# chunks, children first and the registration last, so the table stays whole until its final transaction.
TRANSACTION_DELETES_MAX = 2_000
CONFLICT_ATTEMPTS_MAX = 50
SESSION_TIMEOUT_MS_DEFAULT = 10_000
OPERATION_TIMEOUT_MS_DEFAULT = 30_000
CONNECT_TIMEOUT_MS_DEFAULT = 15_000
_RECONNECT_POLL_MS = 20

_SEQUENCE_PATHS = {
    "table": "/metadata/table_seqid",
    "partition": "/metadata/partition_seqid",
    "writer": "/metadata/writer_id",
}
_CONTAINERS = (
    "/metadata/databases",
    "/metadata/sequences",
    "/tabletservers/tables",
    "/tabletservers/partitions",
    "/leases/kv_snapshot",
    "/lake/tiering",
    "/producers",
    "/config",
    "/cluster",
    "/fluss-acls",
)


class MetadataValueTooLargeError(UnknownServerError):
    """A metadata value (or one transaction) would exceed what ZooKeeper accepts in one request."""


class _Conflict(Exception):
    """A transaction failed because another client changed what it read: read again and re-decide."""


def connect_kazoo(hosts: str, session_timeout_ms: int, connect_timeout_ms: int = CONNECT_TIMEOUT_MS_DEFAULT,
                  login: ZooKeeperLogin | None = None) -> KazooClient:
    """A started ZooKeeper client that reconnects forever in the background (with a new session after an
    expiry). Raises StorageError when ZooKeeper cannot be reached within ``connect_timeout_ms``.

    ``login.digest`` (``user:password``, ``zookeeper.auth.digest``): the client authenticates with
    ZooKeeper's digest scheme (again on every new session) and creates every node readable and writable by
    that identity alone, the world getting no right at all (ACLs and registrations are secrets).
    ``login.tls``: it speaks TLS to ZooKeeper's secure port and checks ZooKeeper's certificate."""
    login = login or ZooKeeperLogin()
    options: dict[str, object] = dict(login.tls_options())
    if login.digest:
        options.update(auth_data=[("digest", login.digest)], default_acl=[digest_acl(login.digest)])
    client = KazooClient(
        hosts=hosts,
        timeout=session_timeout_ms / 1000,
        connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 1.0},
        **options,  # type: ignore[arg-type]
    )
    try:
        client.start(timeout=connect_timeout_ms / 1000)
    except Exception as exc:
        client.close()
        raise StorageError(f"cannot connect to ZooKeeper at {hosts}: {exc}") from exc
    return client


def digest_acl(digest: str) -> ACL:
    """All rights to the digest identity ``user:password``, none to anyone else.

    Raises:
        InvalidConfigError: not ``user:password``.
    """
    user, sep, password = digest.partition(":")
    if not sep or not user or not password:
        raise InvalidConfigError("zookeeper.auth.digest is user:password")
    return make_digest_acl(user, password, all=True)


def secure_tree(client: KazooClient, root: str, digest: str) -> int:
    """Give every node under ``root`` (``root`` included) the ACL of :func:`digest_acl`: a tree created
    before ``zookeeper.auth.digest`` was set (its nodes open to the world) closed to strangers. ``client``
    must have authenticated as ``digest``. Returns how many nodes it changed."""
    acl = [digest_acl(digest)]
    changed = 0
    pending = [root]
    while pending:
        path = pending.pop()
        try:
            children = client.get_children(path)
            client.set_acls(path, acl)
        except NoNodeError:
            continue  # gone meanwhile (an ephemeral registration)
        changed += 1
        pending += [f"{path.rstrip('/')}/{child}" for child in children]
    return changed


def parse_location(location: str) -> tuple[str, str]:
    """``host:port[,host:port][/root]`` → (hosts, root); the root defaults to ``/fluss``."""
    hosts, slash, root = location.partition("/")
    if not hosts:
        raise ValueError(f"a ZooKeeper location is host:port[/root], got {location!r}")
    root = ("/" + root.strip("/")) if slash and root.strip("/") else ROOT_DEFAULT
    return hosts, root


def _escape(name: str) -> str:
    escaped = quote(name, safe="")
    return escaped.replace(".", "%2E") if escaped in (".", "..") else escaped


def _pack(header: dict[str, Any], payload: bytes = b"") -> bytes:
    return json.dumps(header, separators=(",", ":"), sort_keys=True).encode() + b"\n" + payload


def _unpack(data: bytes) -> tuple[dict[str, Any], bytes]:
    line, _, payload = data.partition(b"\n")
    header = json.loads(line) if line else {}
    assert isinstance(header, dict), "a metadata node's header is a JSON object"
    return header, payload


def _check_value_size(path: str, value: bytes) -> None:
    if len(value) > VALUE_SIZE_BYTES_MAX:
        raise MetadataValueTooLargeError(
            f"metadata value of {len(value)} bytes at {path} exceeds {VALUE_SIZE_BYTES_MAX} bytes"
        )


class _Transaction:
    """A multi-op request that checks its own size before it is sent."""

    def __init__(self, client: KazooClient) -> None:
        self._request = client.transaction()
        self._size_bytes = 0
        self.op_count = 0

    def _add(self, path: str, value: bytes = b"") -> None:
        _check_value_size(path, value)
        self._size_bytes += len(path) + len(value) + TRANSACTION_OP_OVERHEAD_BYTES
        self.op_count += 1

    def create(self, path: str, value: bytes = b"", sequence: bool = False) -> None:
        self._add(path, value)
        self._request.create(path, value, sequence=sequence)

    def set_data(self, path: str, value: bytes, version: int) -> None:
        self._add(path, value)
        self._request.set_data(path, value, version=version)

    def delete(self, path: str, version: int = -1) -> None:
        self._add(path)
        self._request.delete(path, version=version)

    def check(self, path: str, version: int) -> None:
        """``version`` -1 checks only that the node exists."""
        self._add(path)
        self._request.check(path, version)

    def commit(self) -> list[Any]:
        """Apply every op or none; raises _Conflict when ZooKeeper refused the transaction."""
        if self._size_bytes > TRANSACTION_SIZE_BYTES_MAX:
            raise MetadataValueTooLargeError(
                f"a metadata transaction of {self._size_bytes} bytes exceeds {TRANSACTION_SIZE_BYTES_MAX} bytes"
            )
        if self.op_count == 0:
            return []
        results = self._request.commit()
        if any(isinstance(result, Exception) for result in results):
            raise _Conflict(results)
        return list(results)


class ZooKeeperMetadataStore(MetadataStore):
    """Metadata under one root of a ZooKeeper ensemble. Several stores (processes) may share a root."""

    def __init__(
        self,
        location: str,
        session_timeout_ms: int = SESSION_TIMEOUT_MS_DEFAULT,
        operation_timeout_ms: int = OPERATION_TIMEOUT_MS_DEFAULT,
        connect_timeout_ms: int = CONNECT_TIMEOUT_MS_DEFAULT,
        login: ZooKeeperLogin | None = None,
    ) -> None:
        """``login``: the identity to act as, and TLS (:func:`connect_kazoo`)."""
        assert session_timeout_ms > 0
        assert operation_timeout_ms > 0
        self._hosts, self._root = parse_location(location)
        self._operation_timeout_ms = operation_timeout_ms
        self._closed = False
        # reconnects forever in the background; each call bounds its own wait (operation_timeout_ms)
        self._client = connect_kazoo(self._hosts, session_timeout_ms, connect_timeout_ms, login)
        try:
            self._run(self._create_containers)
        except BaseException:
            self.close()
            raise

    # ---- paths ----
    def _path(self, relative: str) -> str:
        return self._root + relative

    def _database_path(self, database: str) -> str:
        return self._path(f"/metadata/databases/{_escape(database)}")

    def _table_path(self, database: str, name: str) -> str:
        return f"{self._database_path(database)}/tables/{_escape(name)}"

    def _table_id_path(self, table_id: int) -> str:
        return self._path(f"/tabletservers/tables/{table_id}")

    def _partition_id_path(self, partition_id: int) -> str:
        return self._path(f"/tabletservers/partitions/{partition_id}")

    def _owner_path(self, table_id: int, partition_id: int | None) -> str:
        """The node a table's (or one partition's) buckets hang under."""
        return self._table_id_path(table_id) if partition_id is None else self._partition_id_path(partition_id)

    def _bucket_snapshots_path(self, table_id: int, partition_id: int | None, bucket: int) -> str:
        return f"{self._owner_path(table_id, partition_id)}/buckets/{bucket}/snapshots"

    def _remote_logs_path(self, table_id: int, partition_id: int | None, bucket: int) -> str:
        """Fluss's node of a bucket's remote log manifest handle."""
        return f"{self._owner_path(table_id, partition_id)}/buckets/{bucket}/remote_logs"

    def _assignment_path(self, table_id: int, partition_id: int | None) -> str:
        return f"{self._owner_path(table_id, partition_id)}/assignment"

    def _sequence_path(self, sequence: str) -> str:
        return self._path(_SEQUENCE_PATHS.get(sequence) or f"/metadata/sequences/{_escape(sequence)}")

    def _create_containers(self) -> None:
        for container in _CONTAINERS:
            self._client.ensure_path(self._path(container))

    # ---- plumbing ----
    def _run(self, operation: Callable[[], T]) -> T:
        """Run ``operation`` until it completes: again after a conflict, after a reconnect on a lost
        connection or session, until operation_timeout_ms has passed.

        Raises:
            StorageError: ZooKeeper stayed unreachable, or the contention did not end.
        """
        deadline = time.monotonic() + self._operation_timeout_ms / 1000
        conflicts = 0
        while True:
            try:
                return operation()
            except _Conflict:
                conflicts += 1
                if conflicts >= CONFLICT_ATTEMPTS_MAX:
                    raise StorageError(f"metadata kept changing under {conflicts} attempts; try again") from None
            except (ConnectionLoss, SessionExpiredError, OperationTimeoutError) as exc:
                self._await_connection(deadline, exc)

    def _await_connection(self, deadline: float, cause: Exception) -> None:
        while self._client.state != KazooState.CONNECTED or not self._client.connected:
            if self._closed:  # no reconnect will come: fail now, not after operation_timeout_ms (a stopping
                # server's thread still reading would hold its exit that long)
                raise StorageError(f"the metadata store of ZooKeeper {self._hosts} is closed") from cause
            if time.monotonic() >= deadline:
                raise StorageError(f"ZooKeeper at {self._hosts} unreachable: {cause!r}") from cause
            time.sleep(_RECONNECT_POLL_MS / 1000)
        if time.monotonic() >= deadline:
            raise StorageError(f"ZooKeeper at {self._hosts} kept failing: {cause!r}") from cause
        time.sleep(_RECONNECT_POLL_MS / 1000)  # connected, yet the call failed: do not spin

    def _get(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        try:
            data, stat = self._client.get(path)
        except NoNodeError:
            return None
        return bytes(data), stat

    def _value(self, path: str) -> bytes | None:
        """One node's payload, None if the node does not exist."""
        found = self._run(lambda: self._get(path))
        return None if found is None else found[0]

    def _children(self, path: str) -> list[str]:
        try:
            return list(self._client.get_children(path))
        except NoNodeError:
            return []

    def _get_many(self, paths: list[str]) -> list[bytes | None]:
        """Values of many nodes in one pipelined round (None for a node deleted meanwhile)."""
        pending = [self._client.get_async(path) for path in paths]
        values: list[bytes | None] = []
        for result in pending:
            try:
                data, _stat = result.get()
            except NoNodeError:
                values.append(None)
            else:
                values.append(bytes(data))
        return values

    def _children_many(self, paths: list[str]) -> list[list[str]]:
        pending = [self._client.get_children_async(path) for path in paths]
        children: list[list[str]] = []
        for result in pending:
            try:
                children.append(list(result.get()))
            except NoNodeError:
                children.append([])
        return children

    def _subtrees_deepest_first(self, roots: list[str]) -> list[str]:
        """Every existing node of the trees under ``roots``, a node's children before the node."""
        levels: list[list[str]] = []
        level = [root for root, found in zip(roots, self._exists_many(roots), strict=True) if found]
        while level:
            levels.append(level)
            children = self._children_many(level)
            level = [f"{parent}/{child}" for parent, names in zip(level, children, strict=True) for child in names]
        return [path for nodes in reversed(levels) for path in nodes]

    def _exists_many(self, paths: list[str]) -> list[bool]:
        pending = [self._client.exists_async(path) for path in paths]
        return [result.get() is not None for result in pending]

    def _put(self, path: str, value: bytes) -> None:
        """Create or replace one node's value (its parent exists)."""
        _check_value_size(path, value)

        def put() -> None:
            try:
                self._client.set(path, value)
            except NoNodeError:
                try:
                    self._client.create(path, value)
                except NodeExistsError:
                    raise _Conflict(path) from None

        self._run(put)

    def _delete(self, path: str) -> None:
        def delete() -> None:
            with contextlib.suppress(NoNodeError):
                self._client.delete(path)

        self._run(delete)

    def _delete_tree_in_transactions(self, roots: list[str], last: list[str]) -> None:
        """Delete the trees under ``roots`` and ``last`` (children first), atomically when they fit one
        transaction; a larger set goes in chunks of TRANSACTION_DELETES_MAX, the nodes below ``roots``
        first, so the roots and ``last`` (the registrations) all go in the final transaction."""
        below_roots = self._subtrees_deepest_first(roots)
        root_set = set(roots)
        nodes = [path for path in below_roots if path not in root_set]
        final = [path for path in below_roots if path in root_set] + self._subtrees_deepest_first(last)
        while len(nodes) + len(final) > TRANSACTION_DELETES_MAX:
            chunk, nodes = nodes[:TRANSACTION_DELETES_MAX], nodes[TRANSACTION_DELETES_MAX:]
            transaction = _Transaction(self._client)
            for path in chunk:
                transaction.delete(path)
            transaction.commit()
        transaction = _Transaction(self._client)
        for path in [*nodes, *final]:
            transaction.delete(path)
        transaction.commit()

    def _next_value(self, transaction: _Transaction, sequence: str, count: int = 1) -> int:
        """Read counter ``sequence`` and add its version-checked bump by ``count`` to ``transaction``."""
        path = self._sequence_path(sequence)
        found = self._get(path)
        if found is None:
            transaction.create(path, str(count).encode())
            return 0
        data, stat = found
        value = int(data)
        assert value >= 0, f"counter {path} holds {value}"
        transaction.set_data(path, str(value + count).encode(), stat.version)
        return value

    # ---- databases ----
    def create_database(self, record: DatabaseRecord) -> None:
        nonce = uuid.uuid4().hex
        path = self._database_path(record.name)
        header = {"created_ms": record.created_ms, "modified_ms": record.modified_ms, "nonce": nonce}

        def create() -> None:
            found = self._get(path)
            if found is not None:
                if _unpack(found[0])[0].get("nonce") == nonce:
                    return  # our own create, whose reply a lost connection swallowed
                raise DatabaseAlreadyExistError(f"Database {record.name} already exists.")
            transaction = _Transaction(self._client)
            transaction.create(path, _pack(header, record.database_json))
            transaction.create(f"{path}/tables")
            transaction.commit()

        self._run(create)

    def get_database(self, name: str) -> DatabaseRecord | None:
        found = self._run(lambda: self._get(self._database_path(name)))
        if found is None:
            return None
        header, payload = _unpack(found[0])
        return DatabaseRecord(name, payload, int(header["created_ms"]), int(header["modified_ms"]))

    def list_databases(self) -> list[str]:
        names = self._run(lambda: self._children(self._path("/metadata/databases")))
        return sorted(unquote(name) for name in names)

    def update_database(self, name: str, database_json: bytes, now_ms: int) -> DatabaseRecord:
        path = self._database_path(name)

        def update() -> DatabaseRecord:
            found = self._get(path)
            if found is None:
                raise DatabaseNotExistError(f"Database {name} does not exist.")
            header, _ = _unpack(found[0])
            created_ms = int(header["created_ms"])
            value = _pack({"created_ms": created_ms, "modified_ms": now_ms}, database_json)
            _check_value_size(path, value)
            try:
                self._client.set(path, value, version=found[1].version)
            except (BadVersionError, NoNodeError):
                raise _Conflict(name) from None
            return DatabaseRecord(name, database_json, created_ms, now_ms)

        return self._run(update)

    def drop_database(self, name: str) -> None:
        path = self._database_path(name)

        def drop() -> None:
            if self._get(path) is None:
                return
            if self._children(f"{path}/tables"):
                raise DatabaseNotEmptyError(f"Database {name} still has tables.")
            transaction = _Transaction(self._client)
            if self._client.exists(f"{path}/tables") is not None:
                transaction.delete(f"{path}/tables")
            transaction.delete(path)
            transaction.commit()

        self._run(drop)

    # ---- tables ----
    def create_table(self, database: str, name: str, table_json: bytes, schema_id: int, now_ms: int) -> TableRecord:
        nonce = uuid.uuid4().hex
        path = self._table_path(database, name)

        def create() -> TableRecord:
            if self._get(self._database_path(database)) is None:
                raise DatabaseNotExistError(f"Database {database} does not exist.")
            found = self._get(path)
            if found is not None:
                if _unpack(found[0])[0].get("nonce") == nonce:
                    return self._table_record(database, name, found[0])
                raise TableAlreadyExistError(f"Table {database}.{name} already exists.")
            transaction = _Transaction(self._client)
            table_id = self._next_value(transaction, "table")
            header = {
                "table_id": table_id,
                "schema_id": schema_id,
                "created_ms": now_ms,
                "modified_ms": now_ms,
                "nonce": nonce,
            }
            transaction.check(self._database_path(database), -1)
            transaction.create(path, _pack(header, table_json))
            transaction.create(f"{path}/partitions")
            id_path = self._table_id_path(table_id)
            id_value = _pack({"database": database, "table": name})
            existing = self._get(id_path)  # a KV snapshot recorded ahead of its table (tests do)
            if existing is None:
                transaction.create(id_path, id_value)
            else:
                transaction.set_data(id_path, id_value, existing[1].version)
            transaction.commit()
            return TableRecord(table_id, database, name, table_json, schema_id, now_ms, now_ms)

        return self._run(create)

    @staticmethod
    def _table_record(database: str, name: str, data: bytes) -> TableRecord:
        header, payload = _unpack(data)
        return TableRecord(
            int(header["table_id"]),
            database,
            name,
            payload,
            int(header["schema_id"]),
            int(header["created_ms"]),
            int(header["modified_ms"]),
        )

    def get_table(self, database: str, name: str) -> TableRecord | None:
        found = self._run(lambda: self._get(self._table_path(database, name)))
        return None if found is None else self._table_record(database, name, found[0])

    def _table_location(self, table_id: int) -> tuple[str, str] | None:
        """(database, table) of a registered table id."""
        found = self._get(self._table_id_path(table_id))
        if found is None:
            return None
        header, _ = _unpack(found[0])
        if "database" not in header:
            return None
        return str(header["database"]), str(header["table"])

    def _get_table_by_id(self, table_id: int) -> tuple[TableRecord, ZnodeStat] | None:
        location = self._table_location(table_id)
        if location is None:
            return None
        found = self._get(self._table_path(*location))
        if found is None:
            return None
        record = self._table_record(*location, found[0])
        return (record, found[1]) if record.table_id == table_id else None

    def get_table_by_id(self, table_id: int) -> TableRecord | None:
        found = self._run(lambda: self._get_table_by_id(table_id))
        return None if found is None else found[0]

    def list_tables(self, database: str) -> list[str]:
        names = self._run(lambda: self._children(f"{self._database_path(database)}/tables"))
        return sorted(unquote(name) for name in names)

    def update_table(self, table_id: int, table_json: bytes, now_ms: int, schema_id: int | None = None) -> TableRecord:
        def update() -> TableRecord:
            found = self._get_table_by_id(table_id)
            if found is None:
                raise TableNotExistError(f"Table id {table_id} does not exist.")
            record, stat = found
            new_schema_id = record.schema_id if schema_id is None else schema_id
            header = {
                "table_id": table_id,
                "schema_id": new_schema_id,
                "created_ms": record.created_ms,
                "modified_ms": now_ms,
            }
            table_path = self._table_path(record.database, record.name)
            value = _pack(header, table_json)
            _check_value_size(table_path, value)
            transaction = _Transaction(self._client)
            transaction.set_data(table_path, value, stat.version)
            if new_schema_id != record.schema_id:
                if new_schema_id != record.schema_id + 1:
                    raise InvalidAlterTableError(
                        f"Table id {table_id} is at schema {record.schema_id}, not {new_schema_id - 1}: its schema "
                        "changed meanwhile; retry."
                    )
                schemas = f"{self._table_id_path(table_id)}/schemas"
                if self._get(schemas) is None:
                    transaction.create(schemas)
                transaction.create(f"{schemas}/{record.schema_id}", record.table_json)
            transaction.commit()
            return TableRecord(
                table_id, record.database, record.name, table_json, new_schema_id, record.created_ms, now_ms
            )

        return self._run(update)

    def table_versions(self, table_id: int) -> dict[int, bytes]:
        def read() -> dict[int, bytes]:
            schemas = f"{self._table_id_path(table_id)}/schemas"
            names = self._children(schemas)
            values = self._get_many([f"{schemas}/{name}" for name in names])
            return {int(name): value for name, value in zip(names, values, strict=True) if value is not None}

        return self._run(read)

    def _partition_ids_of(self, table_id: int) -> list[int]:
        """Every partition id with a node of this table (registered, or holding snapshots only)."""
        parent = self._path("/tabletservers/partitions")
        names = self._children(parent)
        values = self._get_many([f"{parent}/{name}" for name in names])
        return sorted(
            int(name)
            for name, value in zip(names, values, strict=True)
            if value is not None and _unpack(value)[0].get("table_id") == table_id
        )

    def drop_table(self, table_id: int) -> None:
        def drop() -> None:
            location = self._table_location(table_id)
            last = []
            if location is not None:
                table_path = self._table_path(*location)
                found = self._get(table_path)
                if found is not None and _unpack(found[0])[0].get("table_id") == table_id:
                    last.append(table_path)
            roots = [self._partition_id_path(pid) for pid in self._partition_ids_of(table_id)]
            roots += [self._path(f"/lake/tiering/{table_id}"), self._table_id_path(table_id)]
            self._delete_tree_in_transactions(roots, last)

        self._run(drop)

    # ---- partitions ----
    def create_partition(
        self, table_id: int, name: str, spec: tuple[tuple[str, str], ...], now_ms: int
    ) -> PartitionRecord:
        nonce = uuid.uuid4().hex

        def create() -> PartitionRecord:
            found = self._get_table_by_id(table_id)
            if found is None:
                raise TableNotExistError(f"Table id {table_id} does not exist.")
            table, _ = found
            table_path = self._table_path(table.database, table.name)
            path = f"{table_path}/partitions/{_escape(name)}"
            existing = self._get(path)
            if existing is not None:
                if _unpack(existing[0])[0].get("nonce") == nonce:
                    return self._partition_record(table_id, name, existing[0])
                raise PartitionAlreadyExistsError(f"Partition {name} already exists.")
            transaction = _Transaction(self._client)
            partition_id = self._next_value(transaction, "partition")
            header = {
                "partition_id": partition_id,
                "spec": [list(pair) for pair in spec],
                "created_ms": now_ms,
                "nonce": nonce,
            }
            transaction.check(table_path, -1)
            transaction.create(path, _pack(header))
            id_path = self._partition_id_path(partition_id)
            id_value = _pack({"table_id": table_id, "database": table.database, "table": table.name, "partition": name})
            id_node = self._get(id_path)
            if id_node is None:
                transaction.create(id_path, id_value)
            else:
                transaction.set_data(id_path, id_value, id_node[1].version)
            transaction.commit()
            return PartitionRecord(partition_id, table_id, name, spec, now_ms)

        return self._run(create)

    @staticmethod
    def _partition_record(table_id: int, name: str, data: bytes) -> PartitionRecord:
        header, _ = _unpack(data)
        spec = tuple((str(key), str(value)) for key, value in header["spec"])
        return PartitionRecord(int(header["partition_id"]), table_id, name, spec, int(header["created_ms"]))

    def list_partitions(self, table_id: int) -> list[PartitionRecord]:
        def read() -> list[PartitionRecord]:
            location = self._table_location(table_id)
            if location is None:
                return []
            parent = f"{self._table_path(*location)}/partitions"
            names = self._children(parent)
            values = self._get_many([f"{parent}/{name}" for name in names])
            records = [
                self._partition_record(table_id, unquote(name), value)
                for name, value in zip(names, values, strict=True)
                if value is not None
            ]
            return sorted(records, key=lambda record: record.partition_id)

        return self._run(read)

    def get_partition(self, table_id: int, name: str) -> PartitionRecord | None:
        def read() -> PartitionRecord | None:
            location = self._table_location(table_id)
            if location is None:
                return None
            found = self._get(f"{self._table_path(*location)}/partitions/{_escape(name)}")
            return None if found is None else self._partition_record(table_id, name, found[0])

        return self._run(read)

    def _partition_location(self, partition_id: int) -> tuple[int, str] | None:
        """(table id, registration path) of a registered partition id."""
        found = self._get(self._partition_id_path(partition_id))
        if found is None:
            return None
        header, _ = _unpack(found[0])
        if "partition" not in header:
            return None
        path = f"{self._table_path(header['database'], header['table'])}/partitions/{_escape(header['partition'])}"
        return int(header["table_id"]), path

    def get_partition_by_id(self, partition_id: int) -> PartitionRecord | None:
        def read() -> PartitionRecord | None:
            location = self._partition_location(partition_id)
            if location is None:
                return None
            table_id, path = location
            found = self._get(path)
            if found is None:
                return None
            record = self._partition_record(table_id, unquote(path.rsplit("/", 1)[1]), found[0])
            return record if record.partition_id == partition_id else None

        return self._run(read)

    def drop_partition(self, partition_id: int) -> None:
        def drop() -> None:
            location = self._partition_location(partition_id)
            last = []
            if location is not None:
                found = self._get(location[1])
                if found is not None and _unpack(found[0])[0].get("partition_id") == partition_id:
                    last.append(location[1])
            self._delete_tree_in_transactions([self._partition_id_path(partition_id)], last)

        self._run(drop)

    # ---- bucket assignment ----
    # The node lives under the table id's (or partition id's) node, so drop_table and drop_partition,
    # which delete those subtrees, remove it with them.
    def put_bucket_assignment(self, table_id: int, partition_id: int | None, leaders: Mapping[int, int]) -> None:
        value = _pack({str(bucket): int(server) for bucket, server in leaders.items()})
        self._put_owned(table_id, partition_id, self._assignment_path(table_id, partition_id), value)

    def _put_owned(self, table_id: int, partition_id: int | None, path: str, value: bytes) -> None:
        """Create or replace a node under a table's or partition's node (creating its parents); a partition's
        node names its table, so drop_table finds (and deletes) what hangs under it."""
        _check_value_size(path, value)

        def put() -> None:
            if partition_id is not None:
                with contextlib.suppress(NodeExistsError):
                    self._client.create(self._partition_id_path(partition_id), _pack({"table_id": table_id}),
                                        makepath=True)
            try:
                self._client.set(path, value)
            except NoNodeError:
                try:
                    self._client.create(path, value, makepath=True)
                except NodeExistsError:
                    raise _Conflict(path) from None

        self._run(put)

    def get_bucket_assignment(self, table_id: int, partition_id: int | None) -> dict[int, int] | None:
        found = self._run(lambda: self._get(self._assignment_path(table_id, partition_id)))
        if found is None:
            return None
        header, _ = _unpack(found[0])
        return {int(bucket): int(server) for bucket, server in header.items()}

    # ---- remote log manifests ----
    def put_remote_log_manifest(self, table_id: int, partition_id: int | None, bucket: int, payload: bytes) -> None:
        self._put_owned(table_id, partition_id, self._remote_logs_path(table_id, partition_id, bucket), payload)

    def get_remote_log_manifest(self, table_id: int, partition_id: int | None, bucket: int) -> bytes | None:
        return self._value(self._remote_logs_path(table_id, partition_id, bucket))

    def list_remote_log_manifests(self, table_id: int, partition_id: int | None) -> dict[int, bytes]:
        owner = self._owner_path(table_id, partition_id)

        def read() -> dict[int, bytes]:
            found = {}
            for bucket in self._children(f"{owner}/buckets"):
                if bucket.isdigit():
                    node = self._get(self._remote_logs_path(table_id, partition_id, int(bucket)))
                    if node is not None:
                        found[int(bucket)] = node[0]
            return dict(sorted(found.items()))

        return self._run(read)

    # ---- sequences ----
    def next_id(self, sequence: str, count: int = 1) -> int:
        if count <= 0:
            raise ValueError(f"a counter reserves a positive count of values, got {count}")

        def bump() -> int:
            transaction = _Transaction(self._client)
            value = self._next_value(transaction, sequence, count)
            transaction.commit()
            return value

        return self._run(bump)

    # ---- KV snapshots ----
    def add_kv_snapshot(self, record: KvSnapshotRecord) -> None:
        path = f"{self._bucket_snapshots_path(record.table_id, record.partition_id, record.bucket)}/{record.snapshot_id}"
        _check_value_size(path, record.snapshot_json)

        def add() -> None:
            if record.partition_id is not None:
                # the partition's node names its table, for the table's listings and drop
                with contextlib.suppress(NodeExistsError):
                    self._client.create(
                        self._partition_id_path(record.partition_id), _pack({"table_id": record.table_id})
                    )
            try:
                self._client.create(path, record.snapshot_json, makepath=True)
            except NodeExistsError:
                existing = self._get(path)
                if existing is None:
                    raise _Conflict(path) from None
                if existing[0] != record.snapshot_json:  # the same record again is a retried add
                    raise ValueError(f"KV snapshot {path} is already recorded with another document") from None

        self._run(add)

    def _snapshots_under(self, owners: list[tuple[int, int | None, str]]) -> list[KvSnapshotRecord]:
        """Snapshot records under the given (table id, partition id, owner node) triples."""
        bucket_lists = self._children_many([f"{owner}/buckets" for _, _, owner in owners])
        buckets = [
            (table_id, partition_id, int(bucket), f"{owner}/buckets/{bucket}/snapshots")
            for (table_id, partition_id, owner), names in zip(owners, bucket_lists, strict=True)
            for bucket in names
        ]
        snapshot_lists = self._children_many([path for *_, path in buckets])
        leaves = [
            (table_id, partition_id, bucket, int(snapshot_id), f"{path}/{snapshot_id}")
            for (table_id, partition_id, bucket, path), names in zip(buckets, snapshot_lists, strict=True)
            for snapshot_id in names
        ]
        values = self._get_many([path for *_, path in leaves])
        records = [
            KvSnapshotRecord(table_id, partition_id, bucket, snapshot_id, value)
            for (table_id, partition_id, bucket, snapshot_id, _), value in zip(leaves, values, strict=True)
            if value is not None
        ]
        return sorted(records, key=lambda r: (r.table_id, -1 if r.partition_id is None else r.partition_id,
                                              r.bucket, r.snapshot_id))

    def list_kv_snapshots(self, table_id: int | None = None) -> list[KvSnapshotRecord]:
        def read() -> list[KvSnapshotRecord]:
            owners: list[tuple[int, int | None, str]] = []
            if table_id is None:
                tables = self._children(self._path("/tabletservers/tables"))
                owners += [(int(name), None, self._table_id_path(int(name))) for name in tables]
                parent = self._path("/tabletservers/partitions")
                partitions = self._children(parent)
                values = self._get_many([f"{parent}/{name}" for name in partitions])
                owners += [
                    (int(_unpack(value)[0]["table_id"]), int(name), f"{parent}/{name}")
                    for name, value in zip(partitions, values, strict=True)
                    if value is not None
                ]
            else:
                owners.append((table_id, None, self._table_id_path(table_id)))
                owners += [(table_id, pid, self._partition_id_path(pid)) for pid in self._partition_ids_of(table_id)]
            return self._snapshots_under(owners)

        return self._run(read)

    def list_bucket_kv_snapshots(self, table_id: int, partition_id: int | None, bucket: int) -> list[KvSnapshotRecord]:
        def read() -> list[KvSnapshotRecord]:
            parent = self._bucket_snapshots_path(table_id, partition_id, bucket)
            ids = sorted(int(name) for name in self._children(parent))
            values = self._get_many([f"{parent}/{snapshot_id}" for snapshot_id in ids])
            return [
                KvSnapshotRecord(table_id, partition_id, bucket, snapshot_id, value)
                for snapshot_id, value in zip(ids, values, strict=True)
                if value is not None
            ]

        return self._run(read)

    def delete_kv_snapshot(self, table_id: int, partition_id: int | None, bucket: int, snapshot_id: int) -> None:
        self._delete(f"{self._bucket_snapshots_path(table_id, partition_id, bucket)}/{snapshot_id}")

    # ---- leases ----
    def put_lease(self, lease_id: str, payload: bytes) -> None:
        self._put(self._path(f"/leases/kv_snapshot/{_escape(lease_id)}"), payload)

    def delete_lease(self, lease_id: str) -> None:
        self._delete(self._path(f"/leases/kv_snapshot/{_escape(lease_id)}"))

    def list_leases(self) -> dict[str, bytes]:
        return self._run(lambda: self._values_of(self._path("/leases/kv_snapshot")))

    def _values_of(self, parent: str) -> dict[str, bytes]:
        names = self._children(parent)
        values = self._get_many([f"{parent}/{name}" for name in names])
        return {unquote(name): value for name, value in zip(names, values, strict=True) if value is not None}

    # ---- producer offsets ----
    def _producer_path(self, producer_id: str) -> str:
        return self._path(f"/producers/{_escape(producer_id)}")

    def create_producer_offsets(self, producer_id: str, payload: bytes) -> bool:
        path = self._producer_path(producer_id)
        _check_value_size(path, payload)

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

    # ---- lake snapshots ----
    # A table's snapshots are sequential children "<snapshot id>-<seq>" of its laketable node: the
    # sequence ZooKeeper appends orders them by commit (lake snapshot ids need not grow; Iceberg's are random).
    def _laketable_path(self, table_id: int) -> str:
        return f"{self._table_id_path(table_id)}/laketable"

    @staticmethod
    def _lake_children_by_commit(names: list[str]) -> list[tuple[int, str]]:
        """(snapshot id, node name) oldest commit first."""
        parsed = [(int(name.rsplit("-", 1)[1]), int(name.rsplit("-", 1)[0]), name) for name in names]
        return [(snapshot_id, name) for _, snapshot_id, name in sorted(parsed)]

    def commit_lake_snapshot(
        self, record: LakeSnapshotRecord, discard_snapshot_ids: Collection[int] = ()
    ) -> list[LakeSnapshotRecord]:
        assert record.snapshot_id not in discard_snapshot_ids, "a snapshot cannot replace and discard itself"
        parent = self._laketable_path(record.table_id)
        value = _pack({"readable": record.readable}, record.snapshot_json)
        _check_value_size(parent, value)

        def commit() -> list[LakeSnapshotRecord]:
            found = self._get(parent)
            if found is None:
                self._client.ensure_path(parent)
                raise _Conflict(parent)
            stat = found[1]
            children = self._lake_children_by_commit(self._children(parent))
            transaction = _Transaction(self._client)
            # bumping the parent's version fences a concurrent commit that read the same children
            transaction.set_data(parent, b"", stat.version)
            discarded = []
            for snapshot_id in discard_snapshot_ids:
                for child_id, name in children:
                    if child_id == snapshot_id:
                        data = self._get(f"{parent}/{name}")
                        if data is None:
                            raise _Conflict(name)
                        discarded.append(self._lake_record(record.table_id, snapshot_id, data[0]))
                        transaction.delete(f"{parent}/{name}")
            for child_id, name in children:
                if child_id == record.snapshot_id:
                    transaction.delete(f"{parent}/{name}")
            transaction.create(f"{parent}/{record.snapshot_id}-", value, sequence=True)
            transaction.commit()
            return discarded

        return self._run(commit)

    @staticmethod
    def _lake_record(table_id: int, snapshot_id: int, data: bytes) -> LakeSnapshotRecord:
        header, payload = _unpack(data)
        return LakeSnapshotRecord(table_id, snapshot_id, bool(header["readable"]), payload)

    def list_lake_snapshot_ids(self, table_id: int) -> list[int]:
        names = self._run(lambda: self._children(self._laketable_path(table_id)))
        return [snapshot_id for snapshot_id, _ in self._lake_children_by_commit(names)]

    def get_lake_snapshot(
        self, table_id: int, snapshot_id: int | None = None, readable: bool = False
    ) -> LakeSnapshotRecord | None:
        parent = self._laketable_path(table_id)

        def read() -> LakeSnapshotRecord | None:
            children = self._lake_children_by_commit(self._children(parent))
            for child_id, name in reversed(children):
                if snapshot_id is not None and child_id != snapshot_id:
                    continue
                found = self._get(f"{parent}/{name}")
                if found is None:
                    raise _Conflict(name)
                record = self._lake_record(table_id, child_id, found[0])
                if record.readable or not readable:
                    return record
            return None

        return self._run(read)

    # ---- ACLs ----
    def _acl_resource_path(self, resource_type: int, resource_name: str) -> str:
        return self._path(f"/fluss-acls/{resource_type}/{_escape(resource_name)}")

    @staticmethod
    def _acl_entries(data: bytes) -> set[tuple[str, str, str, int, int]]:
        header, _ = _unpack(data)
        return {(str(a), str(b), str(c), int(d), int(e)) for a, b, c, d, e in header["acls"]}

    def _change_acls(self, records: Collection[AclRecord], add: bool) -> None:
        groups: dict[tuple[int, str], set[tuple[str, str, str, int, int]]] = {}
        for r in records:
            groups.setdefault((r.resource_type, r.resource_name), set()).add(
                (r.principal_type, r.principal_name, r.host, r.operation, r.permission)
            )

        def change() -> None:
            transaction = _Transaction(self._client)
            for (resource_type, resource_name), entries in sorted(groups.items()):
                type_path = self._path(f"/fluss-acls/{resource_type}")
                if add:
                    self._client.ensure_path(type_path)
                path = self._acl_resource_path(resource_type, resource_name)
                found = self._get(path)
                stored = set() if found is None else self._acl_entries(found[0])
                wanted = stored | entries if add else stored - entries
                if wanted == stored:
                    continue
                value = _pack({"acls": sorted(list(entry) for entry in wanted)})
                if found is None:
                    transaction.create(path, value)
                elif wanted:
                    transaction.set_data(path, value, found[1].version)
                else:
                    transaction.delete(path, found[1].version)
            transaction.commit()

        self._run(change)

    def add_acls(self, records: Collection[AclRecord]) -> None:
        self._change_acls(records, add=True)

    def delete_acls(self, records: Collection[AclRecord]) -> None:
        self._change_acls(records, add=False)

    def list_acls(self) -> list[AclRecord]:
        def read() -> list[AclRecord]:
            root = self._path("/fluss-acls")
            types = self._children(root)
            names = self._children_many([f"{root}/{t}" for t in types])
            resources = [(int(t), unquote(n), f"{root}/{t}/{n}") for t, ns in zip(types, names, strict=True) for n in ns]
            values = self._get_many([path for *_, path in resources])
            return sorted(
                AclRecord(resource_type, resource_name, *entry)
                for (resource_type, resource_name, _), value in zip(resources, values, strict=True)
                if value is not None
                for entry in self._acl_entries(value)
            )

        return self._run(read)

    def close(self) -> None:
        self._closed = True
        try:
            self._client.stop()
        finally:
            self._client.close()
