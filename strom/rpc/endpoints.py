"""Where a server listens: named endpoints, Fluss's ``NAME://HOST:PORT[,NAME://HOST:PORT…]``.

A server may listen on several ports, each a *listener* with a name (``CLIENT``, ``INTERNAL``, ...) and its
own protocol. A cluster's servers register every listener, and a client is told the endpoints of the
listener it came in through, so clients on one network and servers on another each get addresses they can
reach (Fluss's ``bind.listeners`` / ``advertised.listeners`` / ``internal.listener.name`` model).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from strom.errors import InvalidConfigError

DEFAULT_LISTENER_NAME = "FLUSS"
"""The name of a listener given as plain ``HOST:PORT`` (Fluss's default listener name)."""

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    """The listener's name, upper case."""
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_endpoints(text: str, option: str = "bind.listeners", *, distinct_ports: bool = True) -> list[Endpoint]:
    """``HOST:PORT`` (one listener named ``FLUSS``) or ``NAME://HOST:PORT[,NAME://HOST:PORT…]``, in order.

    Raises:
        InvalidConfigError: none, a repeated name, a repeated port (``distinct_ports``, port 0 aside), or
            not that form; the message names ``option``.
    """
    endpoints: list[Endpoint] = []
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    for entry in entries:
        name, sep, address = entry.partition("://")
        if not sep:
            if len(entries) > 1:
                raise InvalidConfigError(f"{option}: name every listener (NAME://HOST:PORT), got {text!r}")
            name, address = DEFAULT_LISTENER_NAME, entry
        host, sep, port = address.rpartition(":")
        if not name or not sep or not host or not port.isdigit() or int(port) > 0xFFFF:
            raise InvalidConfigError(f"{option} expects HOST:PORT or NAME://HOST:PORT[,…], got {text!r}")
        endpoints.append(Endpoint(name.strip().upper(), host.strip("[]"), int(port)))
    if not endpoints:
        raise InvalidConfigError(f"{option} names no listener")
    names = [endpoint.name for endpoint in endpoints]
    if len(set(names)) != len(names):
        raise InvalidConfigError(f"{option} repeats a listener name: {text!r}")
    ports = [endpoint.port for endpoint in endpoints if endpoint.port != 0]
    if distinct_ports and len(set(ports)) != len(ports):
        raise InvalidConfigError(f"{option} gives two listeners the same port: {text!r}")
    return endpoints


def format_endpoints(endpoints: Iterable[Endpoint]) -> str:
    """The inverse of :func:`parse_endpoints` (always with names): what a registration in ZooKeeper holds."""
    return ",".join(str(endpoint) for endpoint in endpoints)


def advertised_endpoints(bound: Sequence[Endpoint], advertised: str | None, default_host: str | None) -> list[Endpoint]:
    """What a server tells others about its ``bound`` listeners (their real ports, after binding port 0).

    A listener named in ``advertised`` (Fluss's ``advertised.listeners``) is announced as given there (a port
    of 0 there means the bound port, strom's convenience for listeners bound to port 0); any other with
    ``default_host`` (strom's ``advertised.host``) if set, else its bind host, and a wildcard bind host as
    loopback.

    Raises:
        InvalidConfigError: ``advertised`` names a listener that is not bound.
    """
    overrides: dict[str, Endpoint] = {}
    if advertised:
        bound_names = {endpoint.name for endpoint in bound}
        for endpoint in parse_endpoints(advertised, "advertised.listeners", distinct_ports=False):
            if endpoint.name not in bound_names:
                raise InvalidConfigError(
                    f"advertised.listeners names listener {endpoint.name}, which bind.listeners "
                    f"({format_endpoints(bound)}) does not have"
                )
            overrides[endpoint.name] = endpoint
    announced = []
    for endpoint in bound:
        override = overrides.get(endpoint.name)
        if override is not None:
            announced.append(Endpoint(endpoint.name, override.host, override.port or endpoint.port))
            continue
        host = default_host or endpoint.host
        announced.append(Endpoint(endpoint.name, "127.0.0.1" if host in WILDCARD_HOSTS else host, endpoint.port))
    return announced


def internal_listener(bound: Sequence[Endpoint], configured: str | None) -> str:
    """The listener the servers of a cluster reach each other on (Fluss's ``internal.listener.name``).

    Unset, it is ``FLUSS`` when a listener has that name, else the only listener; with several listeners and
    none named ``FLUSS`` the setting is required.

    Raises:
        InvalidConfigError: the named listener is not bound, or the choice is ambiguous.
    """
    names = [endpoint.name for endpoint in bound]
    if configured:
        name = configured.strip().upper()
        if name not in names:
            raise InvalidConfigError(
                f"internal.listener.name {name} is not one of the listeners in bind.listeners ({', '.join(names)})"
            )
        return name
    if DEFAULT_LISTENER_NAME in names:
        return DEFAULT_LISTENER_NAME
    if len(names) == 1:
        return names[0]
    raise InvalidConfigError(
        f"bind.listeners has several listeners ({', '.join(names)}) and none is named {DEFAULT_LISTENER_NAME}: "
        f"set internal.listener.name to the one the servers reach each other on"
    )


__all__ = [
    "DEFAULT_LISTENER_NAME",
    "Endpoint",
    "advertised_endpoints",
    "format_endpoints",
    "internal_listener",
    "parse_endpoints",
]
