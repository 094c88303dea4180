"""What a server's security configuration amounts to: its listeners, whether each requires SASL (and
with which users), and whether requests are authorized (and by whom).

Built once at start from the configuration (only the SASL/PLAIN users change at run time:
:meth:`ServerSecurity.apply`); a bad setting stops the server with a clear message rather than leaving it
open by accident (a SASL listener without users, an unknown mechanism or protocol).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from strom.config import (
    AUTHORIZER_ENABLED,
    BIND_LISTENERS,
    INTERNAL_LISTENER_NAME,
    SECURITY_INTERNAL_ALLOW_UNAUTHENTICATED,
    SECURITY_INTERNAL_SECRET,
    SECURITY_PROTOCOL_MAP,
    SECURITY_SASL_ENABLED_MECHANISMS,
    SECURITY_SASL_PLAIN_CREDENTIALS,
    SECURITY_SASL_PLAIN_JAAS_CONFIG,
    SECURITY_SSL_CERTIFICATE,
    SECURITY_SSL_CLIENT_AUTH,
    SECURITY_SSL_KEY,
    SECURITY_SSL_TRUSTSTORE,
    SECURITY_SSL_VERIFY_HOSTNAME,
    SUPER_USERS,
    Configuration,
)
from strom.errors import InvalidConfigError
from strom.ids import TablePath
from strom.metadata.store import MetadataStore
from strom.rpc.api_keys import ApiKey
from strom.rpc.auth import Principal
from strom.rpc.endpoints import Endpoint, internal_listener, parse_endpoints
from strom.rpc.server import Handler
from strom.security.access import AccessControl, ProducerTableIds, no_producer_tables
from strom.security.authenticator import (
    SUPPORTED_MECHANISMS,
    PlainAuthenticator,
    parse_plain_credentials,
    parse_plain_jaas_users,
)
from strom.security.authorizer import Authorizer, parse_super_users
from strom.security.internal import InternalAuthenticator, InternalCredentials, guard_server_requests
from strom.security.tls import (
    PLAINTEXT,
    PROTOCOLS,
    SASL,
    SASL_SSL,
    SSL,
    client_context,
    server_context,
    uses_sasl,
    uses_tls,
)

log = logging.getLogger(__name__)


def parse_listeners(text: str) -> list[Endpoint]:
    """``bind.listeners``: ``HOST:PORT`` or ``NAME://HOST:PORT[,NAME://HOST:PORT…]``, the first being the main
    listener.

    Raises:
        InvalidConfigError: none, a repeated name or port, or not that form.
    """
    return parse_endpoints(text, BIND_LISTENERS.key)


def main_listener_protocol(listeners: str | None, protocol_map: str | None) -> str:
    """The protocol (PLAINTEXT, SASL, SSL, SASL_SSL) of the main listener of ``bind.listeners``."""
    return parse_protocol_map(protocol_map or "").get(parse_listener(listeners or "127.0.0.1:9123").name, PLAINTEXT)


def parse_listener(text: str) -> Endpoint:
    """The main (first) listener of ``bind.listeners``."""
    return parse_listeners(text)[0]


def parse_protocol_map(text: str) -> dict[str, str]:
    """``CLIENT:SASL,INTERNAL:PLAINTEXT`` → {"CLIENT": "SASL", "INTERNAL": "PLAINTEXT"}.

    Raises:
        InvalidConfigError: an entry is not ``NAME:PROTOCOL`` or names a protocol strom lacks.
    """
    protocols: dict[str, str] = {}
    for entry in text.split(","):
        if not entry.strip():
            continue
        name, sep, protocol = entry.strip().partition(":")
        protocol = protocol.strip().upper()
        if not sep or not name.strip():
            raise InvalidConfigError(f"security.protocol.map entries are NAME:PROTOCOL, got {entry.strip()!r}")
        if protocol not in PROTOCOLS:
            raise InvalidConfigError(f"security.protocol.map: protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
        protocols[name.strip().upper()] = protocol
    return protocols


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    listener: Endpoint
    authenticator: PlainAuthenticator | None
    """Set when the listener requires SASL."""
    tls: ssl.SSLContext | None = None
    """Set when the listener speaks TLS (SSL, SASL_SSL)."""

    @property
    def protocol(self) -> str:
        """PLAINTEXT, SASL, SSL or SASL_SSL: what the listener asks of a client."""
        sasl = self.authenticator is not None
        if self.tls is not None:
            return SASL_SSL if sasl else SSL
        return SASL if sasl else PLAINTEXT


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    listener: Endpoint
    authenticator: PlainAuthenticator | None
    authorizer: Authorizer | None
    extra_listeners: tuple[ListenerSecurity, ...] = ()
    """The listeners after the first of ``bind.listeners``, each with its own port and protocol."""
    internal_secret: str | None = None
    """``security.internal.secret``: the servers of a cluster authenticate each other with it."""
    trust_any_server: bool = False
    """``security.internal.allow-unauthenticated``: serve control requests to anyone (insecure)."""
    tls: ssl.SSLContext | None = None
    """The main listener's TLS, when it speaks TLS."""
    peer_tls: ssl.SSLContext | None = None
    """How this server reaches the other servers of its cluster when their internal listener speaks TLS."""
    internal_listener: str = ""
    """The listener the servers of a cluster reach each other on (``internal.listener.name``)."""

    def apply(self, config: Configuration) -> None:
        """Cluster configs changed at run time: the SASL/PLAIN users of every SASL listener (a change that
        would leave no user is not applied: nobody could log in to undo it)."""
        users = plain_users(config)
        found = [self.authenticator, *(extra.authenticator for extra in self.extra_listeners)]
        authenticators = [authenticator for authenticator in found if authenticator is not None]
        if not authenticators:
            return
        if not users:
            log.error("the SASL/PLAIN users were not changed: the new settings leave no user")
            return
        for authenticator in authenticators:
            authenticator.replace_users(users)
        log.info("SASL/PLAIN users are now %s", sorted(users))

    def internal_authenticator(self, *server_names: str) -> InternalAuthenticator | None:
        """How this server checks the logins of the others of its cluster (None without a secret);
        ``server_names``: who it is (``coordinator``, ``tablet-server-<id>``)."""
        return InternalAuthenticator(self.internal_secret, server_names) if self.internal_secret else None

    def internal_credentials(self, server_name: str) -> Callable[[str], InternalCredentials] | None:
        """How this server, ``server_name``, logs in to another of its cluster, by the other's name (None
        without a secret)."""
        if not self.internal_secret:
            return None
        own = InternalCredentials(self.internal_secret, server_name)
        return own.toward

    @property
    def protocol(self) -> str:
        """The main listener's protocol."""
        return ListenerSecurity(self.listener, self.authenticator, self.tls).protocol

    @property
    def listeners(self) -> tuple[Endpoint, ...]:
        """Every listener of ``bind.listeners`` (as configured: port 0 stays 0), the main one first."""
        return (self.listener, *(extra.listener for extra in self.extra_listeners))

    @classmethod
    def from_config(
        cls, config: Configuration, store: MetadataStore, listener_text: str | None = None, *, cluster: bool = False
    ) -> ServerSecurity:
        """``cluster``: a cluster's server, which needs an internal listener (``internal.listener.name``) and
        reaches the others with its protocol.

        Raises:
            InvalidConfigError: a setting that cannot be honoured.
        """
        listener, *extra = parse_listeners(listener_text or config.get(BIND_LISTENERS) or "127.0.0.1:9123")
        protocols = parse_protocol_map(config.get(SECURITY_PROTOCOL_MAP) or "")

        def authenticator_of(listener: Endpoint) -> PlainAuthenticator | None:
            return _plain_authenticator(config) if uses_sasl(protocols.get(listener.name, PLAINTEXT)) else None

        def tls_of(listener: Endpoint) -> ssl.SSLContext | None:
            if not uses_tls(protocols.get(listener.name, PLAINTEXT)):
                return None
            return server_context(config.get(SECURITY_SSL_CERTIFICATE), config.get(SECURITY_SSL_KEY),
                                  config.get(SECURITY_SSL_TRUSTSTORE), config.get(SECURITY_SSL_CLIENT_AUTH))

        authenticator = authenticator_of(listener)
        tls = tls_of(listener)
        extra_listeners = tuple(ListenerSecurity(other, authenticator_of(other), tls_of(other)) for other in extra)
        internal = internal_listener([listener, *extra], config.get(INTERNAL_LISTENER_NAME)) if cluster else listener.name
        peer_tls = None
        if cluster and uses_tls(protocols.get(internal, PLAINTEXT)):  # the other servers' internal listeners too
            try:
                peer_tls = client_context(config.get(SECURITY_SSL_TRUSTSTORE), config.get(SECURITY_SSL_CERTIFICATE),
                                          config.get(SECURITY_SSL_KEY), config.get(SECURITY_SSL_VERIFY_HOSTNAME))
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise InvalidConfigError(f"cannot build the TLS context for the other servers: {exc}") from None
        authorizer = None
        if config.get(AUTHORIZER_ENABLED):
            try:
                super_users = parse_super_users(config.get(SUPER_USERS))
            except ValueError as exc:
                raise InvalidConfigError(f"super.users: {exc}") from None
            authorizer = Authorizer(store, super_users)
        secret = config.get(SECURITY_INTERNAL_SECRET) or None
        trust_any = bool(config.get(SECURITY_INTERNAL_ALLOW_UNAUTHENTICATED)) and secret is None
        return cls(listener, authenticator, authorizer, extra_listeners, secret, trust_any, tls, peer_tls, internal)

    def guard(
        self,
        handlers: Mapping[ApiKey, Handler],
        table_path_by_id: Callable[[int], TablePath | None],
        lease_table_ids: Callable[[str, Principal], Iterable[int]],
        partition_table_id: Callable[[int], int | None],
        producer_table_ids: ProducerTableIds = no_producer_tables,
    ) -> dict[ApiKey, Handler]:
        """``handlers`` behind their authorization rules: requests only servers send are refused to anyone
        else (unless ``trust_any_server``), and the ACL rules apply when authorization is on."""
        guarded = dict(handlers) if self.trust_any_server else guard_server_requests(handlers)
        if self.authorizer is None:
            return guarded
        access = AccessControl(self.authorizer, table_path_by_id, lease_table_ids, partition_table_id,
                               producer_table_ids)
        return {key: access.guard(key, handler) for key, handler in guarded.items()}


