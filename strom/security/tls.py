"""TLS for listeners and the clients that reach them, with Python's ``ssl`` and PEM files.

Fluss has no TLS yet (FIP-29 proposes it); strom takes Kafka's protocol names in ``security.protocol.map``
(``SSL``: TLS, ``SASL_SSL``: SASL over TLS) and PEM files instead of Java key stores:

- a server: ``security.ssl.certificate`` (its certificate chain), ``security.ssl.key`` (its private key),
  ``security.ssl.truststore`` (the CAs it trusts: for client certificates, and for the other servers of its
  cluster), ``security.ssl.client-auth`` (``none`` or ``required``: clients must present a certificate the
  trust store vouches for);
- a client: ``client.security.protocol`` ``SSL`` or ``SASL_SSL``, ``client.security.ssl.truststore`` (the
  CAs it trusts; the system's when unset), and ``client.security.ssl.certificate`` / ``.key`` where the
  server wants a client certificate. Host names are verified against the certificate (its subject
  alternative names); ``client.security.ssl.verify-hostname: false`` turns that off.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

from strom.errors import InvalidConfigError

PLAINTEXT, SASL, SSL, SASL_SSL = "PLAINTEXT", "SASL", "SSL", "SASL_SSL"
PROTOCOLS = (PLAINTEXT, SASL, SSL, SASL_SSL)


def uses_tls(protocol: str) -> bool:
    return protocol in (SSL, SASL_SSL)


def uses_sasl(protocol: str) -> bool:
    return protocol in (SASL, SASL_SSL)


def server_context(certificate: str | None, key: str | None, truststore: str | None, client_auth: str) -> ssl.SSLContext:
    """What a TLS listener presents and, with ``client_auth`` ``required``, whom it lets in.

    Raises:
        InvalidConfigError: no certificate or key, an unreadable file, or an unknown ``client_auth``.
    """
    if not certificate or not key:
        raise InvalidConfigError("a TLS listener needs security.ssl.certificate and security.ssl.key (PEM files)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certificate, key)
        if truststore:
            context.load_verify_locations(truststore)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidConfigError(f"cannot load the TLS certificate, key or trust store: {exc}") from None
    mode = client_auth.strip().lower()
    if mode == "required":
        if not truststore:
            raise InvalidConfigError("security.ssl.client-auth=required needs security.ssl.truststore")
        context.verify_mode = ssl.CERT_REQUIRED
    elif mode != "none":
        raise InvalidConfigError(f"security.ssl.client-auth is none or required, got {client_auth!r}")
    return context


def client_context(
    truststore: str | None, certificate: str | None = None, key: str | None = None, verify_hostname: bool = True
) -> ssl.SSLContext:
    """What a client (or a server reaching another server) trusts and presents.

    Raises:
        ValueError: an unreadable file, or a certificate without its key.
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=truststore or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = verify_hostname
    if bool(certificate) != bool(key):
        raise ValueError("a client certificate needs its key, and a key its certificate")
    if certificate and key:
        context.load_cert_chain(certificate, key)
    return context


_PYFLUSS_PREFIX = "client."


def client_option(config: Mapping[str, str], key: str) -> str | None:
    """A ``client.*`` option, or pyfluss's spelling of it without ``client.``: one options map serves both."""
    value = config.get(key)
    if value is None:
        value = config.get(key[len(_PYFLUSS_PREFIX):])
    return None if value is None else str(value)


def client_protocol(config: Mapping[str, str]) -> str:
    """``client.security.protocol`` (or pyfluss's ``security.protocol``), upper-cased; PLAINTEXT when unset.

    Raises:
        ValueError: not one of PLAINTEXT, SASL, SSL, SASL_SSL.
    """
    protocol = (client_option(config, "client.security.protocol") or PLAINTEXT).strip().upper()
    if protocol not in PROTOCOLS:
        raise ValueError(f"client.security.protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    return protocol


def client_context_from_config(config: Mapping[str, str]) -> ssl.SSLContext | None:
    """The client's TLS context when its protocol is SSL or SASL_SSL, else None.

    Raises:
        ValueError: an unknown protocol or an unreadable file.
    """
    if not uses_tls(client_protocol(config)):
        return None
    verify = (client_option(config, "client.security.ssl.verify-hostname") or "true").strip().lower() != "false"
    try:
        return client_context(
            client_option(config, "client.security.ssl.truststore"), client_option(config, "client.security.ssl.certificate"),
            client_option(config, "client.security.ssl.key"), verify,
        )
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the client's TLS trust store or certificate: {exc}") from None


__all__ = [
    "PLAINTEXT", "PROTOCOLS", "SASL", "SASL_SSL", "SSL", "client_context", "client_context_from_config",
    "client_option", "client_protocol", "server_context", "uses_sasl", "uses_tls",
]
