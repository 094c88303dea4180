"""Security against a real server: SASL/PLAIN authentication of the official client and strom's own, and
ACL authorization of reads, writes and catalog calls, managed through the admin API and ``strom acl``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import fluss as pyfluss
import pyarrow as pa
import pytest
import pytest_asyncio

from strom.client import Connection, Schema, TableBucket, TableDescriptor, TablePath
from strom.errors import (
    AuthenticationError,
    AuthorizationError,
    PartitionNotExistError,
    SecurityDisabledError,
    TableNotExistError,
    UnknownTableOrBucketError,
)
from strom.records.types import IntType, StringType
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from strom.security.acl import AclBinding, AclFilter, OperationType, Principal, Resource
from strom.security.credentials import SaslCredentials
from tests.conftest import unique_name
from tests.integration.pyfluss_support import poll_records
from tests.integration.security_support import SECURE_CONFIG, USERS, strom_config
from tests.integration.snapshot_support import create_pk_table, wait_for_snapshot_ids, write_round
from tests.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("security")]

AUTHENTICATION_FAILED = 46
SECURITY_DISABLED = 47
AUTHORIZATION_FAILED = 48
DATABASE = "fluss"

@pytest.fixture(scope="module")
def secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("secure") / "data", SECURE_CONFIG)
    process.start()
    yield process
    assert process.stop() == 0, process.log_text()[-3000:]
    assert not process.internal_errors()


def pyfluss_config(server: ServerProcess, user: str | None = None, password: str | None = None) -> Any:
    config = {"bootstrap.servers": server.address}
    if user is not None:
        config.update({
            "security.protocol": "sasl", "security.sasl.mechanism": "PLAIN",
            "security.sasl.username": user, "security.sasl.password": password or USERS[user],
        })
    return pyfluss.Config(config)


@pytest_asyncio.fixture
async def admin(secure_server: ServerProcess) -> AsyncIterator[Connection]:
    async with await Connection.create(strom_config(secure_server, "admin")) as connection:
        yield connection


async def grant(admin: Connection, user: str, operation: OperationType, resource: Resource) -> None:
    await admin.get_admin().create_acls([AclBinding(resource, Principal("User", user), "*", operation)])


async def revoke_all(admin: Connection, user: str) -> None:
    await admin.get_admin().drop_acls([AclFilter(principal=Principal("User", user))])


FIELDS = [pa.field("id", pa.int64()), pa.field("v", pa.string())]


def assert_authorization_failed(error: Any) -> None:
    """pyfluss reports a per-bucket or writer-id failure wrapped (code -2) with the server's code inside."""
    assert error.error_code == AUTHORIZATION_FAILED or re.search(r"code[=:] ?48\b", str(error)), str(error)


# ---- authentication ----
@pytest.mark.asyncio
async def test_pyfluss_with_sasl_credentials_reads_and_writes(secure_server: ServerProcess) -> None:
    connection = await pyfluss.FlussConnection.create(pyfluss_config(secure_server, "admin"))
    try:
        path = pyfluss.TablePath(DATABASE, unique_name("sasl"))
        schema = pyfluss.Schema(pa.schema(FIELDS), primary_keys=["id"])
        await connection.get_admin().create_table(path, pyfluss.TableDescriptor(schema))
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        writer.upsert({"id": 1, "v": "one"})
        await writer.flush()
        assert await table.new_lookup().create_lookuper().lookup({"id": 1}) == {"id": 1, "v": "one"}
    finally:
        await connection.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(("user", "password"), [(None, None), ("admin", "wrong"), ("mallory", "x")])
async def test_pyfluss_without_or_with_wrong_credentials_gets_an_authentication_error(
    secure_server: ServerProcess, user: str | None, password: str | None
) -> None:
    with pytest.raises(pyfluss.FlussError) as failure:
        connection = await pyfluss.FlussConnection.create(pyfluss_config(secure_server, user, password))
        try:
            await connection.get_admin().list_databases()
        finally:
            await connection.close()
    assert failure.value.error_code == AUTHENTICATION_FAILED, str(failure.value)