def _plain_authenticator(config: Configuration) -> PlainAuthenticator:
    mechanisms = frozenset(
        m.strip().upper() for m in (config.get(SECURITY_SASL_ENABLED_MECHANISMS) or "").split(",") if m.strip()
    )
    unsupported = mechanisms - SUPPORTED_MECHANISMS
    if not mechanisms or unsupported:
        raise InvalidConfigError(
            f"security.sasl.enabled.mechanisms: strom implements {sorted(SUPPORTED_MECHANISMS)}, "
            f"got {sorted(mechanisms)}"
        )
    users = plain_users(config)
    if not users:
        raise InvalidConfigError(
            "the listener requires SASL but no users are configured: set security.sasl.plain.jaas.config "
            "or security.sasl.plain.credentials"
        )
    return PlainAuthenticator(users, mechanisms)


def plain_users(config: Configuration) -> dict[str, str]:
    """SASL/PLAIN users: ``security.sasl.plain.jaas.config``'s, then ``security.sasl.plain.credentials``'s
    (a user in both gets the second password)."""
    users: dict[str, str] = {}
    jaas = config.get(SECURITY_SASL_PLAIN_JAAS_CONFIG)
    if jaas:
        users.update(parse_plain_jaas_users(jaas))
    credentials = config.get(SECURITY_SASL_PLAIN_CREDENTIALS)
    if credentials:
        users.update(parse_plain_credentials(credentials))
    return users
