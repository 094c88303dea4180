"""SASL/PLAIN pieces without a server: the JAAS and credentials forms of the server's users, token checks,
the client's credentials from its options, and the listener and protocol-map settings."""

from __future__ import annotations

import pytest

from strom.config import Configuration
from strom.errors import AuthenticationError, InvalidConfigError
from strom.rpc.endpoints import Endpoint
from strom.security.acl import Principal
from strom.security.authenticator import PlainAuthenticator, parse_plain_credentials, parse_plain_jaas_users
from strom.security.credentials import SaslCredentials, credentials_from_config
from strom.security.server_security import parse_listener, parse_listeners, parse_protocol_map

MODULE = "org.apache.fluss.security.auth.sasl.plain.PlainLoginModule"


def test_jaas_config_lists_the_users_of_the_plain_login_module() -> None:
    jaas = f'{MODULE} required user_admin="admin-secret" user_alice="a;b \\"c\\"" debug=true;'
    assert parse_plain_jaas_users(jaas) == {"admin": "admin-secret", "alice": 'a;b "c"'}


@pytest.mark.parametrize("jaas", [
    'com.example.Other required user_a="b";',
    f'{MODULE} required user_a="b"',  # no terminating semicolon
    f'{MODULE} whenever user_a="b";',
])
def test_jaas_config_of_another_form_is_refused(jaas: str) -> None:
    with pytest.raises(InvalidConfigError):
        parse_plain_jaas_users(jaas)


def test_credentials_map_is_user_colon_password() -> None:
    assert parse_plain_credentials("admin:admin-secret, bob:b:c") == {"admin": "admin-secret", "bob": "b:c"}
    with pytest.raises(InvalidConfigError):
        parse_plain_credentials("nopassword")


def test_plain_token_proves_a_user_and_nothing_else() -> None:
    authenticator = PlainAuthenticator({"alice": "secret"})
    assert authenticator.authenticate("PLAIN", b"\x00alice\x00secret") == Principal("User", "alice")
    assert authenticator.authenticate("plain", b"alice\x00alice\x00secret") == Principal("User", "alice")
    for token in (b"\x00alice\x00wrong", b"\x00bob\x00secret", b"alice\x00secret", b"\x00\x00secret", b"\x00alice\x00",
                  b"bob\x00alice\x00secret"):
        with pytest.raises(AuthenticationError):
            authenticator.authenticate("PLAIN", token)
    with pytest.raises(AuthenticationError, match="mechanism"):
        authenticator.authenticate("SCRAM-SHA-256", b"\x00alice\x00secret")


def test_client_credentials_come_from_fluss_option_names() -> None:
    assert credentials_from_config({"bootstrap.servers": "h:1"}) is None
    credentials = credentials_from_config({
        "client.security.protocol": "SASL", "client.security.sasl.username": "alice",
        "client.security.sasl.password": "secret",
    })
    assert credentials == SaslCredentials("alice", "secret")
    assert credentials.token() == b"\x00alice\x00secret"
    assert "secret" not in repr(credentials)
    from_jaas = credentials_from_config({
        "client.security.protocol": "sasl",
        "client.security.sasl.jaas.config": f'{MODULE} required username="bob" password="pw";',
    })
    assert from_jaas == SaslCredentials("bob", "pw")
    pyfluss_names = credentials_from_config(
        {"security.protocol": "sasl", "security.sasl.username": "carol", "security.sasl.password": "pw"}
    )
    assert pyfluss_names == SaslCredentials("carol", "pw")
    with pytest.raises(ValueError, match="username"):
        credentials_from_config({"client.security.protocol": "SASL"})
    assert credentials_from_config({"client.security.protocol": "SSL"}) is None  # TLS without SASL: no login
    with pytest.raises(ValueError, match="must be one of PLAINTEXT, SASL, SSL, SASL_SSL"):
        credentials_from_config({"client.security.protocol": "TLS"})


def test_listener_is_named_or_defaults_to_fluss() -> None:
    assert parse_listener("127.0.0.1:9123") == Endpoint("FLUSS", "127.0.0.1", 9123)
    assert parse_listener("client://0.0.0.0:0") == Endpoint("CLIENT", "0.0.0.0", 0)
    assert parse_listeners("CLIENT://h:1, internal://h2:0") == [Endpoint("CLIENT", "h", 1), Endpoint("INTERNAL", "h2", 0)]
    with pytest.raises(InvalidConfigError, match="repeats"):
        parse_listeners("CLIENT://h:1,client://h:2")
    with pytest.raises(InvalidConfigError, match="name every listener"):
        parse_listeners("h:1,CLIENT://h:2")
    with pytest.raises(InvalidConfigError, match="the same port"):
        parse_listeners("CLIENT://h:1,INTERNAL://h2:1")
    assert parse_protocol_map("CLIENT:sasl, internal:PLAINTEXT") == {"CLIENT": "SASL", "INTERNAL": "PLAINTEXT"}
    with pytest.raises(InvalidConfigError):
        parse_protocol_map("CLIENT:GSSAPI")


def test_sasl_listener_without_users_stops_the_server(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from strom.metadata.sqlite_store import SqliteMetadataStore
    from strom.security.server_security import ServerSecurity

    store = SqliteMetadataStore(str(tmp_path / "m.sqlite"))
    try:
        config = Configuration({"bind.listeners": "CLIENT://127.0.0.1:0", "security.protocol.map": "CLIENT:SASL"})
        with pytest.raises(InvalidConfigError, match="no users"):
            ServerSecurity.from_config(config, store)
        other_listener = Configuration({"security.protocol.map": "CLIENT:SASL"})  # the default listener is FLUSS
        assert ServerSecurity.from_config(other_listener, store).authenticator is None
    finally:
        store.close()


def test_tiering_service_takes_client_credentials_from_its_defines() -> None:
    from strom.tiering.app import options_from
    from strom.tiering.tasks import RoundContext

    options = options_from(
        {"client.security.protocol": "SASL", "client.security.sasl.username": "tiering",
         "client.security.sasl.password": "pw", "tiering.poll.table.interval": "5s"},
        "127.0.0.1:9123", "job", once=True,
    )
    assert credentials_from_config(options.client_config) == SaslCredentials("tiering", "pw")
    assert options.client_config["bootstrap.servers"] == "127.0.0.1:9123"
    context = RoundContext("127.0.0.1:9123", None, None, 0, None, options.client_options)  # type: ignore[arg-type]
    assert credentials_from_config(context.client_config) == SaslCredentials("tiering", "pw")
    with pytest.raises(ValueError, match="unknown tiering options"):
        options_from({"security.sasl.username": "x"}, "127.0.0.1:9123", "job", once=True)
