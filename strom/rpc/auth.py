"""Who is on the other end of a connection: the principal a server's connection authenticated as, and what
the RPC layer needs of authentication on either side.

The RPC layer runs the handshake (Fluss's ``Authenticate`` requests) but decides nothing about users: a
server is handed an :class:`Authenticator` (``strom.security`` implements SASL/PLAIN) and a client is
handed :class:`ClientCredentials`, so this layer imports nothing of ``strom.security``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from strom.errors import AuthenticationError

WILDCARD = "*"
"""Stands for any name (and, as a principal's type, any type) in ACL entries and the super-user list."""


@dataclass(frozen=True, slots=True, order=True)
class Principal:
    """An authenticated identity, written ``TYPE:NAME`` (SASL/PLAIN users are ``User:<username>``)."""

    type: str
    name: str

    @classmethod
    def parse(cls, text: str) -> Principal:
        """``User:alice`` → Principal("User", "alice").

        Raises:
            ValueError: not ``TYPE:NAME``.
        """
        kind, sep, name = text.strip().partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"a principal is TYPE:NAME, e.g. User:alice; got {text!r}")
        return cls(kind, name)

    def matches(self, other: Principal) -> bool:
        """Whether this principal (of an ACL entry or the super-user list) stands for ``other``."""
        if self.name == WILDCARD and self.type in (WILDCARD, other.type):
            return True
        return self == other

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"


ANONYMOUS = Principal("User", "ANONYMOUS")
"""The principal of a connection on a listener without authentication."""


@dataclass(frozen=True, slots=True)
class Challenge:
    """A step of an exchange that needs another round: its data goes back as the Authenticate answer's
    ``challenge`` and the client answers it."""

    data: bytes


class SaslServerExchange(Protocol):
    """One connection's login on the server's side: a step per ``Authenticate`` request."""

    def step(self, token: bytes) -> Principal | Challenge:
        """The principal once the login is complete, else the challenge to send back.

        Raises:
            AuthenticationError: malformed token or wrong credentials (the exchange is over).
        """
        ...


class Authenticator(Protocol):
    """Begins the login of a connection on a listener that requires (or offers) authentication."""

    def begin(self, mechanism: str) -> SaslServerExchange:
        """Raises AuthenticationError for a SASL mechanism this listener does not enable."""
        ...


class OneStep:
    """A login that completes in one round (SASL/PLAIN): the token is checked by ``check``."""

    def __init__(self, check: Callable[[bytes], Principal]) -> None:
        self._check = check

    def step(self, token: bytes) -> Principal | Challenge:
        return self._check(token)


class SaslClientExchange(Protocol):
    """One connection's login on the client's side."""

    def first(self) -> bytes:
        """The initial response (the first Authenticate token)."""
        ...

    def respond(self, challenge: bytes) -> bytes:
        """The answer to the server's challenge. Raises AuthenticationError when the challenge shows the
        server is not who it must be (a mutual login): nothing more is sent."""
        ...

    def finish(self) -> None:
        """The server answered without a challenge: the login is complete for it. Raises
        AuthenticationError when it is not complete for the client (the server never proved itself)."""
        ...


class ClientCredentials(Protocol):
    """What a client authenticates with: a SASL mechanism and, per connection, its exchange."""

    @property
    def mechanism(self) -> str: ...

    def exchange(self) -> SaslClientExchange: ...


def unauthenticated_error() -> AuthenticationError:
    """The answer to any request but ApiVersions and Authenticate before a connection authenticated."""
    return AuthenticationError(
        "the connection has not authenticated yet: this listener requires SASL; set the client's "
        "'client.security.protocol' to SASL and give it a user name and password"
    )


__all__ = [
    "ANONYMOUS", "WILDCARD", "Authenticator", "Challenge", "ClientCredentials", "OneStep", "Principal",
    "SaslClientExchange", "SaslServerExchange", "unauthenticated_error",
]