@pytest.mark.asyncio
async def test_strom_client_authenticates_with_fluss_client_options(secure_server: ServerProcess) -> None:
    with pytest.raises(AuthenticationError):
        await Connection.create(secure_server.address)
    wrong = {**strom_config(secure_server, "alice"), "client.security.sasl.password": "nope"}
    with pytest.raises(AuthenticationError):
        await Connection.create(wrong)
    async with await Connection.create(strom_config(secure_server, "alice")) as connection:
        assert await connection.get_admin().list_databases() == []  # alice may describe nothing yet


# ---- authorization ----
@pytest.mark.asyncio
async def test_read_is_needed_to_look_up_fetch_scan_or_lease(secure_server: ServerProcess, admin: Connection) -> None:
    path = TablePath(DATABASE, unique_name("reads"))
    table = await create_pk_table(admin, path, buckets=1)
    await write_round(table, range(10), "a")
    resource = Resource.table(path.database_name, path.table_name)
    await grant(admin, "bob", OperationType.WRITE, resource)  # WRITE implies DESCRIBE, not READ
    py_path = pyfluss.TablePath(path.database_name, path.table_name)
    bucket = table.bucket(0)
    try:
        # pyfluss: lookups and log fetches are refused per bucket with the authorization code
        bob = await pyfluss.FlussConnection.create(pyfluss_config(secure_server, "bob"))
        try:
            py_table = await bob.get_table(py_path)
            with pytest.raises(pyfluss.FlussError) as failure:
                await py_table.new_lookup().create_lookuper().lookup({"id": 1})
            assert_authorization_failed(failure.value)
            scanner = await py_table.new_scan().create_log_scanner()
            scanner.subscribe(0, 0)
            with pytest.raises(pyfluss.FlussError) as failure:
                await poll_records(scanner, 1)
            assert_authorization_failed(failure.value)
        finally:
            await bob.close()
        async with await Connection.create(strom_config(secure_server, "bob")) as connection:
            denied = await connection.get_table(path)
            with pytest.raises(AuthorizationError):
                await denied.new_scan().create_bucket_batch_scanner(bucket).next_batch()
            with pytest.raises(AuthorizationError):
                await denied.new_lookup().create_lookuper().lookup({"id": 1})
            scanner = denied.new_scan().create_log_scanner()
            scanner.subscribe(0, 0)
            with pytest.raises(AuthorizationError):
                await scanner.poll(2000)
            lease = connection.get_admin().create_kv_snapshot_lease(unique_name("lease"), 60_000)
            with pytest.raises(AuthorizationError):
                await lease.acquire_snapshots({bucket: 0})

        await grant(admin, "bob", OperationType.READ, resource)
        async with await Connection.create(strom_config(secure_server, "bob")) as connection:
            allowed = await connection.get_table(path)
            assert (await allowed.new_lookup().create_lookuper().lookup({"id": 1})) is not None
            rows = await allowed.new_scan().create_bucket_batch_scanner(bucket).next_batch()
            assert rows is not None and rows.num_rows == 10
            lease = connection.get_admin().create_kv_snapshot_lease(unique_name("lease"), 60_000)
            await lease.acquire_snapshots({bucket: 0})
            await lease.drop()
    finally:
        await revoke_all(admin, "bob")


