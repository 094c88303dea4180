"""A stateless REST gateway in front of a strom cluster (Apache Fluss FIP-49's shape): ``strom gateway``.

It is a client of the cluster (``strom.client``), never part of a server; docs/gateway.md describes it.
"""
