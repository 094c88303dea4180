"""A secured server's settings, shared by the security tests of the client and of the Spark connector."""

from __future__ import annotations

from tests.server_process import ServerProcess

USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret"}
JAAS = (
    "org.apache.fluss.security.auth.sasl.plain.PlainLoginModule required "
    + " ".join(f'user_{name}="{password}"' for name, password in USERS.items())
    + ";"
)
SECURE_CONFIG = {
    "bind.listeners": "CLIENT://127.0.0.1:0",  # the listener's name; the tests' --bind sets the address
    "security.protocol.map": "CLIENT:SASL",
    "security.sasl.enabled.mechanisms": "PLAIN",
    "security.sasl.plain.jaas.config": JAAS,
    "authorizer.enabled": "true",
    "super.users": "User:admin",
    "kv.snapshot.interval": "200ms",
}


def strom_config(server: ServerProcess, user: str) -> dict[str, str]:
    """strom client options for ``user``, under Fluss's client option names."""
    return strom_config_at(server.address, user)


def strom_config_at(address: str, user: str) -> dict[str, str]:
    """:func:`strom_config` for a server known by its address (one running in the test's process)."""
    return {
        "bootstrap.servers": address,
        "client.security.protocol": "SASL",
        "client.security.sasl.mechanism": "PLAIN",
        "client.security.sasl.username": user,
        "client.security.sasl.password": USERS[user],
    }
