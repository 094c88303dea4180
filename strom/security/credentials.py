"""The credentials a client sends, read from its options under Fluss's client option names.

``client.security.protocol`` (``PLAINTEXT`` or ``SASL``), ``client.security.sasl.mechanism`` (``PLAIN``),
``client.security.sasl.username`` and ``client.security.sasl.password`` — or, instead of the last two,
``client.security.sasl.jaas.config`` (``org.apache.fluss.security.auth.sasl.plain.PlainLoginModule required
username="alice" password="alice-secret";``). pyfluss's spellings without the ``client.`` prefix
(``security.protocol``, ``security.sasl.username``…) are accepted too, so one options map serves both clients.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from strom.errors import AuthenticationError
from strom.security.authenticator import PLAIN_MECHANISM, SUPPORTED_MECHANISMS
from strom.security.tls import client_option, client_protocol, uses_sasl

PROTOCOL = "client.security.protocol"
MECHANISM = "client.security.sasl.mechanism"
USERNAME = "client.security.sasl.username"
PASSWORD = "client.security.sasl.password"
JAAS_CONFIG = "client.security.sasl.jaas.config"

_JAAS_OPTION = re.compile(r"""\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)\"""")


@dataclass(frozen=True, slots=True)
class SaslCredentials:
    username: str
    password: str = field(repr=False)
    mechanism: str = PLAIN_MECHANISM

    def token(self) -> bytes:
        """The SASL/PLAIN initial response: no authorization id, NUL, user name, NUL, password."""
        return b"\x00" + self.username.encode() + b"\x00" + self.password.encode()

    def exchange(self) -> PlainExchange:
        return PlainExchange(self.token())


class PlainExchange:
    """SASL/PLAIN on the client's side: the token, and no challenge ever."""

    def __init__(self, token: bytes) -> None:
        self._token = token

    def first(self) -> bytes:
        return self._token

    def respond(self, challenge: bytes) -> bytes:
        raise AuthenticationError("SASL/PLAIN completes in one round, but the server sent a challenge")

    def finish(self) -> None:
        return None


def credentials_from_config(config: Mapping[str, str]) -> SaslCredentials | None:
    """The SASL credentials the options ask for (SASL or SASL_SSL), or None (PLAINTEXT, SSL).

    Raises:
        ValueError: an unknown protocol or mechanism, or SASL without a user name and password.
    """
    protocol = client_protocol(config)
    if not uses_sasl(protocol):
        return None
    mechanism = (client_option(config, MECHANISM) or PLAIN_MECHANISM).strip().upper()
    if mechanism not in SUPPORTED_MECHANISMS:
        raise ValueError(f"{MECHANISM}: strom's client implements {sorted(SUPPORTED_MECHANISMS)}, got {mechanism!r}")
    username, password = client_option(config, USERNAME), client_option(config, PASSWORD)
    jaas = client_option(config, JAAS_CONFIG)
    if jaas and (username is None or password is None):
        found = {key: re.sub(r"\\(.)", r"\1", value) for key, value in _JAAS_OPTION.findall(jaas)}
        username = username if username is not None else found.get("username")
        password = password if password is not None else found.get("password")
    if not username or password is None:
        raise ValueError(f"{PROTOCOL}={protocol} needs {USERNAME} and {PASSWORD} (or {JAAS_CONFIG})")
    return SaslCredentials(username, password, mechanism)
