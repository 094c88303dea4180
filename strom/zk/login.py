"""How strom's servers (and its tools) reach ZooKeeper: the digest identity they act as, and TLS where
ZooKeeper's port speaks it. Free of kazoo, so a server on the embedded store reads its settings without it."""

from __future__ import annotations

from dataclasses import dataclass

from strom.config import (
    ZOOKEEPER_AUTH_DIGEST,
    ZOOKEEPER_SSL_CLIENT_ENABLE,
    ZOOKEEPER_SSL_KEYSTORE,
    ZOOKEEPER_SSL_TRUSTSTORE,
    Configuration,
)


@dataclass(frozen=True)
class ZooKeeperLogin:
    """``digest``: ``user:password`` of ZooKeeper's digest scheme (``zookeeper.auth.digest``). ``tls``: the
    port speaks TLS; the server's certificate is checked against ``truststore`` (PEM CAs; the system's when
    None) and its host name; ``keystore`` (PEM: a certificate chain and its private key) is presented to a
    ZooKeeper that wants client certificates."""

    digest: str | None = None
    tls: bool = False
    truststore: str | None = None
    keystore: str | None = None

    @classmethod
    def from_config(cls, config: Configuration) -> ZooKeeperLogin:
        return cls(config.get(ZOOKEEPER_AUTH_DIGEST), config.get(ZOOKEEPER_SSL_CLIENT_ENABLE),
                   config.get(ZOOKEEPER_SSL_TRUSTSTORE), config.get(ZOOKEEPER_SSL_KEYSTORE))

    def tls_options(self) -> dict[str, object]:
        """kazoo's ``KazooClient`` options for TLS (none without it)."""
        if not self.tls:
            return {}
        options: dict[str, object] = {"use_ssl": True, "verify_certs": True, "check_hostname": True}
        if self.truststore:
            options["ca"] = self.truststore
        if self.keystore:
            options.update(certfile=self.keystore, keyfile=self.keystore)
        return options


__all__ = ["ZooKeeperLogin"]
