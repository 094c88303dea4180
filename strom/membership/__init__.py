"""Cluster membership: the live tablet servers, bucket leaderships and the active coordinator, behind one
contract kept by ZooKeeper or, for the processes on one machine, by the embedded store's SQLite file."""
