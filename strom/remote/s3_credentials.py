"""S3 credentials of remote storage: what the server's own s3fs uses, and the security token clients get
from GetFileSystemSecurityToken (api key 1025) to read remote log segments straight from the store.

Fluss's S3 token, as its clients read it: ``schema`` "s3"; ``token`` the JSON
``{"access_key_id", "access_key_secret", "security_token"}``; ``expiration_time`` epoch milliseconds when
the credentials are short-lived (a client refreshes them before then); ``addition_info`` the Hadoop-style
``fs.s3a.endpoint``, ``fs.s3a.endpoint.region`` / ``fs.s3a.region`` and ``fs.s3a.path.style.access``.

Where the credentials come from, as in Fluss: STS when ``s3.assumed.role.sts.endpoint`` (or a role) is set
— GetSessionToken, or AssumeRole with ``s3.assumed.role.arn`` — else the server's static keys (``s3.*``
options, else the environment). Short-lived credentials are cached until a fifth of their life is left.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strom.config import (
    S3_ACCESS_KEY,
    S3_ASSUMED_ROLE_ARN,
    S3_ASSUMED_ROLE_STS_ENDPOINT,
    S3_ENDPOINT,
    S3_PATH_STYLE_ACCESS,
    S3_REGION,
    S3_SECRET_KEY,
    Configuration,
)
from strom.errors import InvalidConfigError, StorageError
from strom.remote.storage import RemoteStorage

S3_SCHEMES = ("s3", "s3a")
DEFAULT_REGION = "us-east-1"
RENEW_AT_LIFE_LEFT = 0.2


@dataclass(frozen=True, slots=True)
class S3Settings:
    """The S3 store of remote storage, from Fluss's ``s3.*`` options (with their ``s3.access.key``-style
    aliases) and the environment s3fs reads."""

    access_key: str | None
    secret_key: str | None
    session_token: str | None
    endpoint: str | None
    region: str
    path_style: bool
    role_arn: str | None = None
    sts_endpoint: str | None = None

    @classmethod
    def from_config(cls, config: Configuration) -> S3Settings:
        raw = config.to_dict()

        def first(option: Any, *aliases: str) -> str | None:
            value = config.get(option)
            for alias in aliases:
                value = value or raw.get(alias)
            return None if value is None else str(value)

        access = first(S3_ACCESS_KEY, "s3.access.key") or os.environ.get("AWS_ACCESS_KEY_ID")
        secret = first(S3_SECRET_KEY, "s3.secret.key") or os.environ.get("AWS_SECRET_ACCESS_KEY")
        if (access is None) != (secret is None):
            raise InvalidConfigError("S3 access key and secret key must both be set or both be unset")
        path_style = (first(S3_PATH_STYLE_ACCESS, "s3.path-style-access") or "false").strip().lower() == "true"
        return cls(
            access_key=access, secret_key=secret,
            session_token=None if config.get(S3_ACCESS_KEY) else os.environ.get("AWS_SESSION_TOKEN"),
            endpoint=config.get(S3_ENDPOINT) or os.environ.get("FSSPEC_S3_ENDPOINT_URL"),
            region=config.get(S3_REGION) or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
            path_style=path_style,
            role_arn=config.get(S3_ASSUMED_ROLE_ARN), sts_endpoint=config.get(S3_ASSUMED_ROLE_STS_ENDPOINT),
        )

    def storage_options(self) -> dict[str, Any]:
        """s3fs's options for the server's own reads and writes (only what is set: s3fs reads the rest from
        the environment)."""
        options: dict[str, Any] = {}
        if self.access_key is not None:
            options.update(key=self.access_key, secret=self.secret_key)
            if self.session_token:
                options["token"] = self.session_token
        if self.endpoint:
            options["endpoint_url"] = self.endpoint
        options["client_kwargs"] = {"region_name": self.region}
        if self.path_style:
            options["config_kwargs"] = {"s3": {"addressing_style": "path"}}
        return options

    def addition_info(self) -> dict[str, str]:
        info = {"fs.s3a.region": self.region, "fs.s3a.endpoint.region": self.region,
                "fs.s3a.path.style.access": "true" if self.path_style else "false"}
        if self.endpoint:
            info["fs.s3a.endpoint"] = self.endpoint
        return info


@dataclass(frozen=True, slots=True)
class SecurityToken:
    schema: str
    token: bytes
    expiration_ms: int | None
    addition_info: Mapping[str, str] = field(default_factory=dict)


def _credentials_json(access_key: str, secret_key: str, session_token: str | None) -> bytes:
    return json.dumps({"access_key_id": access_key, "access_key_secret": secret_key,
                       "security_token": session_token}).encode()


class S3TokenProvider:
    """Hands clients credentials for the remote store; thread-safe, caches short-lived ones."""

    def __init__(self, settings: S3Settings, scheme: str = "s3") -> None:
        self.settings = settings
        self.scheme = scheme
        self._lock = threading.Lock()
        self._cached: tuple[SecurityToken, int] | None = None
        """The last short-lived token and when it was issued (epoch ms)."""

    def token(self) -> SecurityToken:
        """Blocks on STS when short-lived credentials are due (call it off the event loop).

        Raises:
            StorageError: STS refused or could not be reached (the client may ask again).
            InvalidConfigError: no credentials are configured to hand out.
        """
        settings = self.settings
        if settings.sts_endpoint is None and settings.role_arn is None:
            if settings.access_key is None or settings.secret_key is None:
                raise InvalidConfigError("no S3 credentials to hand out: set s3.access-key and s3.secret-key")
            return SecurityToken(self.scheme, _credentials_json(settings.access_key, settings.secret_key,
                                                                settings.session_token), None, settings.addition_info())
        with self._lock:
            now_ms = int(time.time() * 1000)
            if self._cached is not None:
                cached, issued_ms = self._cached
                assert cached.expiration_ms is not None
                if cached.expiration_ms - now_ms > RENEW_AT_LIFE_LEFT * (cached.expiration_ms - issued_ms):
                    return cached
            token = self._from_sts()
            self._cached = (token, now_ms)
            return token

    def _from_sts(self) -> SecurityToken:
        try:
            import botocore.session  # the s3 extra's (s3fs brings it)
        except ImportError as exc:
            raise InvalidConfigError(f"short-lived S3 credentials need botocore: pip install 'strom[s3]' ({exc})") from exc
        settings = self.settings
        session = botocore.session.get_session()
        client = session.create_client(
            "sts", region_name=settings.region, endpoint_url=settings.sts_endpoint,
            aws_access_key_id=settings.access_key, aws_secret_access_key=settings.secret_key,
            aws_session_token=settings.session_token,
        )
        try:
            if settings.role_arn:
                answer = client.assume_role(RoleArn=settings.role_arn, RoleSessionName=f"strom-{uuid.uuid4()}")
            else:
                answer = client.get_session_token()
        except Exception as exc:  # botocore's many errors: the store's STS refused or is unreachable
            raise StorageError(f"STS did not issue S3 credentials: {exc}") from exc
        credentials = answer["Credentials"]
        expiration_ms = int(credentials["Expiration"].timestamp() * 1000)
        return SecurityToken(self.scheme, _credentials_json(credentials["AccessKeyId"], credentials["SecretAccessKey"],
                                                            credentials.get("SessionToken")),
                             expiration_ms, settings.addition_info())


def scheme_of(root: str) -> str:
    return root.split("://", 1)[0].lower() if "://" in root else "file"


def remote_storage(root: str, config: Configuration) -> RemoteStorage:
    """Remote storage at ``root``, on S3 with the ``s3.*`` options' credentials and endpoint."""
    if scheme_of(root) in S3_SCHEMES:
        return RemoteStorage(root, S3Settings.from_config(config).storage_options())
    return RemoteStorage(root)


def token_provider(root: str, config: Configuration) -> S3TokenProvider | None:
    """What GetFileSystemSecurityToken hands out for remote storage at ``root`` (None: a local root, which
    clients read without credentials)."""
    scheme = scheme_of(root)
    return S3TokenProvider(S3Settings.from_config(config), scheme) if scheme in S3_SCHEMES else None


__all__ = ["S3Settings", "S3TokenProvider", "SecurityToken", "remote_storage", "scheme_of", "token_provider"]
