"""Fluss API keys and the version ranges strom advertises.

The handshake (ApiVersions) lists every key below: a key missing from it makes the official client fail
the call locally with UnsupportedVersion, so even the keys strom does not serve are listed, and answered
with an error response. Request bodies are identical across the listed versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ApiKey(IntEnum):
    API_VERSIONS = 1000
    CREATE_DATABASE = 1001
    DROP_DATABASE = 1002
    LIST_DATABASES = 1003
    DATABASE_EXISTS = 1004
    CREATE_TABLE = 1005
    DROP_TABLE = 1006
    GET_TABLE_INFO = 1007
    LIST_TABLES = 1008
    LIST_PARTITION_INFOS = 1009
    TABLE_EXISTS = 1010
    GET_TABLE_SCHEMA = 1011
    GET_METADATA = 1012
    UPDATE_METADATA = 1013
    PRODUCE_LOG = 1014
    FETCH_LOG = 1015
    PUT_KV = 1016
    LOOKUP = 1017
    NOTIFY_LEADER_AND_ISR = 1018
    STOP_REPLICA = 1019
    ADJUST_ISR = 1020
    LIST_OFFSETS = 1021
    COMMIT_KV_SNAPSHOT = 1022
    GET_LATEST_KV_SNAPSHOTS = 1023
    GET_KV_SNAPSHOT_METADATA = 1024
    GET_FILESYSTEM_SECURITY_TOKEN = 1025
    INIT_WRITER = 1026
    COMMIT_REMOTE_LOG_MANIFEST = 1027
    NOTIFY_REMOTE_LOG_OFFSETS = 1028
    NOTIFY_KV_SNAPSHOT_OFFSET = 1029
    COMMIT_LAKE_TABLE_SNAPSHOT = 1030
    NOTIFY_LAKE_TABLE_OFFSET = 1031
    GET_LAKE_SNAPSHOT = 1032
    LIMIT_SCAN = 1033
    PREFIX_LOOKUP = 1034
    GET_DATABASE_INFO = 1035
    CREATE_PARTITION = 1036
    DROP_PARTITION = 1037
    AUTHENTICATE = 1038
    CREATE_ACLS = 1039
    LIST_ACLS = 1040
    DROP_ACLS = 1041
    LAKE_TIERING_HEARTBEAT = 1042
    CONTROLLED_SHUTDOWN = 1043
    ALTER_TABLE = 1044
    DESCRIBE_CLUSTER_CONFIGS = 1045
    ALTER_CLUSTER_CONFIGS = 1046
    ADD_SERVER_TAG = 1047
    REMOVE_SERVER_TAG = 1048
    REBALANCE = 1049
    LIST_REBALANCE_PROGRESS = 1050
    CANCEL_REBALANCE = 1051
    PREPARE_LAKE_TABLE_SNAPSHOT = 1052
    REGISTER_PRODUCER_OFFSETS = 1053
    GET_PRODUCER_OFFSETS = 1054
    DELETE_PRODUCER_OFFSETS = 1055
    ACQUIRE_KV_SNAPSHOT_LEASE = 1056
    RELEASE_KV_SNAPSHOT_LEASE = 1057
    DROP_KV_SNAPSHOT_LEASE = 1058
    GET_TABLE_STATS = 1059
    ALTER_DATABASE = 1060
    SCAN_KV = 1061
    GET_CLUSTER_HEALTH = 1062
    LIST_REMOTE_LOG_MANIFESTS = 1063
    LIST_KV_SNAPSHOTS = 1064
    # strom extensions (strom_ext.proto), advertised only to strom clients
    LIST_KV_SNAPSHOT_LEASES = 3000
    DESCRIBE_LAKE_TIERING = 3001


EXTENSION_KEYS = frozenset({ApiKey.LIST_KV_SNAPSHOT_LEASES, ApiKey.DESCRIBE_LAKE_TIERING})
STROM_CLIENT_NAME = "strom-python"
COORDINATOR_EPOCH = 0
"""The coordinator epoch the lake tiering RPCs carry (Fluss's heartbeat field), the same in every
deployment: the tiering state lives in the metadata store every coordinator shares, so an election does
not reset it, and tiering jobs are fenced by their tiering epoch. A cluster's coordinators do bump an epoch
of their own on each election (``strom.zk.coordinator_address``), which their requests to tablet servers
carry."""


@dataclass(frozen=True, slots=True)
class ApiVersionRange:
    min_version: int
    max_version: int


# Only these keys have more than version 0; the bodies do not change between versions.
_VERSION_RANGES = {
    ApiKey.PUT_KV: ApiVersionRange(0, 2),
    ApiKey.LOOKUP: ApiVersionRange(0, 1),
    ApiKey.PREFIX_LOOKUP: ApiVersionRange(0, 1),
}


def version_range(key: ApiKey) -> ApiVersionRange:
    return _VERSION_RANGES.get(key, ApiVersionRange(0, 0))


def message_names(key: ApiKey) -> tuple[str, str]:
    """Request and response message names in ``fluss_api.proto`` (CamelCase of the key, with exceptions)."""
    if key is ApiKey.GET_METADATA:
        return "MetadataRequest", "MetadataResponse"
    base = "".join(part.capitalize() for part in key.name.split("_"))
    base = base.replace("Filesystem", "FileSystem")
    return f"{base}Request", f"{base}Response"
