"""How the servers of a cluster authenticate to each other, and which requests only they may send.

Fluss's servers trust whoever connects (its docs ask for network isolation); strom's do not. The servers
of a cluster share one secret (``security.internal.secret``) and log in to each other with the SASL
mechanism :data:`INTERNAL_MECHANISM`, a mutual challenge-response over it (in the manner of SCRAM, RFC
5802, with the shared secret as the key):

1. the connecting server sends its name, the name of the server it means to reach and a fresh nonce;
2. the server answers with a nonce of its own and a proof (an HMAC-SHA256 under the secret of both names
   and both nonces): the connecting server checks it and goes no further with a server that cannot make it
   (a fake registration learns nothing);
3. the connecting server sends its own proof over the same fields; the server checks it, and that it is
   the server meant.

Nothing seen on the wire logs in again: every proof covers the other side's fresh nonce. The secret never
travels. A login relayed to another server fails, since it names the server it was meant for. The
connection's principal becomes ``Server:<name>`` (``Server:coordinator``, ``Server:tablet-server-<id>``),
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
import secrets
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field

from strom.errors import AuthenticationError, AuthorizationError
from strom.rpc.api_keys import ApiKey
from strom.rpc.auth import Challenge, Principal, SaslServerExchange
from strom.rpc.messages import Message
from strom.rpc.server import Handler, RequestContext
from strom.security.authenticator import PlainAuthenticator

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


_NONCE_BYTES = 32
_SERVER_LABEL = b"strom-internal-2 server"
_CLIENT_LABEL = b"strom-internal-2 client"


def _mac(secret: str, label: bytes, *fields: bytes) -> bytes:
    """HMAC-SHA256 under the secret of the label and the fields, each length-prefixed (unambiguous)."""
    message = label + b"".join(len(f).to_bytes(2, "big") + f for f in fields)
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest().encode()


def _nonce() -> bytes:
    return secrets.token_hex(_NONCE_BYTES).encode()


def _is_nonce(data: bytes) -> bool:
    return len(data) == 2 * _NONCE_BYTES and all(c in b"0123456789abcdef" for c in data)


def _fields(token: bytes, count: int, what: str) -> list[bytes]:
    fields = token.split(b"\0")
    if len(token) > _TOKEN_SIZE_BYTES_MAX or len(fields) != count:
        raise AuthenticationError(f"authentication failed: malformed server login ({what})")
    return fields


@dataclass(frozen=True, slots=True)
class InternalCredentials:
    """What a server logs in to another with (``ClientCredentials`` of the RPC client): its name and the
    name of the server it means to reach (``target``)."""

    secret: str = field(repr=False)
    name: str
    target: str = COORDINATOR_NAME
    mechanism: str = INTERNAL_MECHANISM

    def toward(self, target: str) -> InternalCredentials:
        return InternalCredentials(self.secret, self.name, target)

    def exchange(self) -> InternalClientExchange:
        return InternalClientExchange(self)


class InternalClientExchange:
    """The connecting server's side of one login."""

    def __init__(self, credentials: InternalCredentials) -> None:
        self._credentials = credentials
        self._nonce = _nonce()
        self._verified = False

    def first(self) -> bytes:
        c = self._credentials
        return b"\0".join((c.name.encode(), c.target.encode(), self._nonce))

    def respond(self, challenge: bytes) -> bytes:
        c = self._credentials
        server_nonce, proof = _fields(challenge, 2, "challenge")
        expected = _mac(c.secret, _SERVER_LABEL, c.name.encode(), c.target.encode(), self._nonce, server_nonce)
        if self._verified or not _is_nonce(server_nonce) or not hmac.compare_digest(proof, expected):
            raise AuthenticationError(
                f"the server reached as {c.target} could not prove it knows the cluster's secret: it is not a server "
                "of this cluster (a stale or forged registration?); nothing more is sent to it"
            )
        self._verified = True
        return _mac(c.secret, _CLIENT_LABEL, c.name.encode(), c.target.encode(), self._nonce, server_nonce)

    def finish(self) -> None:
        if not self._verified:
            raise AuthenticationError(f"the server reached as {self._credentials.target} accepted a server login "
                                      "without proving it knows the cluster's secret: it is not a server of this cluster")


class InternalAuthenticator:
    """Checks servers' logins against the shared secret; ``names``: who this server is (a login meant for
    another server is refused)."""

    def __init__(self, secret: str, names: Iterable[str]) -> None:
        self._secret = secret
        self._names = frozenset(names)

    def begin(self, mechanism: str) -> InternalServerExchange:
        if mechanism != INTERNAL_MECHANISM:
            raise AuthenticationError("authentication failed: not a server login")
        return InternalServerExchange(self._secret, self._names)


class InternalServerExchange:
    """The reached server's side of one login."""

    def __init__(self, secret: str, names: frozenset[str]) -> None:
        self._secret = secret
        self._names = names
        self._first: tuple[bytes, bytes, bytes, bytes] | None = None

    def step(self, token: bytes) -> Principal | Challenge:
        if self._first is None:
            name, target, client_nonce = _fields(token, 3, "first message")
            if (not _SERVER_NAME.fullmatch(name.decode("ascii", errors="replace"))
                    or not _is_nonce(client_nonce) or target.decode("ascii", errors="replace") not in self._names):
                raise AuthenticationError("authentication failed: invalid server login")
            server_nonce = _nonce()
            self._first = (name, target, client_nonce, server_nonce)
            proof = _mac(self._secret, _SERVER_LABEL, name, target, client_nonce, server_nonce)
            return Challenge(server_nonce + b"\0" + proof)
        name, target, client_nonce, server_nonce = self._first
        (proof,) = _fields(token, 1, "proof")
        if not hmac.compare_digest(proof, _mac(self._secret, _CLIENT_LABEL, name, target, client_nonce, server_nonce)):
            raise AuthenticationError("authentication failed: invalid server credentials")
        return server_principal(name.decode())


class ListenerAuthenticator:
    """A listener's logins: servers with :data:`INTERNAL_MECHANISM`, clients with the listener's SASL
    mechanisms (none on a PLAINTEXT listener)."""

    def __init__(self, clients: PlainAuthenticator | None, servers: InternalAuthenticator | None) -> None:
        self._clients = clients
        self._servers = servers

    def begin(self, mechanism: str) -> SaslServerExchange:
        if mechanism == INTERNAL_MECHANISM:
            if self._servers is None:
                raise AuthenticationError("authentication failed: this listener accepts no server logins")
            return self._servers.begin(mechanism)
        if self._clients is None:
            raise AuthenticationError("this listener does not use SASL")
        return self._clients.begin(mechanism)


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
