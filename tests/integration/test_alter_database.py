"""AlterDatabase (api key 1060) against a real server through strom's client: custom properties set and
reset, the comment replaced or removed, a missing database, persistence across a restart, the ALTER ACL,
and bad input answered with a clear error while the server keeps serving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from strom.client import Connection
from strom.errors import AuthorizationError, DatabaseNotExistError, UnknownServerError
from strom.records.schema import DatabaseDescriptor
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.security.acl import AclBinding, AclFilter, OperationType, Principal, Resource
from tests.conftest import unique_name
from tests.integration.security_support import SECURE_CONFIG, strom_config
from tests.server_process import ServerProcess

pytestmark = pytest.mark.timeout(90)


@pytest_asyncio.fixture
async def connection(server: ServerProcess) -> AsyncIterator[Connection]:
    async with await Connection.create(server.address) as opened:
        yield opened


async def new_database(connection: Connection, comment: str | None = None, **properties: str) -> str:
    name = unique_name("db")
    await connection.get_admin().create_database(name, DatabaseDescriptor(comment, properties))
    return name


@pytest.mark.asyncio
async def test_properties_are_set_and_reset_and_the_modified_time_moves(connection: Connection) -> None:
    admin = connection.get_admin()
    name = await new_database(connection, "orders", owner="qa", tier="1")
    created = await admin.get_database_info(name)
    await asyncio.sleep(0.005)

    await admin.alter_database(name, set_properties={"tier": "2", "region": "eu"}, reset_properties=["owner"])

    info = await admin.get_database_info(name)
    assert info.descriptor == DatabaseDescriptor("orders", {"tier": "2", "region": "eu"})
    assert info.created_time == created.created_time
    assert info.modified_time > created.modified_time
    await admin.alter_database(name, reset_properties=["tier", "region", "never-set"])
    assert (await admin.get_database_info(name)).descriptor == DatabaseDescriptor("orders", {})


@pytest.mark.asyncio
async def test_a_key_both_set_and_reset_ends_up_reset(connection: Connection) -> None:
    admin = connection.get_admin()
    name = await new_database(connection, k="old")
    await admin.alter_database(name, set_properties={"k": "new"}, reset_properties=["k"])
    assert (await admin.get_database_info(name)).descriptor.custom_properties == {}


@pytest.mark.asyncio
async def test_the_comment_is_replaced_kept_or_removed(connection: Connection) -> None:
    admin = connection.get_admin()
    name = await new_database(connection, "first", owner="qa")
    await admin.alter_database(name, comment="second")
    assert (await admin.get_database_info(name)).descriptor == DatabaseDescriptor("second", {"owner": "qa"})
    await admin.alter_database(name, set_properties={"a": "b"})  # no comment given: it stays
    assert (await admin.get_database_info(name)).descriptor.comment == "second"
    await admin.alter_database(name, comment="")  # Fluss: an empty comment removes it
    assert (await admin.get_database_info(name)).descriptor == DatabaseDescriptor(
        None, {"owner": "qa", "a": "b"}
    )


@pytest.mark.asyncio
async def test_a_change_to_nothing_leaves_the_database_untouched(connection: Connection) -> None:
    admin = connection.get_admin()
    name = await new_database(connection, "same", owner="qa")
    before = await admin.get_database_info(name)
    await asyncio.sleep(0.005)
    await admin.alter_database(name)
    await admin.alter_database(
        name, set_properties={"owner": "qa"}, reset_properties=["absent"], comment="same"
    )
    assert await admin.get_database_info(name) == before


@pytest.mark.asyncio
async def test_a_missing_database_raises_unless_ignored(connection: Connection) -> None:
    admin = connection.get_admin()
    missing = unique_name("missing")
    with pytest.raises(DatabaseNotExistError, match=missing):
        await admin.alter_database(missing, set_properties={"a": "b"})
    await admin.alter_database(missing, set_properties={"a": "b"}, ignore_if_not_exists=True)
    assert not await admin.database_exists(missing)


@pytest.mark.asyncio
async def test_an_unsupported_op_type_is_refused_clearly_and_the_server_keeps_serving(
    connection: Connection,
) -> None:
    admin = connection.get_admin()
    name = await new_database(connection, owner="qa")
    before = await admin.get_database_info(name)
    for op_type in (2, 3, 99, -1):  # APPEND, SUBTRACT (list options only), unknown ones
        request = pb.AlterDatabaseRequest(database_name=name, ignore_if_not_exists=False)
        request.config_changes.add(config_key="owner", config_value="x", op_type=op_type)
        with pytest.raises(UnknownServerError, match=f"op type {op_type} on 'owner'"):
            await connection.coordinator_request(ApiKey.ALTER_DATABASE, request)
    valueless = pb.AlterDatabaseRequest(database_name=name, ignore_if_not_exists=False)
    valueless.config_changes.add(config_key="owner", op_type=0)
    with pytest.raises(UnknownServerError, match="'owner' needs a value"):
        await connection.coordinator_request(ApiKey.ALTER_DATABASE, valueless)
    assert await admin.get_database_info(name) == before  # nothing of a refused request was applied
    await admin.alter_database(name, set_properties={"owner": "ops"})  # the same connection still works
    assert (await admin.get_database_info(name)).descriptor.custom_properties == {"owner": "ops"}


@pytest.mark.asyncio
async def test_invalid_utf8_in_a_change_is_refused_without_a_server_traceback(
    connection: Connection, server: ServerProcess
) -> None:
    name = await new_database(connection)
    request = pb.AlterDatabaseRequest(database_name=name, ignore_if_not_exists=False, comment="cccc")
    request.config_changes.add(config_key="kkkk", config_value="vvvv", op_type=0)
    body = request.SerializeToString()
    for field, bad in ((b"vvvv", b"v\xffvv"), (b"kkkk", b"k\xffkk"), (b"cccc", b"c\xfecc")):
        broken = pb.AlterDatabaseRequest.FromString(body.replace(field, bad))
        with pytest.raises(UnknownServerError, match=r"not (valid )?UTF-8"):
            await connection.coordinator_request(ApiKey.ALTER_DATABASE, broken)
    assert "ALTER_DATABASE" not in server.log_text()  # clear errors, not handler failures


@pytest.mark.asyncio
async def test_the_change_survives_a_restart(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    first = server_factory(data_dir=data_dir)
    async with await Connection.create(first.address) as connection:
        admin = connection.get_admin()
        await admin.create_database("shop", DatabaseDescriptor("before", {"owner": "qa", "tier": "1"}))
        await admin.alter_database(
            "shop", set_properties={"tier": "2"}, reset_properties=["owner"], comment="after"
        )
        altered = await admin.get_database_info("shop")
    assert first.stop() == 0
    second = server_factory(data_dir=data_dir, port=first.port)
    async with await Connection.create(second.address) as connection:
        assert await connection.get_admin().get_database_info("shop") == altered
    assert altered.descriptor == DatabaseDescriptor("after", {"tier": "2"})


# ---- authorization ----
@pytest.fixture(scope="module")
def secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("secure-alter") / "data", SECURE_CONFIG).start()
    yield process
    assert process.stop() == 0, process.log_text()[-3000:]
    assert not process.internal_errors()


@pytest.mark.asyncio
async def test_altering_a_database_needs_alter_on_it(secure_server: ServerProcess) -> None:
    async with await Connection.create(strom_config(secure_server, "admin")) as admin_connection:
        admin = admin_connection.get_admin()
        name = unique_name("db")
        await admin.create_database(name, DatabaseDescriptor("kept", {"owner": "qa"}))
        try:
            async with await Connection.create(strom_config(secure_server, "alice")) as alice_connection:
                alice = alice_connection.get_admin()
                with pytest.raises(AuthorizationError):
                    await alice.alter_database(name, set_properties={"owner": "alice"})
                with pytest.raises(AuthorizationError):  # checked before existence, as in Fluss
                    await alice.alter_database(unique_name("missing"), comment="x", ignore_if_not_exists=True)
                await admin.create_acls(
                    [
                        AclBinding(
                            Resource.database(name), Principal("User", "alice"), "*", OperationType.DESCRIBE
                        )
                    ]
                )
                with pytest.raises(AuthorizationError):
                    await alice.alter_database(name, set_properties={"owner": "alice"})
                assert (await admin.get_database_info(name)).descriptor == DatabaseDescriptor(
                    "kept", {"owner": "qa"}
                )

                await admin.create_acls(
                    [
                        AclBinding(
                            Resource.database(name), Principal("User", "alice"), "*", OperationType.ALTER
                        )
                    ]
                )
                await alice.alter_database(name, set_properties={"owner": "alice"}, comment="hers")
                assert (await alice.get_database_info(name)).descriptor == DatabaseDescriptor(
                    "hers", {"owner": "alice"}
                )
        finally:
            await admin.drop_acls([AclFilter(principal=Principal("User", "alice"))])
