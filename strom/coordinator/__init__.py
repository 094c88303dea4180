"""The coordinator's services: the catalog, bucket placement and leadership, KV snapshot records and
leases, lake tiering and ACLs."""