@pytest.mark.asyncio
async def test_a_lease_belongs_to_its_creator(secure_server: ServerProcess, admin: Connection) -> None:
    """Another principal, even one that may read the table, cannot renew, take over, release or drop it;
    a super user can (an operator cleaning up after a job). Releasing or dropping another's lease answers
    exactly as for a lease that does not exist (OK, nothing changes), so lease ids cannot be probed that way
    and no error names a table the lease pins; taking its id is refused without naming anything."""
    path = TablePath(DATABASE, unique_name("owned"))
    table = await create_pk_table(admin, path, buckets=1)
    await write_round(table, range(10), "a")
    snapshot = (await wait_for_snapshot_ids(admin.get_admin(), path, 0)).snapshots[0]
    assert snapshot is not None
    bucket = table.bucket(0)
    resource = Resource.table(path.database_name, path.table_name)
    lease_id = unique_name("alice-job")
    for user in ("alice", "bob"):
        await grant(admin, user, OperationType.READ, resource)
    try:
        async with await Connection.create(strom_config(secure_server, "alice")) as alice:
            await alice.get_admin().create_kv_snapshot_lease(lease_id, 600_000).acquire_snapshots(
                {bucket: snapshot.snapshot_id})
        (held,) = await admin.get_admin().list_kv_snapshot_leases(lease_id)
        async with await Connection.create(strom_config(secure_server, "bob")) as bob:
            taken_over = bob.get_admin().create_kv_snapshot_lease(lease_id, 1)
            for attempt in (taken_over.acquire_snapshots({bucket: snapshot.snapshot_id}), taken_over.renew()):
                with pytest.raises(AuthorizationError, match="cannot be taken by User:bob") as refused:
                    await attempt
                assert path.table_name not in str(refused.value)
            missing = bob.get_admin().create_kv_snapshot_lease(unique_name("no-such-lease"), 1)
            for lease in (taken_over, missing):  # the same answers for another's lease and for none
                assert await lease.release_snapshots([bucket]) is None
                assert await lease.drop() is None
        async with await Connection.create(strom_config(secure_server, "carol")) as carol:  # may not READ it
            assert await carol.get_admin().create_kv_snapshot_lease(lease_id, 1).drop() is None
        assert await admin.get_admin().list_kv_snapshot_leases(lease_id) == [held], "bob changed nothing"
        await admin.get_admin().create_kv_snapshot_lease(lease_id, 1).drop()  # a super user may
        assert await admin.get_admin().list_kv_snapshot_leases(lease_id) == []
    finally:
        await revoke_all(admin, "alice")
        await revoke_all(admin, "bob")


@pytest.mark.asyncio
async def test_a_table_the_caller_may_not_describe_is_not_found_by_strom_s_client(
    secure_server: ServerProcess, admin: Connection
) -> None:
    """GetMetadata leaves the table out (as Fluss does); the client says it does not exist (it raised a bare
    KeyError)."""
    path = TablePath(DATABASE, unique_name("hidden"))
    await create_pk_table(admin, path, buckets=1)
    async with await Connection.create(strom_config(secure_server, "bob")) as bob:
        with pytest.raises(TableNotExistError, match="may not describe it"):
            await bob.get_table(path)


@pytest.mark.asyncio
async def test_tiering_needs_alter_on_the_cluster(secure_server: ServerProcess, admin: Connection) -> None:
    """Taking a table's tiering round and preparing or committing its lake offsets is the tiering service's
    privilege: a user who may read and write the table, but not ALTER the cluster, may do none of it."""
    path = TablePath(DATABASE, unique_name("tiered"))
    await admin.get_admin().create_table(path, TableDescriptor(
        Schema.from_arrow(pa.schema(FIELDS), primary_key=["id"]), bucket_count=1,
        properties={"table.datalake.enabled": "true", "table.datalake.freshness": "0s"}))
    table = await admin.get_table(path)
    await write_round(table, range(10), "a")
    table_id = table.layout.info.table_id
    resource = Resource.table(path.database_name, path.table_name)
    for operation in (OperationType.READ, OperationType.WRITE):
        await grant(admin, "bob", operation, resource)
    try:
        async with await Connection.create(strom_config(secure_server, "bob")) as bob:
            lake = bob.get_admin()
            with pytest.raises(AuthorizationError, match="ALTER"):
                await lake.lake_tiering_heartbeat(request_table=True)
            with pytest.raises(AuthorizationError, match="ALTER"):
                await lake.prepare_lake_table_snapshot(table_id, path, {table.bucket(0): 5})
            with pytest.raises(AuthorizationError, match="ALTER"):
                await lake.commit_lake_table_snapshot(table_id, 1, "/x.offsets")
            await grant(admin, "bob", OperationType.ALTER, Resource.cluster())
            assert (await lake.lake_tiering_heartbeat()).errors == {}  # with the right, served
    finally:
        await revoke_all(admin, "bob")


