"""Running strom as a cluster: the ZooKeeper it keeps its metadata in, and (later) its processes."""
