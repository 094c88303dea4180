"""A private certificate authority for one cluster (``strom cluster start --secure``), made with
``cryptography``: a CA certificate, and one server certificate it signs for the hosts the cluster's
members listen on, valid for both ends of a connection between two servers.

The CA's private key is used once and never written: nobody who later reads the data directory can mint a
certificate the cluster trusts. The server key is written readable by its owner only. Keys are ECDSA P-256
(fast handshakes); certificates carry the extensions strict verifiers ask for (key identifiers, key usage),
so Python's strict X.509 mode accepts them too.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # cryptography comes with an extra: imported where certificates are made
    from cryptography import x509

CA_FILE = "ca.pem"
CERTIFICATE_FILE = "server.pem"
KEY_FILE = "server.key"
DEFAULT_HOSTS = ("127.0.0.1", "::1", "localhost")
DEFAULT_VALID_DAYS = 365


@dataclass(frozen=True)
class ClusterCertificates:
    """The PEM files of a cluster's private CA in ``directory``: ``ca.pem`` (what clients and servers
    trust), ``server.pem`` and ``server.key`` (what every server presents)."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / CA_FILE

    @property
    def certificate(self) -> Path:
        return self.directory / CERTIFICATE_FILE

    @property
    def key(self) -> Path:
        return self.directory / KEY_FILE

    def exists(self) -> bool:
        return self.ca.exists() and self.certificate.exists() and self.key.exists()

    def server_config(self) -> dict[str, str]:
        """The ``security.ssl.*`` settings of a server presenting these files and trusting the CA (for the
        other servers of its cluster)."""
        return {"security.ssl.certificate": str(self.certificate), "security.ssl.key": str(self.key),
                "security.ssl.truststore": str(self.ca)}

    @classmethod
    def create(cls, directory: Path, hosts: Sequence[str] = DEFAULT_HOSTS, valid_days: int = DEFAULT_VALID_DAYS,
               name: str = "strom") -> ClusterCertificates:
        """A new CA and a server certificate for ``hosts`` (IP addresses or DNS names), replacing any in
        ``directory``.

        Raises:
            ImportError: ``cryptography`` is not installed (it comes with the ``zookeeper`` extra).
            ValueError: no hosts, or a non-positive validity.
        """
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        if not hosts or valid_days <= 0:
            raise ValueError("certificates need at least one host and a positive validity")
        now = dt.datetime.now(dt.UTC)
        not_before, not_after = now - dt.timedelta(minutes=5), now + dt.timedelta(days=valid_days)

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} cluster CA")])
        ca_identifier = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
        ca = (
            x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(certificate_signing=True), critical=True)
            .add_extension(ca_identifier, critical=False)
            .sign(ca_key, hashes.SHA256())
        )

        server_key = ec.generate_private_key(ec.SECP256R1())
        server = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} server")]))
            .issuer_name(ca_name).public_key(server_key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(certificate_signing=False), critical=True)
            # a server is a client too when it reaches another server of its cluster
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([_general_name(host) for host in hosts]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_identifier), critical=False)
            .sign(ca_key, hashes.SHA256())
        )

        files = cls(directory)
        directory.mkdir(parents=True, exist_ok=True)
        key_pem = server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
        write_secret_file(files.key, key_pem)
        files.certificate.write_bytes(server.public_bytes(serialization.Encoding.PEM))
        files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        return files


def _key_usage(certificate_signing: bool) -> x509.KeyUsage:
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, key_cert_sign=certificate_signing, crl_sign=certificate_signing,
        encipher_only=False, decipher_only=False,
    )


def _general_name(host: str) -> x509.GeneralName:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def write_secret_file(path: Path, content: bytes) -> None:
    """Write ``content`` (a key, a password) to a file created readable by its owner only, never briefly
    readable by others; an existing file is replaced."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)


__all__ = ["DEFAULT_HOSTS", "ClusterCertificates", "write_secret_file"]