@pytest.mark.asyncio
async def test_one_fetch_answers_a_denied_table_per_bucket_a_hidden_one_as_unknown_and_reads_the_other(
    secure_server: ServerProcess, admin: Connection
) -> None:
    """bob may READ one table, DESCRIBE another and do nothing with a third: one FetchLog reads the first,
    answers the second's buckets with the authorization code, and the third's as buckets this server does
    not host, exactly as for a table id nobody uses (its name appears nowhere)."""
    readable = await create_pk_table(admin, TablePath(DATABASE, unique_name("fetch_ok")), buckets=1)
    denied_table = await create_pk_table(admin, TablePath(DATABASE, unique_name("fetch_denied")), buckets=1)
    hidden = await create_pk_table(admin, TablePath(DATABASE, unique_name("fetch_no")), buckets=1)
    for table in (readable, denied_table, hidden):
        await write_round(table, range(3), "r")
    await grant(admin, "bob", OperationType.READ, Resource.table(DATABASE, readable.table_path.table_name))
    await grant(admin, "bob", OperationType.DESCRIBE, Resource.table(DATABASE, denied_table.table_path.table_name))
    host, port = secure_server.address.split(":")
    connection = await RpcConnection.connect(host, int(port), credentials=SaslCredentials("bob", USERS["bob"]))
    try:
        request = pb.FetchLogRequest(follower_server_id=-1, max_bytes=1 << 20, max_wait_ms=0, min_bytes=1)
        for table in (hidden, denied_table, readable):
            entry = request.tables_req.add(table_id=table.table_info.table_id, projection_pushdown_enabled=False)
            entry.buckets_req.add(bucket_id=0, fetch_offset=0, max_fetch_bytes=1 << 20)
        response = await connection.request(ApiKey.FETCH_LOG, request)
        by_table = {t.table_id: t.buckets_resp[0] for t in response.tables_resp}
        unknown = by_table[hidden.table_info.table_id]
        denied = by_table[denied_table.table_info.table_id]
        allowed = by_table[readable.table_info.table_id]
        assert (unknown.error_code, unknown.error_message, unknown.records) == (
            21, f"TableBucket(table_id={hidden.table_info.table_id}, bucket=0) is not hosted by this server", b"")
        assert denied.error_code == AUTHORIZATION_FAILED and not denied.records
        assert denied_table.table_path.table_name in denied.error_message  # bob may describe that one
        assert not allowed.error_code and allowed.high_watermark == 3 and allowed.records

        metadata = await connection.request(ApiKey.GET_METADATA, pb.MetadataRequest(table_path=[
            pb.PbTablePath(database_name=DATABASE, table_name=t.table_path.table_name) for t in (hidden, readable)
        ]))
        assert [m.table_path.table_name for m in metadata.table_metadata] == [readable.table_path.table_name]

        partitioned = TablePath(DATABASE, unique_name("parts"))
        descriptor = TableDescriptor(Schema.of([("id", IntType()), ("day", StringType())]), partition_keys=("day",))
        await admin.get_admin().create_table(partitioned, descriptor)
        await admin.get_admin().create_partition(partitioned, {"day": "d1"})
        (partition,) = await admin.get_admin().list_partition_infos(partitioned)
        by_id = pb.MetadataRequest(partitions_id=[partition.partition_id])
        with pytest.raises(PartitionNotExistError, match=f"^Partition id {partition.partition_id} does not exist"):
            await connection.request(ApiKey.GET_METADATA, by_id)  # as for an id nobody uses
        await grant(admin, "bob", OperationType.DESCRIBE, Resource.table(DATABASE, partitioned.table_name))
        assert len((await connection.request(ApiKey.GET_METADATA, by_id)).partition_metadata) == 1
    finally:
        await connection.close()
        await revoke_all(admin, "bob")


