"""Which strom connection serves a request: the shared one, or the caller's own.

Anonymous requests share one :class:`~strom.client.Connection` per gateway process. A request with HTTP
Basic credentials runs on a connection that logged in to the cluster with those credentials as SASL/PLAIN,
so the cluster's ACLs judge the gateway's users exactly as its RPC users. Those connections are cached per
(user, password) — a wrong password never reuses another login — and the least recently used is closed
beyond ``max_user_connections``. A bearer token (:mod:`strom.gateway.tokens`) stands for the login its
token file names, and runs on that user's connection alike.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping

from strom.client import Connection
from strom.errors import AuthenticationError
from strom.gateway.tokens import BearerTokenError, BearerTokens

log = logging.getLogger(__name__)

_SASL_KEYS = ("client.security.sasl.username", "client.security.sasl.password", "client.security.sasl.jaas.config",
              "security.sasl.username", "security.sasl.password", "security.sasl.jaas.config")


def basic_credentials(authorization: str | None) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization: Basic`` header; None without one.

    Raises:
        AuthenticationError: a Basic header that does not decode to ``user:password``.
    """
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "basic":
        raise AuthenticationError(f"unsupported authorization scheme {scheme!r}; the gateway takes Basic or Bearer")
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
    except (binascii.Error, ValueError):
        raise AuthenticationError("the Basic credentials do not decode to user:password") from None
    if not sep or not user:
        raise AuthenticationError("the Basic credentials do not decode to user:password")
    return user, password


def request_credentials(authorization: str | None, tokens: BearerTokens) -> tuple[str, str] | None:
    """(user, password) a request logs in with: its Basic credentials, or the login its bearer token stands
    for; None without an ``Authorization`` header.

    Raises:
        AuthenticationError: malformed Basic credentials, an unknown bearer token (BearerTokenError), or
            another scheme.
    """
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() == "bearer":
        if not value.strip():
            raise BearerTokenError("the bearer token is empty")
        return tokens.login(value.strip())
    return basic_credentials(authorization)


class GatewayConnections:
    """The shared anonymous connection and a bounded cache of per-user connections."""

    def __init__(
        self, client_config: Mapping[str, str], max_user_connections: int = 64,
        on_evict: Callable[[Connection], None] | None = None,
    ) -> None:
        """``on_evict`` is told of each user connection closed for room, so what was kept for it goes too."""
        self._config = dict(client_config)
        self._on_evict = on_evict
        self._max_users = max(1, max_user_connections)
        self._anonymous: Connection | None = None
        self._anonymous_lock = asyncio.Lock()
        self._users: OrderedDict[tuple[str, bytes], Connection] = OrderedDict()
        self._user_locks: dict[tuple[str, bytes], asyncio.Lock] = {}
        self._salt = os.urandom(16)
        self._closing: set[asyncio.Task[None]] = set()

    async def anonymous(self) -> Connection:
        """The shared connection, opened on first use (and again after a failed attempt)."""
        if self._anonymous is None:
            async with self._anonymous_lock:
                if self._anonymous is None:
                    self._anonymous = await Connection.create(self._config)
        return self._anonymous

    async def for_user(self, user: str, password: str) -> Connection:
        """The connection logged in as ``user``. Raises AuthenticationError for wrong credentials."""
        key = (user, hashlib.sha256(self._salt + password.encode()).digest())
        connection = self._users.get(key)
        if connection is not None:
            self._users.move_to_end(key)
            return connection
        lock = self._user_locks.setdefault(key, asyncio.Lock())
        async with lock:
            connection = self._users.get(key)
            if connection is None:
                config = {k: v for k, v in self._config.items() if k not in _SASL_KEYS}
                protocol = config.get("client.security.protocol", config.get("security.protocol", "PLAINTEXT"))
                config.update({
                    "client.security.protocol": "SASL_SSL" if protocol.upper().endswith("SSL") else "SASL",
                    "client.security.sasl.mechanism": "PLAIN",
                    "client.security.sasl.username": user,
                    "client.security.sasl.password": password,
                })
                config.pop("security.protocol", None)
                try:
                    connection = await Connection.create(config)
                finally:
                    self._user_locks.pop(key, None)
                self._users[key] = connection
                while len(self._users) > self._max_users:
                    _evicted_key, evicted = self._users.popitem(last=False)
                    if self._on_evict is not None:
                        self._on_evict(evicted)
                    task = asyncio.get_running_loop().create_task(_close_later(evicted))
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)
        return connection

    @property
    def user_connection_count(self) -> int:
        return len(self._users)

    async def close(self) -> None:
        for task in list(self._closing):
            task.cancel()
        connections = list(self._users.values())
        self._users.clear()
        if self._anonymous is not None:
            connections.append(self._anonymous)
            self._anonymous = None
        for connection in connections:
            try:
                await connection.close()
            except Exception:  # closing on shutdown: nothing left to tell
                log.debug("closing a gateway connection failed", exc_info=True)


async def _close_later(connection: Connection, grace_s: float = 30.0) -> None:
    """Close an evicted connection once the requests still running on it had time to finish."""
    await asyncio.sleep(grace_s)
    try:
        await connection.close()
    except Exception:
        log.debug("closing an evicted gateway connection failed", exc_info=True)
