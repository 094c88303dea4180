"""The tablet server's services: replicas (log + RocksDB per bucket), replication, the data RPCs,
server-side KV scans and snapshot scheduling."""