@pytest.mark.asyncio
async def test_write_is_needed_to_put_rows(secure_server: ServerProcess, admin: Connection) -> None:
    path = TablePath(DATABASE, unique_name("writes"))
    await create_pk_table(admin, path, buckets=1)
    resource = Resource.table(path.database_name, path.table_name)
    await grant(admin, "alice", OperationType.READ, resource)
    py_path = pyfluss.TablePath(path.database_name, path.table_name)
    try:
        alice = await pyfluss.FlussConnection.create(pyfluss_config(secure_server, "alice"))
        try:
            table = await alice.get_table(py_path)
            writer = table.new_upsert().create_writer()
            with pytest.raises(pyfluss.FlussError) as failure:
                await writer.upsert({"id": 7, "v": "x"}).wait()
            assert_authorization_failed(failure.value)
        finally:
            await alice.close()
        async with await Connection.create(strom_config(secure_server, "alice")) as connection:
            denied = await connection.get_table(path)
            with pytest.raises(AuthorizationError):
                await write_round(denied, range(3), "denied")
        await grant(admin, "alice", OperationType.WRITE, resource)
        alice = await pyfluss.FlussConnection.create(pyfluss_config(secure_server, "alice"))
        try:
            table = await alice.get_table(py_path)
            writer = table.new_upsert().create_writer()
            writer.upsert({"id": 7, "v": "x"})
            await writer.flush()
            assert await table.new_lookup().create_lookuper().lookup({"id": 7}) == {"id": 7, "v": "x"}
        finally:
            await alice.close()
    finally:
        await revoke_all(admin, "alice")


@pytest.mark.asyncio
async def test_a_lookup_that_inserts_missing_keys_needs_write_as_well(
    secure_server: ServerProcess, admin: Connection
) -> None:
    path = TablePath(DATABASE, unique_name("inserting"))
    await create_pk_table(admin, path, buckets=1)
    resource = Resource.table(path.database_name, path.table_name)
    await grant(admin, "alice", OperationType.READ, resource)
    try:
        async with await Connection.create(strom_config(secure_server, "alice")) as connection:
            table = await connection.get_table(path)
            inserting = table.new_lookup().insert_if_not_exists().create_lookuper()
            with pytest.raises(AuthorizationError, match="may not WRITE"):
                await inserting.lookup({"id": 1})
            assert await table.new_lookup().create_lookuper().lookup({"id": 1}) is None, "nothing was inserted"
            await grant(admin, "alice", OperationType.WRITE, resource)
            assert await inserting.lookup({"id": 1}) == {"id": 1, "v": None}
    finally:
        await revoke_all(admin, "alice")


@pytest.mark.asyncio
async def test_catalog_calls_need_their_operation_and_listings_hide_the_rest(
    secure_server: ServerProcess, admin: Connection
) -> None:
    database = unique_name("db")
    await admin.get_admin().create_database(database)
    path = TablePath(database, "visible")
    await create_pk_table(admin, path, buckets=1)
    await create_pk_table(admin, TablePath(database, "hidden"), buckets=1)
    try:
        async with await Connection.create(strom_config(secure_server, "alice")) as connection:
            alice = connection.get_admin()
            with pytest.raises(AuthorizationError):
                await alice.create_database(unique_name("db"))
            with pytest.raises(AuthorizationError):
                await alice.drop_table(path)
            await grant(admin, "alice", OperationType.DESCRIBE, Resource.table(database, "visible"))
            assert await alice.list_tables(database) == ["visible"]
            assert (await alice.get_table_info(path)).path == path
            with pytest.raises(AuthorizationError):
                await alice.create_table(TablePath(database, "new"), (await alice.get_table_info(path)).descriptor)
            await grant(admin, "alice", OperationType.CREATE, Resource.database(database))
            await alice.create_table(TablePath(database, "new"), (await alice.get_table_info(path)).descriptor)
            with pytest.raises(AuthorizationError):
                await alice.create_acls([AclBinding(Resource.database(database), Principal("User", "bob"), "*",
                                                    OperationType.READ)])
    finally:
        await revoke_all(admin, "alice")


@pytest.mark.asyncio
async def test_super_user_may_do_everything_without_acls(secure_server: ServerProcess, admin: Connection) -> None:
    database = unique_name("db")
    handle = admin.get_admin()
    await handle.create_database(database)
    table = await create_pk_table(admin, TablePath(database, "t"), buckets=2)
    await write_round(table, range(5), "s")
    assert (await table.new_lookup().create_lookuper().lookup({"id": 3})) is not None
    assert database in await handle.list_databases()
    await handle.drop_table(TablePath(database, "t"))
    await handle.drop_database(database)


