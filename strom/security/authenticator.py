"""SASL/PLAIN authentication of connections on listeners that require it.

Fluss's handshake: on a SASL listener a connection may send ``ApiVersions`` and ``Authenticate`` only;
anything else before authentication completes is answered with an authentication error (code 46).
``Authenticate`` carries the mechanism (``protocol``: ``PLAIN``) and the SASL token; PLAIN completes in
one round (RFC 4616: ``[authzid] NUL authcid NUL passwd``), so the response carries no challenge and the
connection's principal becomes ``User:<authcid>``. A wrong user or password is an authentication error and
the connection stays unauthenticated (the client may try again).

The server's users come from ``security.sasl.plain.jaas.config`` (Fluss's JAAS form,
``org.apache.fluss.security.auth.sasl.plain.PlainLoginModule required user_admin="admin-secret";``) or
from ``security.sasl.plain.credentials`` (``admin:admin-secret,bob:bob-secret``).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

from strom.errors import AuthenticationError, InvalidConfigError
from strom.rpc.auth import ANONYMOUS, OneStep, Principal

PLAIN_MECHANISM = "PLAIN"
SUPPORTED_MECHANISMS = frozenset({PLAIN_MECHANISM})
PLAIN_LOGIN_MODULE = "org.apache.fluss.security.auth.sasl.plain.PlainLoginModule"
PLAIN_TOKEN_SIZE_BYTES_MAX = 64 * 1024
"""A PLAIN token is a user name and a password; anything longer is refused before it is split."""

_JAAS_ENTRY = re.compile(
    r"""\s*(?P<module>[A-Za-z_$][\w.$]*)\s+(?P<flag>required|requisite|sufficient|optional)\b(?P<options>.*?);\s*""",
    re.DOTALL,
)
_JAAS_OPTION = re.compile(r"""\s*(?P<key>[^\s=]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;"]+))""")


def parse_plain_jaas_users(jaas_config: str) -> dict[str, str]:
    """The users (``user_<name>="<password>"`` options) of a PlainLoginModule JAAS entry.

    Raises:
        InvalidConfigError: not exactly one ``<module> <flag> options… ;`` entry of the PLAIN login module.
    """
    match = _JAAS_ENTRY.fullmatch(jaas_config)
    if match is None:
        raise InvalidConfigError(
            "security.sasl.plain.jaas.config must be one entry ending in ';', e.g. "
            f'{PLAIN_LOGIN_MODULE} required user_admin="admin-secret";'
        )
    if match.group("module") != PLAIN_LOGIN_MODULE:
        raise InvalidConfigError(f"security.sasl.plain.jaas.config must use {PLAIN_LOGIN_MODULE}, not {match.group('module')}")
    users: dict[str, str] = {}
    options = match.group("options")
    position = 0
    while options[position:].strip():
        option = _JAAS_OPTION.match(options, position)
        if option is None:
            raise InvalidConfigError(f"cannot parse the JAAS options at {options[position:].strip()[:40]!r}")
        position = option.end()
        key = option.group("key")
        if option.group("quoted") is not None:
            value = re.sub(r"\\(.)", r"\1", option.group("quoted"))
        else:
            value = option.group("bare")
        if key.startswith("user_") and len(key) > len("user_"):
            users[key[len("user_"):]] = value
    return users


def parse_plain_credentials(credentials: str) -> dict[str, str]:
    """``admin:admin-secret,bob:bob-secret`` → {"admin": "admin-secret", "bob": "bob-secret"}.

    Raises:
        InvalidConfigError: an entry is not ``user:password``.
    """
    users: dict[str, str] = {}
    for entry in credentials.split(","):
        if not entry.strip():
            continue
        user, sep, password = entry.strip().partition(":")
        if not sep or not user:
            raise InvalidConfigError(f"security.sasl.plain.credentials entries are user:password, got {entry.strip()!r}")
        users[user] = password
    return users


@dataclass(slots=True)
class PlainAuthenticator:
    """Checks SASL/PLAIN tokens against a set of users; shared by every connection of a listener. The users
    change only as a whole (:meth:`replace_users`, on the event loop), so a login sees one set or the other."""

    users: Mapping[str, str]
    mechanisms: frozenset[str] = SUPPORTED_MECHANISMS

    def replace_users(self, users: Mapping[str, str]) -> None:
        """The users changed at run time (``security.sasl.plain.credentials``): new logins check these;
        connections already logged in stay so."""
        self.users = dict(users)

    def begin(self, mechanism: str) -> OneStep:
        """A connection's login: SASL/PLAIN completes in one round."""
        self._check_mechanism(mechanism)
        return OneStep(lambda token: self.authenticate(mechanism, token))

    def _check_mechanism(self, mechanism: str) -> None:
        if mechanism.upper() not in self.mechanisms:
            raise AuthenticationError(
                f"the server enables SASL mechanisms {sorted(self.mechanisms)}; the client asked for {mechanism!r}"
            )

    def authenticate(self, mechanism: str, token: bytes) -> Principal:
        """The principal a token proves.

        Raises:
            AuthenticationError: a mechanism this listener does not enable, a malformed token, an unknown
                user or a wrong password (one message for both, so it does not reveal which users exist).
        """
        self._check_mechanism(mechanism)
        if len(token) > PLAIN_TOKEN_SIZE_BYTES_MAX:
            raise AuthenticationError("the SASL/PLAIN token is too long")
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationError("a SASL/PLAIN token is [authzid] NUL username NUL password")
        try:
            authorization_id, username, password = (part.decode("utf-8") for part in parts)
        except UnicodeDecodeError:
            raise AuthenticationError("the SASL/PLAIN token is not UTF-8") from None
        if not username:
            raise AuthenticationError("the SASL/PLAIN token names no user")
        if not password:
            raise AuthenticationError("the SASL/PLAIN token carries no password")
        expected = self.users.get(username)
        # compare_digest on both paths, so a wrong user and a wrong password take the same time
        matches = hmac.compare_digest(password.encode(), (expected if expected is not None else "\x00" + password).encode())
        if expected is None or not matches:
            raise AuthenticationError("authentication failed: invalid username or password")
        if authorization_id and authorization_id != username:
            raise AuthenticationError("authentication failed: a user may not act as another (authzid differs)")
        return Principal("User", username)


__all__ = [
    "ANONYMOUS",
    "PLAIN_MECHANISM",
    "PlainAuthenticator",
    "parse_plain_credentials",
    "parse_plain_jaas_users",
]
