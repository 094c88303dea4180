"""The private CA of ``strom cluster start --secure``: what it writes, and that a strict TLS client accepts
the server certificate for the loopback names and refuses it for another name."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509

from strom.security.certificates import ClusterCertificates


def _handshake(files: ClusterCertificates, server_hostname: str) -> str:
    """A TLS handshake against a server presenting ``files``, by a client trusting only their CA, in
    Python's strict X.509 mode; returns the negotiated protocol version."""
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(files.certificate, files.key)
    client_context = ssl.create_default_context(cafile=str(files.ca))
    client_context.verify_flags |= ssl.VERIFY_X509_STRICT
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def serve() -> None:
            connection, _ = listener.accept()
            try:
                with server_context.wrap_socket(connection, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=10) as raw, \
                    client_context.wrap_socket(raw, server_hostname=server_hostname) as tls:
                return str(tls.version())
        finally:
            thread.join(10)


def test_a_cluster_ca_signs_a_server_certificate_for_the_loopback_names(tmp_path: Path) -> None:
    files = ClusterCertificates.create(tmp_path / "tls")
    assert files.exists()
    assert sorted(path.name for path in files.directory.iterdir()) == ["ca.pem", "server.key", "server.pem"]
    assert files.key.stat().st_mode & 0o077 == 0, "the server key is its owner's alone"
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    server = x509.load_pem_x509_certificate(files.certificate.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert server.issuer == ca.subject
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert 364 <= (server.not_valid_after_utc - server.not_valid_before_utc).days <= 366
    for name in ("127.0.0.1", "localhost"):
        assert _handshake(files, name).startswith("TLSv1.")
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        _handshake(files, "strom.example.com")
    assert files.server_config() == {"security.ssl.certificate": str(files.certificate),
                                     "security.ssl.key": str(files.key), "security.ssl.truststore": str(files.ca)}


def test_new_certificates_replace_the_old_and_bad_arguments_are_refused(tmp_path: Path) -> None:
    first = ClusterCertificates.create(tmp_path / "tls").ca.read_bytes()
    second = ClusterCertificates.create(tmp_path / "tls", hosts=("10.0.0.5", "strom-1.example.com"), valid_days=2)
    assert second.ca.read_bytes() != first
    names = x509.load_pem_x509_certificate(second.certificate.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["strom-1.example.com"]
    with pytest.raises(ValueError, match="at least one host"):
        ClusterCertificates.create(tmp_path / "none", hosts=())
    with pytest.raises(ValueError, match="positive validity"):
        ClusterCertificates.create(tmp_path / "none", valid_days=0)
