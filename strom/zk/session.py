"""One ZooKeeper session of the metadata store, and the retrying, size-checked plumbing every concern of the
store runs its reads and writes through.

What the per-concern stores (:mod:`strom.zk.catalog_store`, :mod:`strom.zk.bucket_store`, …) share lives
here once: connecting (with the digest identity and TLS of :class:`~strom.zk.login.ZooKeeperLogin`), the
node paths under the store's root, the bounded retry of :meth:`ZooKeeperSession._run` (again after a
version conflict, waiting out a lost connection or an expired session), and the multi-op
:class:`Transaction` that refuses a request larger than ZooKeeper accepts. The registry and the coordinator
address use :func:`connect_kazoo` and :func:`parse_location` too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.security import ACL, make_digest_acl

from strom.errors import InvalidConfigError, StorageError, UnknownServerError
from strom.zk.documents import escape, unpack
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


class Conflict(Exception):
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


def check_value_size(path: str, value: bytes) -> None:
    """Raises MetadataValueTooLargeError when ``value`` is more than one node may hold."""
    if len(value) > VALUE_SIZE_BYTES_MAX:
        raise MetadataValueTooLargeError(
            f"metadata value of {len(value)} bytes at {path} exceeds {VALUE_SIZE_BYTES_MAX} bytes"
        )


class Transaction:
    """A multi-op request that checks its own size before it is sent."""

    def __init__(self, client: KazooClient) -> None:
        self._request = client.transaction()
        self._size_bytes = 0
        self.op_count = 0

    def _add(self, path: str, value: bytes = b"") -> None:
        check_value_size(path, value)
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
        """Apply every op or none; raises Conflict when ZooKeeper refused the transaction."""
        if self._size_bytes > TRANSACTION_SIZE_BYTES_MAX:
            raise MetadataValueTooLargeError(
                f"a metadata transaction of {self._size_bytes} bytes exceeds {TRANSACTION_SIZE_BYTES_MAX} bytes"
            )
        if self.op_count == 0:
            return []
        results = self._request.commit()
        if any(isinstance(result, Exception) for result in results):
            raise Conflict(results)
        return list(results)


class ZooKeeperSession:
    """A client of one root of a ZooKeeper ensemble, with the paths and retrying plumbing of the store's
    concerns. Several stores (processes) may share a root."""

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
        return self._path(f"/metadata/databases/{escape(database)}")

    def _table_path(self, database: str, name: str) -> str:
        return f"{self._database_path(database)}/tables/{escape(name)}"

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
        return self._path(_SEQUENCE_PATHS.get(sequence) or f"/metadata/sequences/{escape(sequence)}")

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
            except Conflict:
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
        check_value_size(path, value)

        def put() -> None:
            try:
                self._client.set(path, value)
            except NoNodeError:
                try:
                    self._client.create(path, value)
                except NodeExistsError:
                    raise Conflict(path) from None

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
            transaction = Transaction(self._client)
            for path in chunk:
                transaction.delete(path)
            transaction.commit()
        transaction = Transaction(self._client)
        for path in [*nodes, *final]:
            transaction.delete(path)
        transaction.commit()

    def _next_value(self, transaction: Transaction, sequence: str, count: int = 1) -> int:
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

    def _values_of(self, parent: str) -> dict[str, bytes]:
        names = self._children(parent)
        values = self._get_many([f"{parent}/{name}" for name in names])
        return {unquote(name): value for name, value in zip(names, values, strict=True) if value is not None}

    def _partition_ids_of(self, table_id: int) -> list[int]:
        """Every partition id with a node of this table (registered, or holding snapshots only): the catalog
        drops them with the table, the KV snapshot records list what hangs under them."""
        parent = self._path("/tabletservers/partitions")
        names = self._children(parent)
        values = self._get_many([f"{parent}/{name}" for name in names])
        return sorted(
            int(name)
            for name, value in zip(names, values, strict=True)
            if value is not None and unpack(value)[0].get("table_id") == table_id
        )

    def close(self) -> None:
        self._closed = True
        try:
            self._client.stop()
        finally:
            self._client.close()
