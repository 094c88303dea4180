"""SASL/PLAIN users added and removed while the server runs (Fluss's dynamic
``security.sasl.plain.credentials``): a new user logs in (strom's client and pyfluss) without a restart, a
removed one is refused, a change that would leave nobody is not applied, and the users survive a restart."""

from __future__ import annotations

from pathlib import Path

import fluss as pyfluss
import pytest

from strom.client import Connection
from strom.errors import AuthenticationError, InvalidConfigError
from tests.integration.security_support import USERS, strom_config
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

CONFIG = {
    "bind.listeners": "CLIENT://127.0.0.1:0",
    "security.protocol.map": "CLIENT:SASL",
    "security.sasl.enabled.mechanisms": "PLAIN",
    "security.sasl.plain.credentials": f"admin:{USERS['admin']}",
    "authorizer.enabled": "true",
    "super.users": "User:admin;User:bob",  # bob may change the users once he exists
}
KEY = "security.sasl.plain.credentials"


async def _logs_in(server: ServerProcess, user: str) -> bool:
    try:
        async with await Connection.create(strom_config(server, user)) as connection:
            await connection.get_admin().list_databases()
        return True
    except AuthenticationError:
        return False


async def test_users_are_added_and_removed_without_a_restart(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", CONFIG).start()
    try:
        assert await _logs_in(server, "admin") and not await _logs_in(server, "bob")
        both = f"admin:{USERS['admin']},bob:{USERS['bob']}"
        async with await Connection.create(strom_config(server, "admin")) as admin:
            await admin.get_admin().alter_cluster_configs({KEY: both}, [])
            assert await _logs_in(server, "bob"), "a user added at run time logs in at once"
            official = await pyfluss.FlussConnection.create(pyfluss.Config({
                "bootstrap.servers": server.address, "security.protocol": "sasl", "security.sasl.mechanism": "PLAIN",
                "security.sasl.username": "bob", "security.sasl.password": USERS["bob"]}))
            try:
                assert "fluss" in await official.get_admin().list_databases(), "pyfluss logs in as bob"
            finally:
                await official.close()
            with pytest.raises(InvalidConfigError):
                await admin.get_admin().alter_cluster_configs({KEY: "nobody"}, [])  # no password: refused whole
            entries = {e.key: e for e in await admin.get_admin().describe_cluster_configs()}
            assert entries[KEY].value != both, "credentials are listed without their passwords"
        server.stop()

        server = ServerProcess(tmp_path / "data", CONFIG, server.port).start()
        assert await _logs_in(server, "bob"), "the change survives a restart"
        async with await Connection.create(strom_config(server, "bob")) as bob:
            await bob.get_admin().alter_cluster_configs({KEY: f"bob:{USERS['bob']}"}, [])
        assert not await _logs_in(server, "admin"), "a removed user is refused"
        assert await _logs_in(server, "bob")
    finally:
        server.stop()
