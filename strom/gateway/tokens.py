"""Bearer tokens: ``Authorization: Bearer <token>`` mapped to a cluster principal.

The token file (``-D gateway.auth.token-file=PATH``) holds only each token's SHA-256, never the token, and
the SASL/PLAIN login the gateway makes for it::

    {"tokens": [{"sha256": "<64 hex digits>", "user": "alice", "password": "alice-secret"}]}

A request with a known token then runs on that user's own connection, exactly as with HTTP Basic, so the
cluster's ACLs judge it the same way. The file is read once, at start; a malformed one stops the start.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strom.errors import AuthenticationError

_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_ENTRY_KEYS = {"sha256", "user", "password"}
_OPTIONAL_KEYS = {"comment"}


class TokenFileError(ValueError):
    """The token file cannot be read or is not of the documented form; the message names the problem."""


class BearerTokenError(AuthenticationError):
    """A bearer token the gateway does not know (answered 401 with a ``Bearer`` challenge)."""


@dataclass(frozen=True, slots=True)
class _Token:
    digest: bytes
    user: str
    password: str


class BearerTokens:
    """The tokens of a token file; :meth:`login` maps a presented token to its (user, password)."""

    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens = tokens

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    @classmethod
    def none(cls) -> BearerTokens:
        return cls([])

    @classmethod
    def load(cls, path: str | Path) -> BearerTokens:
        """Read and check a token file. Raises TokenFileError naming the file and what is wrong."""
        where = f"gateway.auth.token-file {str(path)!r}"
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise TokenFileError(f"{where} cannot be read: {exc.strerror or exc}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TokenFileError(f"{where} is not valid JSON: {exc}") from None
        if not isinstance(document, Mapping) or set(document) != {"tokens"} or not isinstance(document["tokens"], list):
            raise TokenFileError(f'{where} must be a JSON object {{"tokens": [...]}}')
        tokens: list[_Token] = []
        for index, entry in enumerate(document["tokens"]):
            tokens.append(_entry(entry, f"{where}: tokens[{index}]"))
        digests = [token.digest for token in tokens]
        if len(set(digests)) != len(digests):
            raise TokenFileError(f"{where} lists the same sha256 twice")
        return cls(tokens)

    def login(self, token: str) -> tuple[str, str]:
        """(user, password) of ``token``. Raises BearerTokenError for one the file does not hold.

        Every digest is compared, each in constant time, so the answer's timing says nothing about how
        close a guess came.
        """
        presented = hashlib.sha256(token.encode()).digest()
        found: _Token | None = None
        for candidate in self._tokens:
            if hmac.compare_digest(candidate.digest, presented):
                found = candidate
        if found is None:
            raise BearerTokenError("unknown bearer token")
        return found.user, found.password


def _entry(entry: Any, where: str) -> _Token:
    if not isinstance(entry, Mapping):
        raise TokenFileError(f'{where} must be an object {{"sha256", "user", "password"}}')
    missing = sorted(_ENTRY_KEYS - set(entry))
    unknown = sorted(set(entry) - _ENTRY_KEYS - _OPTIONAL_KEYS)
    if missing or unknown:
        raise TokenFileError(f"{where}: " + "; ".join(
            ([f"missing {missing}"] if missing else []) + ([f"unknown keys {unknown}"] if unknown else [])
        ))
    digest, user, password = entry["sha256"], entry["user"], entry["password"]
    if not isinstance(digest, str) or not _HEX_SHA256.fullmatch(digest):
        raise TokenFileError(f"{where}: sha256 must be 64 hex digits (the token's SHA-256, not the token)")
    if not isinstance(user, str) or not user:
        raise TokenFileError(f"{where}: user must be a non-empty string")
    if not isinstance(password, str):
        raise TokenFileError(f"{where}: password must be a string")
    return _Token(bytes.fromhex(digest), user, password)
