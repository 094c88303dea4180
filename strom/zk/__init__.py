"""ZooKeeper: the cluster's metadata store, tablet-server registrations, bucket leadership and ISR,
coordinator election, and a throw-away ZooKeeper server for tests and local clusters."""
