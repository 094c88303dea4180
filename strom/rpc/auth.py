"""Who is on the other end of a connection: the principal a server's connection authenticated as, and what
the RPC layer needs of authentication on either side.

The RPC layer runs the handshake (Fluss's ``Authenticate`` requests) but decides nothing about users: a
server is handed an :class:`Authenticator` (``strom.security`` implements SASL/PLAIN) and a client is
handed :class:`ClientCredentials`, so this layer imports nothing of ``strom.security``.
"""

from __future__ import annotations

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


class Authenticator(Protocol):
    """Checks one ``Authenticate`` request of a connection on a listener that requires authentication."""

    def authenticate(self, mechanism: str, token: bytes) -> Principal:
        """The principal ``token`` proves, for the SASL ``mechanism``.

        Raises:
            AuthenticationError: unknown mechanism, malformed token or wrong credentials.
        """
        ...


class ClientCredentials(Protocol):
    """What a client sends to authenticate: a SASL mechanism and its initial response."""

    @property
    def mechanism(self) -> str: ...

    def token(self) -> bytes: ...


def unauthenticated_error() -> AuthenticationError:
    """The answer to any request but ApiVersions and Authenticate before a connection authenticated."""
    return AuthenticationError(
        "the connection has not authenticated yet: this listener requires SASL; set the client's "
        "'client.security.protocol' to SASL and give it a user name and password"
    )


__all__ = ["ANONYMOUS", "WILDCARD", "Authenticator", "ClientCredentials", "Principal", "unauthenticated_error"]
