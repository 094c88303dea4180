"""Fluss's listener settings: ``bind.listeners``, ``advertised.listeners`` and ``internal.listener.name``."""

from __future__ import annotations

import pytest

from strom.errors import InvalidConfigError
from strom.rpc.endpoints import (
    Endpoint,
    advertised_endpoints,
    format_endpoints,
    internal_listener,
    parse_endpoints,
)
from strom.rpc.peers import ServerNode

BOUND = [Endpoint("CLIENT", "0.0.0.0", 9123), Endpoint("INTERNAL", "10.0.0.5", 9124)]


def test_endpoints_round_trip_through_their_text() -> None:
    text = "CLIENT://0.0.0.0:9123,INTERNAL://10.0.0.5:9124"
    assert parse_endpoints(text) == BOUND
    assert format_endpoints(BOUND) == text
    assert parse_endpoints("REPLICATION://[::1]:9125") == [Endpoint("REPLICATION", "::1", 9125)]
    with pytest.raises(InvalidConfigError, match=r"advertised.listeners expects"):
        parse_endpoints("CLIENT://h:99999", "advertised.listeners")


def test_advertised_listeners_override_by_name_and_the_rest_keep_their_bind_address() -> None:
    assert advertised_endpoints(BOUND, "CLIENT://strom.example.com:443", None) == [
        Endpoint("CLIENT", "strom.example.com", 443), Endpoint("INTERNAL", "10.0.0.5", 9124)]
    # unnamed ones: advertised.host if set, else the bind host with a wildcard shown as loopback
    assert advertised_endpoints(BOUND, None, None) == [Endpoint("CLIENT", "127.0.0.1", 9123), BOUND[1]]
    assert advertised_endpoints(BOUND, None, "node-5") == [Endpoint("CLIENT", "node-5", 9123),
                                                            Endpoint("INTERNAL", "node-5", 9124)]
    # port 0 in advertised.listeners: the bound port
    assert advertised_endpoints(BOUND, "CLIENT://localhost:0", None)[0] == Endpoint("CLIENT", "localhost", 9123)
    with pytest.raises(InvalidConfigError, match=r"names listener PUBLIC, which bind.listeners"):
        advertised_endpoints(BOUND, "PUBLIC://h:1", None)


def test_the_internal_listener_is_named_or_follows_flusss_default() -> None:
    assert internal_listener(BOUND, "internal") == "INTERNAL"
    assert internal_listener([*BOUND, Endpoint("FLUSS", "h", 1)], None) == "FLUSS"
    assert internal_listener(BOUND[:1], None) == "CLIENT"  # the only listener
    with pytest.raises(InvalidConfigError, match=r"set internal.listener.name"):
        internal_listener(BOUND, None)
    with pytest.raises(InvalidConfigError, match=r"internal.listener.name REPLICATION is not one of"):
        internal_listener(BOUND, "REPLICATION")


def test_a_node_is_named_to_each_client_by_its_listener() -> None:
    node = ServerNode(3, "10.0.0.5", 9124, (Endpoint("CLIENT", "public", 9123), Endpoint("INTERNAL", "10.0.0.5", 9124)))
    assert node.for_listener("CLIENT") == ServerNode(3, "public", 9123)
    assert node.for_listener("INTERNAL") == ServerNode(3, "10.0.0.5", 9124)
    assert node.for_listener("PYFLUSS") is None  # clients on a listener it lacks are not told of it
    assert ServerNode(1, "h", 1).for_listener("CLIENT") == ServerNode(1, "h", 1)  # a node of one address
