"""Ports for local members are picked below the kernel's ephemeral range, where no outgoing connection's
source port (and no ``bind(0)``) can take them between the pick and the member's bind, or while a killed
member waits to restart on its port."""

from __future__ import annotations

import socket

from strom.zk.zookeeper_server import EPHEMERAL_PORT_RANGE, FIXED_PORT_LOW, free_port


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound() -> None:
    low, high = (int(bound) for bound in EPHEMERAL_PORT_RANGE.read_text().split())
    ports = {free_port() for _ in range(20)}
    for port in ports:
        if low - FIXED_PORT_LOW >= 1_000:
            assert FIXED_PORT_LOW <= port < low
        else:  # no room below the range here: the kernel's pick
            assert low <= port <= high
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as bound:
            bound.bind(("127.0.0.1", port))
    assert len(ports) > 1  # picked at random, not one port for everyone


def test_outgoing_connections_do_not_take_picked_ports() -> None:
    """The source ports of connections come from the ephemeral range, so never from below it."""
    low, _ = (int(bound) for bound in EPHEMERAL_PORT_RANGE.read_text().split())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        clients = [socket.create_connection(server.getsockname()) for _ in range(50)]
        try:
            assert all(client.getsockname()[1] >= low for client in clients)
        finally:
            for client in clients:
                client.close()