# ---- the ACL CLI ----
def strom_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "strom.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_acl_cli_adds_lists_and_removes_entries(secure_server: ServerProcess) -> None:
    table = f"{DATABASE}.{unique_name('cli')}"
    login = ["-b", secure_server.address, "--username", "admin", "--password", USERS["admin"]]
    added = strom_cli("acl", "add", "-p", "User:carol", "-o", "READ", "-o", "WRITE", "-t", "TABLE",
                      "-r", table, *login)
    assert added.returncode == 0, added.stderr
    assert "added" in added.stdout

    listed = strom_cli("acl", "list", "-p", "User:carol", "--json", *login)
    assert listed.returncode == 0, listed.stderr
    entries = json.loads(listed.stdout)
    assert sorted(e["operation"] for e in entries) == ["READ", "WRITE"]
    assert {e["resource_name"] for e in entries} == {table}

    removed = strom_cli("acl", "remove", "-p", "User:carol", "-o", "WRITE", "--json", *login)
    assert removed.returncode == 0, removed.stderr
    assert [e["operation"] for e in json.loads(removed.stdout)] == ["WRITE"]
    remaining = json.loads(strom_cli("acl", "list", "-p", "User:carol", "--json", *login).stdout)
    assert [e["operation"] for e in remaining] == ["READ"]
    strom_cli("acl", "remove", "-p", "User:carol", *login)

    leases = strom_cli("lease", "list", "--json", *login)  # the other commands take the same credentials
    assert leases.returncode == 0, leases.stderr
    assert isinstance(json.loads(leases.stdout), list)

    refused = strom_cli("acl", "list", "-b", secure_server.address)
    assert refused.returncode == 1
    assert "code 46" in refused.stderr


# ---- without security configured ----
@pytest.mark.asyncio
async def test_acl_requests_on_an_unsecured_server_report_security_disabled(server: ServerProcess) -> None:
    async with await Connection.create(server.address) as connection:
        with pytest.raises(SecurityDisabledError):
            await connection.get_admin().list_acls()
    connection = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": server.address}))
    try:
        assert DATABASE in await connection.get_admin().list_databases()
    finally:
        await connection.close()
    assert SecurityDisabledError.code == SECURITY_DISABLED


@pytest.mark.asyncio
async def test_a_sasl_client_of_a_plaintext_server_is_refused(server: ServerProcess) -> None:
    config = pyfluss.Config({"bootstrap.servers": server.address, "security.protocol": "sasl",
                             "security.sasl.username": "admin", "security.sasl.password": "admin-secret"})
    with pytest.raises(pyfluss.FlussError) as failure:
        connection = await pyfluss.FlussConnection.create(config)
        try:
            await connection.get_admin().list_databases()
        finally:
            await connection.close()
    assert failure.value.error_code == AUTHENTICATION_FAILED, str(failure.value)


def test_a_sasl_listener_without_users_refuses_to_start(tmp_path: Path) -> None:
    process = ServerProcess(tmp_path / "data", {"bind.listeners": "CLIENT://127.0.0.1:0",
                                                "security.protocol.map": "CLIENT:SASL"})
    with pytest.raises(RuntimeError, match="no users"):
        process.start()


