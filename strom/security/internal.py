"""How the servers of a cluster authenticate to each other, and which requests only they may send.

Fluss's servers trust whoever connects (its docs ask for network isolation); strom's do not. The servers
of a cluster share one secret (``security.internal.secret``). Each authenticates its connections to the
others with the SASL mechanism :data:`INTERNAL_MECHANISM`: its server name and an HMAC-SHA256 of that name
under the secret, so the secret itself never travels and a server cannot name itself another without it.
The connection's principal becomes ``Server:<name>`` (``Server:coordinator``, ``Server:tablet-server-<id>``),
a principal type no client login can produce.

The requests in :data:`SERVER_ONLY_KEYS`, and a FetchLog that names a follower, are refused with
Fluss's authorization error unless they come from a server principal (the follower's own, for a fetch),
on every listener and whether or not ACLs are enforced: a plain client cannot delete replicas, depose the
coordinator, or pose as a follower to move the high watermark.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import re
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field

from strom.errors import AuthenticationError, AuthorizationError
from strom.rpc.api_keys import ApiKey
from strom.rpc.auth import Authenticator, Principal
from strom.rpc.messages import Message
from strom.rpc.server import Handler, RequestContext

INTERNAL_MECHANISM = "STROM-INTERNAL"
"""The SASL mechanism of server-to-server logins (never offered to clients)."""
SERVER_PRINCIPAL_TYPE = "Server"
COORDINATOR_NAME = "coordinator"
_SERVER_NAME = re.compile(r"coordinator|tablet-server-\d{1,10}")
_TOKEN_SIZE_BYTES_MAX = 256

SERVER_ONLY_KEYS = frozenset({
    ApiKey.UPDATE_METADATA,
    ApiKey.NOTIFY_LEADER_AND_ISR,
    ApiKey.STOP_REPLICA,
    ApiKey.ADJUST_ISR,
    ApiKey.COMMIT_KV_SNAPSHOT,
    ApiKey.COMMIT_REMOTE_LOG_MANIFEST,
    ApiKey.NOTIFY_REMOTE_LOG_OFFSETS,
    ApiKey.NOTIFY_KV_SNAPSHOT_OFFSET,
    ApiKey.NOTIFY_LAKE_TABLE_OFFSET,
    ApiKey.CONTROLLED_SHUTDOWN,
})
"""Requests that only a cluster's own servers send (coordinator ↔ tablet servers)."""


def tablet_server_name(server_id: int) -> str:
    return f"tablet-server-{server_id}"


def server_principal(name: str) -> Principal:
    return Principal(SERVER_PRINCIPAL_TYPE, name)


def is_server(principal: Principal | None) -> bool:
    """Whether ``principal`` is one of the cluster's servers (only :class:`InternalAuthenticator` makes them)."""
    return principal is not None and principal.type == SERVER_PRINCIPAL_TYPE


def _proof(secret: str, name: str) -> str:
    return hmac.new(secret.encode(), b"strom-internal:" + name.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class InternalCredentials:
    """What a server sends to authenticate to another (``ClientCredentials`` of the RPC client)."""

    secret: str = field(repr=False)
    name: str
    mechanism: str = INTERNAL_MECHANISM

    def token(self) -> bytes:
        return f"{self.name}\0{_proof(self.secret, self.name)}".encode()


class InternalAuthenticator:
    """Checks a server's login against the shared secret."""

    def __init__(self, secret: str) -> None:
        self._secret = secret

    def authenticate(self, mechanism: str, token: bytes) -> Principal:
        if mechanism != INTERNAL_MECHANISM or len(token) > _TOKEN_SIZE_BYTES_MAX:
            raise AuthenticationError("authentication failed: not a server login")
        raw_name, sep, proof = token.partition(b"\0")
        name = raw_name.decode("ascii", errors="replace")
        expected = _proof(self._secret, name).encode()
        # bytes on both sides: compare_digest refuses a str with non-ASCII characters (a malformed proof
        # must fail like a wrong one, not raise)
        if not sep or not _SERVER_NAME.fullmatch(name) or not hmac.compare_digest(proof, expected):
            raise AuthenticationError("authentication failed: invalid server credentials")
        return server_principal(name)


class ListenerAuthenticator:
    """A listener's logins: servers with :data:`INTERNAL_MECHANISM`, clients with the listener's SASL
    mechanisms (none on a PLAINTEXT listener)."""

    def __init__(self, clients: Authenticator | None, servers: InternalAuthenticator | None) -> None:
        self._clients = clients
        self._servers = servers

    def authenticate(self, mechanism: str, token: bytes) -> Principal:
        if mechanism == INTERNAL_MECHANISM:
            if self._servers is None:
                raise AuthenticationError("authentication failed: this server accepts no server logins")
            return self._servers.authenticate(mechanism, token)
        if self._clients is None:
            raise AuthenticationError("this listener does not use SASL")
        return self._clients.authenticate(mechanism, token)


def _check(key: ApiKey, request: Message, context: RequestContext) -> None:
    if key is ApiKey.FETCH_LOG:
        follower = request.follower_server_id  # type: ignore[attr-defined]
        if follower < 0:
            return  # a client's fetch: the ACL rules (if any) decide
        if context.principal != server_principal(tablet_server_name(follower)):
            raise AuthorizationError(
                f"only tablet server {follower} may fetch as follower {follower}; {context.principal} may not"
            )
    elif key is ApiKey.CONTROLLED_SHUTDOWN:
        server = request.tablet_server_id  # type: ignore[attr-defined]
        if context.principal != server_principal(tablet_server_name(server)):
            raise AuthorizationError(f"only tablet server {server} may shut itself down; {context.principal} may not")
    elif not is_server(context.principal):
        raise AuthorizationError(f"{key.name} is sent only by the cluster's servers; {context.principal} may not")


def guard_server_requests(handlers: Mapping[ApiKey, Handler]) -> dict[ApiKey, Handler]:
    """``handlers`` with :data:`SERVER_ONLY_KEYS` and follower fetches refused to anyone but servers; a plain
    handler stays plain (it still runs inline)."""
    guarded: dict[ApiKey, Handler] = dict(handlers)
    for key, handler in handlers.items():
        if key in SERVER_ONLY_KEYS or key is ApiKey.FETCH_LOG:
            guarded[key] = _guarded(key, handler)
    return guarded


def _guarded(key: ApiKey, handler: Handler) -> Handler:
    if inspect.iscoroutinefunction(handler):
        async def checked_async(request: Message, context: RequestContext) -> Message:
            _check(key, request, context)
            return await handler(request, context)  # type: ignore[no-any-return, misc]

        return checked_async

    def checked(request: Message, context: RequestContext) -> Message | Awaitable[Message]:
        _check(key, request, context)
        return handler(request, context)

    return checked


__all__ = [
    "COORDINATOR_NAME",
    "INTERNAL_MECHANISM",
    "SERVER_ONLY_KEYS",
    "InternalAuthenticator",
    "InternalCredentials",
    "ListenerAuthenticator",
    "guard_server_requests",
    "is_server",
    "server_principal",
    "tablet_server_name",
]
