"""Certificates the TLS tests make for themselves (with the ``openssl`` command): a throw-away CA, a server
certificate for 127.0.0.1 and localhost, and a client certificate, all valid for two days."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_certificate: Path
    server_key: Path
    client_certificate: Path
    client_key: Path

    def server_config(self, client_auth: str = "none") -> dict[str, str]:
        return {"security.ssl.certificate": str(self.server_certificate), "security.ssl.key": str(self.server_key),
                "security.ssl.truststore": str(self.ca), "security.ssl.client-auth": client_auth}


def _openssl(directory: Path, *arguments: str) -> None:
    done = subprocess.run(["openssl", *arguments], cwd=directory, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _signed(directory: Path, name: str, subject: str) -> tuple[Path, Path]:
    _openssl(directory, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
    _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext")
    return directory / f"{name}.pem", directory / f"{name}.key"


def make_certificates(directory: Path) -> Certificates:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(directory, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=strom-test-ca")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    server_certificate, server_key = _signed(directory, "server", "/CN=127.0.0.1")
    client_certificate, client_key = _signed(directory, "client", "/CN=alice")
    return Certificates(directory / "ca.pem", server_certificate, server_key, client_certificate, client_key)