# ---- the documentation's example ----
def test_the_security_docs_example_runs(secure_server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    match = re.search(r"```python\n(.*?)```", docs, re.S)
    assert match, "docs/security.md lost its python example"
    code = match.group(1).replace("127.0.0.1:9123", secure_server.address)
    try:
        exec(compile(code, "docs/security.md example", "exec"), {"__name__": "docs"})
    finally:
        subprocess.run([sys.executable, "-m", "strom.cli.main", "acl", "remove", "-p", "User:alice", "-r", "shop",
                        "-b", secure_server.address, "-u", "admin", "--password", USERS["admin"]],
                       capture_output=True, timeout=60)
    printed = capsys.readouterr().out.splitlines()
    assert "User:alice ALLOW READ on DATABASE:shop from *" in printed[0]
    assert printed[1] == "['shop']"


# ---- two listeners ----
@pytest.mark.asyncio
async def test_a_sasl_listener_and_a_plaintext_listener_serve_the_same_tables(server_factory: Any) -> None:
    plain_port = free_port()
    process = server_factory({
        "bind.listeners": f"CLIENT://127.0.0.1:0,LOCAL://127.0.0.1:{plain_port}",
        "security.protocol.map": "CLIENT:SASL,LOCAL:PLAINTEXT",
        "security.sasl.plain.credentials": "admin:admin-secret",
    })
    plain_address = f"127.0.0.1:{plain_port}"
    local = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": plain_address}))
    try:
        nodes = await local.get_admin().get_server_nodes()
        assert {f"{node.host}:{node.port}" for node in nodes} == {plain_address}  # this listener's address
        path = pyfluss.TablePath(DATABASE, unique_name("two"))
        schema = pyfluss.Schema(pa.schema(FIELDS), primary_keys=["id"])
        await local.get_admin().create_table(path, pyfluss.TableDescriptor(schema))
        table = await local.get_table(path)
        writer = table.new_upsert().create_writer()
        writer.upsert({"id": 1, "v": "local"})
        await writer.flush()
    finally:
        await local.close()

    remote = await pyfluss.FlussConnection.create(pyfluss_config(process, "admin"))
    try:
        table = await remote.get_table(path)
        assert await table.new_lookup().create_lookuper().lookup({"id": 1}) == {"id": 1, "v": "local"}
        nodes = await remote.get_admin().get_server_nodes()
        assert {f"{node.host}:{node.port}" for node in nodes} == {process.address}
    finally:
        await remote.close()
    with pytest.raises(pyfluss.FlussError) as failure:
        anonymous = await pyfluss.FlussConnection.create(pyfluss.Config({"bootstrap.servers": process.address}))
        try:
            await anonymous.get_admin().list_databases()
        finally:
            await anonymous.close()
    assert failure.value.error_code == AUTHENTICATION_FAILED


@pytest.mark.asyncio
async def test_producer_offsets_need_write_to_register_or_delete_and_read_to_see(
    secure_server: ServerProcess, admin: Connection
) -> None:
    readable, hidden = TablePath(DATABASE, unique_name("po_read")), TablePath(DATABASE, unique_name("po_hidden"))
    await create_pk_table(admin, readable, buckets=1)
    await create_pk_table(admin, hidden, buckets=1)
    catalog = admin.get_admin()
    readable_id = (await catalog.get_table_info(readable)).table_id
    hidden_id = (await catalog.get_table_info(hidden)).table_id
    offsets = {TableBucket(readable_id, 0): 4, TableBucket(hidden_id, 0): 9}
    readable_resource = Resource.table(readable.database_name, readable.table_name)
    producer = unique_name("secure_producer")
    try:
        async with await Connection.create(strom_config(secure_server, "alice")) as connection:
            alice = connection.get_admin()
            # tables alice may not DESCRIBE are unknown ids to her
            with pytest.raises(UnknownTableOrBucketError, match=f"^Table id {readable_id} does not exist"):
                await alice.register_producer_offsets(producer, offsets)
            await grant(admin, "alice", OperationType.DESCRIBE, readable_resource)
            with pytest.raises(AuthorizationError, match=readable.table_name):  # WRITE on every table is needed
                await alice.register_producer_offsets(producer, offsets)
            await grant(admin, "alice", OperationType.WRITE, readable_resource)
            with pytest.raises(UnknownTableOrBucketError, match=f"^Table id {hidden_id} does not exist"):
                await alice.register_producer_offsets(producer, offsets)
            await grant(admin, "alice", OperationType.WRITE, Resource.table(hidden.database_name, hidden.table_name))
            await alice.register_producer_offsets(producer, offsets)
            assert await alice.get_producer_offsets(producer) is None  # READ on neither table: as no producer
            await grant(admin, "alice", OperationType.READ, readable_resource)
            found = await alice.get_producer_offsets(producer)
            assert found is not None and found.offsets == {TableBucket(readable_id, 0): 4}
        async with await Connection.create(strom_config(secure_server, "bob")) as connection:
            # bob may not even describe the tables the offsets cover: answered as a producer that does not
            # exist, and nothing is deleted
            assert await connection.get_admin().delete_producer_offsets(producer) is None
        assert (await catalog.get_producer_offsets(producer)).offsets == offsets  # type: ignore[union-attr]
        async with await Connection.create(strom_config(secure_server, "alice")) as connection:
            await connection.get_admin().delete_producer_offsets(producer)
        assert await catalog.get_producer_offsets(producer) is None
    finally:
        await revoke_all(admin, "alice")
