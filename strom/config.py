"""Configuration options, declared once with their type, default and description.

Keys are spelled as Apache Fluss spells them so Fluss users feel at home; where strom's default differs
from Fluss's, the description says why. ``docs/configuration.md`` is generated from this module
(``strom config docs``). Components read an option once and keep it in a unit-named attribute.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from strom.table_properties import DATALAKE_FRESHNESS, LOG_TTL
from strom.units import parse_duration, parse_memory_size

T = TypeVar("T")

def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _parse_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"not an integer: {value!r}")
    if isinstance(value, str):
        value = value.strip()
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"not an integer: {value!r}") from None


def _bounded(parse: Callable[[Any], int], minimum: int | None, maximum: int | None) -> Callable[[Any], int]:
    if minimum is None and maximum is None:
        return parse

    def parse_bounded(value: Any) -> int:
        parsed = parse(value)
        if minimum is not None and parsed < minimum:
            raise ValueError(f"{parsed} is below the minimum of {minimum}")
        if maximum is not None and parsed > maximum:
            raise ValueError(f"{parsed} is above the maximum of {maximum}")
        return parsed

    return parse_bounded


@dataclass(frozen=True, slots=True)
class ConfigOption(Generic[T]):
    key: str
    default: T
    description: str
    parse: Callable[[Any], T]
    type_name: str


_log = logging.getLogger(__name__)
ALL_OPTIONS: dict[str, ConfigOption[Any]] = {}


def _option(key: str, default: T, description: str, parse: Callable[[Any], T], type_name: str) -> ConfigOption[T]:
    assert key not in ALL_OPTIONS, key
    option = ConfigOption(key, default, description, parse, type_name)
    ALL_OPTIONS[key] = option
    return option


def duration_option(key: str, default: str, description: str) -> ConfigOption[timedelta]:
    return _option(key, parse_duration(default), description, parse_duration, "Duration")


def memory_option(
    key: str, default: str, description: str, *, minimum: int | None = None, maximum: int | None = None
) -> ConfigOption[int]:
    parse = _bounded(parse_memory_size, minimum, maximum)
    return _option(key, parse(default), description, parse, "MemorySize")


def int_option(
    key: str, default: int, description: str, *, minimum: int | None = None, maximum: int | None = None
) -> ConfigOption[int]:
    parse = _bounded(_parse_int, minimum, maximum)
    return _option(key, parse(default), description, parse, "Integer")


def float_option(
    key: str, default: float, description: str, *, minimum: float | None = None, maximum: float | None = None
) -> ConfigOption[float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError(f"not a number: {value!r}")
        try:
            parsed = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"not a number: {value!r}") from None
        if parsed != parsed:
            raise ValueError(f"not a number: {value!r}")
        if minimum is not None and parsed < minimum:
            raise ValueError(f"{parsed} is below the minimum of {minimum}")
        if maximum is not None and parsed > maximum:
            raise ValueError(f"{parsed} is above the maximum of {maximum}")
        return parsed

    return _option(key, parse(default), description, parse, "Double")


def bool_option(key: str, default: bool, description: str) -> ConfigOption[bool]:
    return _option(key, default, description, _parse_bool, "Boolean")


def string_option(key: str, default: str | None, description: str) -> ConfigOption[str | None]:
    return _option(key, default, description, lambda v: None if v is None else str(v), "String")


def string_list_option(key: str, description: str) -> ConfigOption[tuple[str, ...] | None]:
    """Strings separated by commas (or a YAML list), unset by default. Entries are kept as given, empty ones
    included: the component that uses them says what it refuses."""

    def parse(value: Any) -> tuple[str, ...] | None:
        if value is None:
            return None
        entries = value if isinstance(value, (list, tuple)) else str(value).split(",")
        return tuple(str(entry).strip() for entry in entries)

    return _option(key, None, description, parse, "List<String>")


COMPRESSION_TYPES = ("no", "snappy", "lz4", "zstd")
"""The compressions ``kv.rocksdb.compression.per.level`` names (Fluss's)."""


def _parse_compression_per_level(value: Any) -> tuple[str, ...]:
    entries = value if isinstance(value, (list, tuple)) else str(value).split(",")
    parsed = tuple(str(entry).strip().lower() for entry in entries)
    unknown = [entry for entry in parsed if entry not in COMPRESSION_TYPES]
    if not parsed or unknown:
        raise ValueError(f"{value!r} is not a list of {', '.join(name.upper() for name in COMPRESSION_TYPES)}")
    return parsed


def choice_option(key: str, default: str, choices: tuple[str, ...], description: str,
                  refused: Mapping[str, str] | None = None) -> ConfigOption[str]:
    """A string from ``choices`` (compared case-insensitively, stored lower-case); ``refused``: values a user
    may expect (Fluss has them) and why strom does not take them, said in the error."""
    assert default in choices
    reasons = dict(refused or {})

    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            why = f" ({reasons[text]})" if text in reasons else ""
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}{why}")
        return text

    return _option(key, default, description, parse, "Enum")


# ---- server ----
BIND_LISTENERS = string_option(
    "bind.listeners", "127.0.0.1:9123",
    "Addresses the server listens on: `HOST:PORT`, or Fluss's `NAME://HOST:PORT[,NAME://HOST:PORT…]` "
    "(an unnamed listener is `FLUSS`); `security.protocol.map` says which require authentication. Each "
    "listener is a port of its own; GetMetadata on it answers with every server's endpoint of that listener. "
    "`strom server --bind HOST:PORT` sets the first listener's address.",
)
ADVERTISED_LISTENERS = string_option(
    "advertised.listeners", None,
    "What the server announces for its listeners, `NAME://HOST:PORT[,…]` naming listeners of `bind.listeners` "
    "(e.g. a public host for `CLIENT`); a listener not named is announced with its bind address (or "
    "`advertised.host`). A port of 0 here means the bound port (strom extension).",
)
INTERNAL_LISTENER_NAME = string_option(
    "internal.listener.name", None,
    "The listener the servers of a cluster reach each other on. Unset: `FLUSS` if a listener has that name, "
    "else the only listener (Fluss's default is `FLUSS`).",
)
ADVERTISED_HOST = string_option(
    "advertised.host", None,
    "Host name clients are told to connect to; defaults to the bind host (strom extension).",
)
DATA_DIR = string_option(
    "data.dir", None,
    "Local directory for logs, RocksDB instances and the metadata store; with `data.dirs` set it keeps the "
    "metadata store, snapshot staging and the default remote storage and lake, and the buckets go to `data.dirs`.",
)
DATA_DIRS = string_list_option(
    "data.dirs",
    "Local directories (comma-separated) a tablet server keeps its buckets in, logs and RocksDB instances: a "
    "new bucket goes to the one with the fewest buckets of its kind (KV buckets for primary-key tables, logs "
    "for log tables; ties to the first listed), an existing one stays where it is. Takes precedence over "
    "`data.dir` for buckets; unset: `data.dir` is the only one. Paths must not repeat or nest; one that "
    "cannot be used at start is offline (logged) and the server starts without it (docs/reliability.md).",
)
REMOTE_DATA_DIR = string_option(
    "remote.data.dir", None,
    "Remote storage for KV snapshots: a local path or an fsspec URL (e.g. s3://bucket/strom). "
    "Defaults to `<data.dir>/remote`.",
)
S3_ACCESS_KEY = string_option(
    "s3.access-key", None,
    "Access key of the S3-compatible store that `remote.data.dir` (s3://…) names (Fluss's key; `s3.access.key` "
    "is read too). Unset: the environment's (AWS_ACCESS_KEY_ID). GetFileSystemSecurityToken hands clients "
    "these credentials, or short-lived ones from STS (`s3.assumed.role.sts.endpoint`), so pyfluss reads "
    "remote log segments straight from the store.",
)
S3_SECRET_KEY = string_option(
    "s3.secret-key", None, "Secret key of the S3-compatible store (Fluss's key; `s3.secret.key` is read too).",
)
S3_ENDPOINT = string_option(
    "s3.endpoint", None,
    "Endpoint of an S3-compatible store other than AWS (e.g. http://minio:9000). Unset: FSSPEC_S3_ENDPOINT_URL, "
    "else AWS.",
)
S3_REGION = string_option("s3.region", None, "Region of the S3 store (unset: AWS_DEFAULT_REGION, else us-east-1).")
S3_PATH_STYLE_ACCESS = string_option(
    "s3.path.style.access", None,
    "true: address buckets as paths (`endpoint/bucket/key`), as MinIO and most S3-compatible stores need "
    "(Fluss's key; `s3.path-style-access` is read too).",
)
S3_ASSUMED_ROLE_ARN = string_option(
    "s3.assumed.role.arn", None,
    "A role whose short-lived credentials (STS AssumeRole) clients get from GetFileSystemSecurityToken.",
)
S3_ASSUMED_ROLE_STS_ENDPOINT = string_option(
    "s3.assumed.role.sts.endpoint", None,
    "The STS endpoint the short-lived client credentials come from (GetSessionToken, or AssumeRole with "
    "`s3.assumed.role.arn`). Unset without a role: clients get the server's own keys.",
)
ZOOKEEPER_ADDRESS = string_option(
    "zookeeper.address", None,
    "Keep the cluster metadata (databases, tables, partitions, KV snapshot records, leases, lake snapshots, "
    "ACLs) in ZooKeeper at `HOST:PORT[,HOST:PORT…][/ROOT]` (the root is `/fluss` when none is given) "
    "instead of the SQLite file in `data.dir`; needs the `zookeeper` extra (kazoo). Unset: SQLite.",
)
ZOOKEEPER_PATH_ROOT = string_option(
    "zookeeper.path.root", "/fluss",
    "The ZooKeeper node under which the cluster keeps its metadata (Fluss's key), unless `zookeeper.address` "
    "names one itself (`HOST:PORT/ROOT`, which wins).",
)


def zookeeper_location(config: Configuration) -> str | None:
    """``zookeeper.address`` with its root: the address's own, else ``zookeeper.path.root`` (None: no
    ZooKeeper)."""
    address = config.get(ZOOKEEPER_ADDRESS)
    if not address:
        return None
    if "/" in address:
        return address
    root = "/" + (config.get(ZOOKEEPER_PATH_ROOT) or "").strip("/")
    return address if root == "/" else address + root
METADATA_SQLITE_PATH = string_option(
    "metadata.sqlite.path", None,
    "The SQLite file a coordinator and tablet servers on one machine share for the cluster metadata and "
    "membership (live servers, bucket leaders, the active coordinator) instead of ZooKeeper: what "
    "`strom server --workers N` sets for its processes. Ignored when `zookeeper.address` is set.",
)
ZOOKEEPER_AUTH_DIGEST = string_option(
    "zookeeper.auth.digest", None,
    "`user:password`: the identity strom's servers act as in ZooKeeper (its digest scheme). Every node they "
    "create is then readable and writable by that identity alone, and ZooKeeper refuses strangers reads and "
    "writes of strom's nodes (registrations, ACLs, leadership). `strom cluster start --secure` generates one; "
    "`strom zookeeper secure` sets the ACLs on a tree created before. Keep it as secret as a password "
    "(strom extension; Fluss's ZooKeeper client takes SASL through zookeeper.client.config-path).",
)
ZOOKEEPER_SSL_CLIENT_ENABLE = bool_option(
    "zookeeper.ssl.client.enable", False,
    "Reach ZooKeeper over TLS (its `secureClientPort`): the server's certificate is checked against "
    "`zookeeper.ssl.truststore.location` and its host name. `strom cluster start --secure` turns it on for its "
    "own ZooKeeper (Kafka's key).",
)
ZOOKEEPER_SSL_TRUSTSTORE = string_option(
    "zookeeper.ssl.truststore.location", None,
    "PEM file of the CAs that sign ZooKeeper's certificate (the system's CAs when unset); a PEM file where "
    "Kafka takes a Java trust store.",
)
ZOOKEEPER_SSL_KEYSTORE = string_option(
    "zookeeper.ssl.keystore.location", None,
    "PEM file holding the certificate chain and private key presented to a ZooKeeper that wants client "
    "certificates (`ssl.clientAuth`); a PEM file where Kafka takes a Java key store.",
)
ZOOKEEPER_SESSION_TIMEOUT = duration_option(
    "zookeeper.client.session-timeout", "18s",
    "ZooKeeper session timeout of a cluster's servers: a tablet server or coordinator that stops answering "
    "for this long counts as gone (its registration vanishes, a standby coordinator takes over). Fluss's "
    "default is 60 s; strom's is shorter so failover is quicker.",
)
LOG_REPLICA_MAX_LAG_TIME = duration_option(
    "log.replica.max-lag-time", "30s",
    "A follower that has not caught up with its leader's log for this long leaves the in-sync replicas, so "
    "writes are acknowledged without it (until it catches up again).",
)
LOG_REPLICA_MAX_SILENCE_TIME = duration_option(
    "log.replica.max-silence-time", "3s",
    "An in-sync follower that sends its leader no fetch for this long (it died, or lost the network) leaves "
    "the in-sync replicas at once, so writes wait for a dead follower at most this long rather than "
    "`log.replica.max-lag-time`; it rejoins once it has caught up. strom's own key (a follower long-polls "
    "every 0.5 s).",
)
LOG_REPLICA_MIN_IN_SYNC_REPLICAS_NUMBER = int_option(
    "log.replica.min-in-sync-replicas-number", 1,
    "A write with acks = all (-1, every client's default) needs at least this many in-sync replicas: with "
    "fewer the leader refuses it (NotEnoughReplicas, 29) before appending, and a write whose replication "
    "ends while the in-sync replicas are fewer fails with NotEnoughReplicasAfterAppend (28); both are "
    "retriable. With a replication factor of 3 and 2 here, an acknowledged write is on at least two servers.",
    minimum=1,
)
SERVER_DATA_DISK_WRITE_LIMIT_RATIO = float_option(
    "server.data-disk.write-limit-ratio", 0.85,
    "A tablet server refuses client writes (ProduceLog, PutKv, a lookup that inserts; DiskWriteLocked, 70, "
    "retriable) once its data disk's usage reaches this ratio, until it falls to "
    "`server.data-disk.write-recover-ratio`; followers still replicate. 1.0 turns the protection off. Must "
    "be above the recover ratio. Changes at run time.",
    minimum=0.0, maximum=1.0,
)
SERVER_DATA_DISK_WRITE_RECOVER_RATIO = float_option(
    "server.data-disk.write-recover-ratio", 0.80,
    "Writes resume once the data disk's usage is at or below this ratio (below the limit ratio). Changes at "
    "run time.",
    minimum=0.0, maximum=1.0,
)
SERVER_DATA_DISK_CHECK_INTERVAL = duration_option(
    "server.data-disk.check-interval", "30s",
    "How often a tablet server samples its data disk's usage for the write protection.",
)
LOG_REPLICA_FETCH_MAX_BYTES_FOR_BUCKET = memory_option(
    "log.replica.fetch.max-bytes-for-bucket", "1mb",
    "The most a follower's fetch returns for one bucket (a larger first batch still comes whole). It paces "
    "a replica that copies a bucket (after a rebalance added it, or a long absence): the leader reads and "
    "sends at most this much per fetch, so client requests between two fetches are not held up.",
    minimum=1 << 10,
)
LOG_REPLICA_FETCH_WAIT_MAX_TIME = duration_option(
    "log.replica.fetch.wait-max-time", "500ms",
    "How long a follower's fetch waits at the leader for new data before it is answered empty; keep it "
    "below `log.replica.max-lag-time`.",
)
TABLET_SERVER_ID = int_option("tablet-server.id", 0, "Id of this tablet server.", minimum=0)
TABLET_SERVER_RACK = string_option(
    "tablet-server.rack", None,
    "The rack (or availability zone) of this tablet server. When every live tablet server of a cluster has "
    "one, new tables and partitions place each bucket's replicas on as many different racks as they can.",
)
TABLET_SERVER_ADVERTISED_RESOURCE_MEMORY_SIZE = _option(
    "tablet-server.advertised-resource.memory-size", None,
    "The memory this tablet server tells the coordinator it has (in its registration), for the cluster's "
    "KV leader replica capacity (`kv.leader-replica.memory-reserved`). It limits, reserves or sizes nothing. "
    "Unset (or 0): the cgroup's memory limit (v2 `memory.max`, v1 `memory.limit_in_bytes`) when there is "
    "one, else the machine's physical memory.",
    lambda value: None if value is None else parse_memory_size(value), "MemorySize",
)
TABLET_SERVER_CONTROLLED_SHUTDOWN_MAX_RETRIES = int_option(
    "tablet-server.controlled-shutdown.max-retries", 3,
    "How often a stopping tablet server of a cluster asks the coordinator to move its leaderships away "
    "(ControlledShutdown) before it stops anyway.", minimum=0,
)
TABLET_SERVER_CONTROLLED_SHUTDOWN_RETRY_INTERVAL = duration_option(
    "tablet-server.controlled-shutdown.retry-interval", "1s",
    "The pause between two ControlledShutdown attempts of a stopping tablet server.",
)
DEFAULT_REPLICATION_FACTOR = int_option(
    "default.replication.factor", 1,
    "Replication factor of a table created without `table.replication.factor` (a table asking for more "
    "replicas than there are tablet servers is refused at creation).",
    minimum=1,
)
ALLOW_CREATE_LOG_TABLES = bool_option(
    "allow.create.log.tables", True, "Whether log tables (without a primary key) may be created.",
)
ALLOW_CREATE_KV_TABLES = bool_option(
    "allow.create.kv.tables", True, "Whether primary-key tables may be created.",
)
KV_LEADER_REPLICA_MEMORY_RESERVED = memory_option(
    "kv.leader-replica.memory-reserved", "0",
    "The memory one primary-key bucket's leader is assumed to take, from which the coordinator computes how "
    "many such leaders the cluster holds: the live tablet servers' memory "
    "(`tablet-server.advertised-resource.memory-size`; a server that reports none counts as the average of "
    "those that do) divided by this. Creating a primary-key table or partition whose buckets do not fit is "
    "refused with InsufficientKvLeaderReplicaCapacity (71); log tables are not counted. It reserves no "
    "memory on the tablet servers. 0 turns the check off, and so do half or fewer of the live tablet "
    "servers reporting their memory. Fluss recommends 8 mb when enabled.",
)
DEFAULT_BUCKET_NUMBER = int_option(
    "default.bucket.number", 1, "Number of buckets of a table created without an explicit bucket count.", minimum=1
)
MAX_BUCKET_NUM = int_option("max.bucket.num", 4096, "Maximum number of buckets of a table.", minimum=1)
MAX_PARTITION_NUM = int_option("max.partition.num", 1000, "Maximum number of partitions of a table.", minimum=1)
MAX_REQUEST_SIZE = memory_option(
    "netty.server.max-request-size", "100mb",
    "Largest request frame the server reads; a larger frame length closes the connection before its body is read.",
    minimum=1 << 10,
)
CONNECTION_MAX_IDLE_TIME = duration_option(
    "netty.connection.max-idle-time", "10 min", "Connections idle for this long are closed."
)
SERVER_MAX_IN_FLIGHT_PER_CONNECTION = int_option(
    "server.max-inflight-requests-per-connection", 64,
    "Requests of one connection handled at once; further frames wait (strom extension, bounds memory).",
    minimum=1,
)
SERVER_MAX_BUFFERED_REQUEST_BYTES = memory_option(
    "server.max-buffered-request-bytes", "256mb",
    "Bytes that large request frames (over 64 KiB) still being received may hold across all connections; a "
    "connection whose frame does not fit stops reading until others complete theirs (strom extension, bounds "
    "memory). Raised to netty.server.max-request-size if smaller.",
    minimum=1 << 20,
)
METRICS_PORT = int_option(
    "metrics.reporter.prometheus.port", 0,
    "Port of the Prometheus metrics endpoint on the bind host; 0 disables it.",
    minimum=0,
    maximum=65_535,
)
METRICS_REPORTERS = string_option(
    "metrics.reporters", None,
    "Which metric reporters start (Fluss's key, comma-separated names); unset: every configured one. strom "
    "has one, `prometheus` (its port: `metrics.reporter.prometheus.port`); a list without it starts none.",
)


def reporter_enabled(config: Configuration, name: str) -> bool:
    """Whether ``metrics.reporters`` lets reporter ``name`` start."""
    listed = config.get(METRICS_REPORTERS)
    return listed is None or name in {entry.strip().lower() for entry in listed.split(",")}

# ---- security ----
SECURITY_PROTOCOL_MAP = string_option(
    "security.protocol.map", "",
    "Authentication protocol per listener, `NAME:PROTOCOL[,NAME:PROTOCOL]`, e.g. `CLIENT:SASL`; a listener "
    "not listed uses PLAINTEXT (no authentication). With SASL, a connection must authenticate before any "
    "request but ApiVersions.",
)
SECURITY_SASL_ENABLED_MECHANISMS = string_option(
    "security.sasl.enabled.mechanisms", "PLAIN",
    "SASL mechanisms a SASL listener accepts (comma-separated); strom implements PLAIN.",
)
SECURITY_SASL_PLAIN_JAAS_CONFIG = string_option(
    "security.sasl.plain.jaas.config", None,
    "Users of SASL/PLAIN in Fluss's JAAS form: `org.apache.fluss.security.auth.sasl.plain.PlainLoginModule "
    "required user_admin=\"admin-secret\" user_alice=\"alice-secret\";`.",
)
def _parse_credentials(value: Any) -> str | None:
    """``user:password[,user:password]``, checked (the users themselves are read by the security room)."""
    if value is None:
        return None
    text = str(value)
    for entry in filter(str.strip, text.split(",")):
        user, colon, _password = entry.strip().partition(":")
        if not colon or not user:
            raise ValueError(f"entries are user:password, got {entry.strip()!r}")
    return text


SECURITY_SASL_PLAIN_CREDENTIALS = _option(
    "security.sasl.plain.credentials", None,
    "Users of SASL/PLAIN as `user:password[,user:password]`, instead of (or in addition to) the JAAS form. "
    "Changes at run time (AlterClusterConfigs): users are added or removed on every server of the cluster "
    "without a restart; a change that would leave no user is not applied.",
    _parse_credentials, "String",
)
AUTHORIZER_ENABLED = bool_option(
    "authorizer.enabled", False,
    "Enforce ACLs: every request needs an ACL granting its operation on its resource to the connection's "
    "principal (or a super user). Off: everyone may do everything, and the ACL requests fail with "
    "SecurityDisabledException.",
)
SUPER_USERS = string_option(
    "super.users", None,
    "Principals allowed everything, separated by semicolons, e.g. `User:admin;User:ops`.",
)
SECURITY_SSL_CERTIFICATE = string_option(
    "security.ssl.certificate", None,
    "PEM file of the certificate chain a TLS listener (SSL or SASL_SSL in `security.protocol.map`) presents; "
    "a cluster's servers also present it to each other. strom's key (Fluss has no TLS yet, FIP-29).",
)
SECURITY_SSL_KEY = string_option("security.ssl.key", None, "PEM file of the private key of `security.ssl.certificate`.")
SECURITY_SSL_TRUSTSTORE = string_option(
    "security.ssl.truststore", None,
    "PEM file of the CAs a server trusts: for client certificates (`security.ssl.client-auth`), and for the "
    "other servers of its cluster when their listener is TLS.",
)
SECURITY_SSL_CLIENT_AUTH = choice_option(
    "security.ssl.client-auth", "none", ("none", "required"),
    "`required`: a TLS listener lets in only clients presenting a certificate `security.ssl.truststore` vouches for.",
)
SECURITY_SSL_VERIFY_HOSTNAME = bool_option(
    "security.ssl.verify-hostname", True,
    "Whether a cluster's server checks the host name of the server it reaches over TLS against its certificate.",
)
SECURITY_INTERNAL_SECRET = string_option(
    "security.internal.secret", None,
    "The secret the servers of a cluster share to authenticate to each other (strom's own key; Fluss's "
    "servers do not authenticate). Each server proves `Server:coordinator` or `Server:tablet-server-<id>` "
    "with it (a mutual challenge-response on the internal listener), and requests only servers send "
    "(NotifyLeaderAndIsr, StopReplica, UpdateMetadata, CommitKvSnapshot, a follower's FetchLog, …) are "
    "refused from anyone else, on every listener. "
    "`strom cluster start` generates one; keep it as secret as a password.",
)
SECURITY_INTERNAL_LOGIN_ON_ALL_LISTENERS = bool_option(
    "security.internal.login-on-all-listeners", False,
    "Accept the servers' logins (STROM-INTERNAL) on every listener, not only on the one internal.listener.name "
    "names (strom's own key). Off, a server login sent to a client listener is refused, so the servers' "
    "secret is of no use on a network that reaches only client listeners.",
)
SECURITY_INTERNAL_ALLOW_UNAUTHENTICATED = bool_option(
    "security.internal.allow-unauthenticated", False,
    "INSECURE: let a cluster start without `security.internal.secret`; its servers then accept control "
    "requests from any client that can connect (as Fluss's do). For a trusted, isolated network only.",
)
MAX_CONNECTIONS = int_option(
    "max.connections", 10_000,
    "Connections the server holds at once, all listeners together (Kafka's key); further ones are closed as "
    "they are accepted. 0: no limit.", minimum=0,
)
MAX_CONNECTIONS_PER_IP = int_option(
    "max.connections.per.ip", 2_000,
    "Connections one source address may hold at once (Kafka's key); 0: no limit.", minimum=0,
)
MAX_CONNECTIONS_PER_IP_OVERRIDES = string_option(
    "max.connections.per.ip.overrides", None,
    "Per-address exceptions to max.connections.per.ip, `ADDRESS:COUNT,ADDRESS:COUNT` (Kafka's key and form), "
    "e.g. `10.0.0.7:10000` for a gateway.",
)
SECURITY_UNAUTHENTICATED_MAX_BUFFERED_BYTES = memory_option(
    "security.unauthenticated.max-buffered-bytes", "64mb",
    "Bytes of partial frames that connections which have not logged in may hold, all together (each may hold "
    "512 KiB less a byte); a connection whose bytes would pass it is closed, and new connections are refused "
    "while it is reached (strom extension).", minimum=1 << 20,
)
SECURITY_UNAUTHENTICATED_MAX_IDLE_TIME = duration_option(
    "security.unauthenticated.max-idle-time", "10 s",
    "On a listener that requires a login, a connection that has not logged in and sent no whole frame for "
    "this long is closed (strom extension; netty.connection.max-idle-time applies after the login).",
)
SECURITY_FAILED_AUTHENTICATION_MAX_PER_ADDRESS = int_option(
    "security.failed-authentication.max-per-address", 20,
    "Failed logins one source address may make within a minute; then its connections are refused for "
    "security.failed-authentication.block-time. Before that, each failed login of an address is answered "
    "later than the one before (100 ms, doubling, at most 5 s). 0: no block (strom extension).", minimum=0,
)
SECURITY_FAILED_AUTHENTICATION_BLOCK_TIME = duration_option(
    "security.failed-authentication.block-time", "60 s",
    "How long an address that made too many failed logins is refused (strom extension).",
)

# ---- log ----
LOG_SEGMENT_FILE_SIZE = memory_option(
    "log.segment.file-size", "1024mb", "Size at which a log segment is rolled.", minimum=1 << 10
)
LOG_INDEX_INTERVAL_SIZE = memory_option(
    "log.index.interval-size", "4kb",
    "Bytes of log between two entries of a remote segment's offset index (where a remote read starts).",
    minimum=1,
)
REMOTE_LOG_TASK_INTERVAL_DURATION = duration_option(
    "remote.log.task-interval-duration", "1 min",
    "How often each bucket's leader copies its closed log segments to `remote.data.dir` (and expires remote "
    "segments past `table.log.ttl`); <= 0 turns remote log storage off.",
)
REMOTE_LOG_TASK_MAX_UPLOAD_SEGMENTS = int_option(
    "remote.log.task-max-upload-segments", 5, "Segments a bucket copies to remote storage per run.", minimum=1
)
LOG_FLUSH_INTERVAL_MESSAGES = int_option(
    "log.flush.interval-messages", 1,
    "Number of appended batches after which the log is fsynced before the write is acknowledged. "
    "Fluss defaults to never (it relies on replication); strom runs a single replica, so it defaults to 1: "
    "every acknowledged write is on disk. Concurrent appends share one fsync (group commit).",
    minimum=1,
)
TABLE_LOG_TTL = duration_option(
    LOG_TTL, "7d",
    "Default for tables that do not set it: log segments older than this are deleted (a primary-key "
    "changelog only below its oldest stored KV snapshot, so leased snapshots keep the changelog after "
    "them); <= 0 keeps them forever.",
)
LOG_RETENTION_CHECK_INTERVAL = duration_option(
    "log.retention.check-interval", "5 min", "How often log retention runs."
)
LOG_FETCH_WAIT_MAX = duration_option(
    "log.fetch.wait-max-time", "5s", "Server cap on a FetchLog long-poll, whatever the client asks (strom extension)."
)
WRITER_ID_EXPIRATION_TIME = duration_option(
    "server.writer-id.expiration-time", "7d", "Writer ids idle this long lose their deduplication state."
)

# ---- kv ----
KV_SNAPSHOT_INTERVAL = duration_option(
    "kv.snapshot.interval", "10 min", "Period of KV snapshots of each bucket with new writes; <= 0 disables them."
)
KV_SNAPSHOT_NUM_RETAINED = int_option(
    "kv.snapshot.num-retained", 2, "Completed snapshots kept per bucket (leased ones are kept in addition).", minimum=1
)
KV_SNAPSHOT_LEASE_EXPIRATION_CHECK_INTERVAL = duration_option(
    "kv.snapshot.lease.expiration-check-interval", "10 min",
    "How often expired KV snapshot leases are dropped and the snapshots they freed are cleaned.",
)
COORDINATOR_PRODUCER_OFFSETS_TTL = duration_option(
    "coordinator.producer-offsets.ttl", "24 h",
    "How long registered producer offsets live when the registration names no TTL of its own.",
)
COORDINATOR_PRODUCER_OFFSETS_CLEANUP_INTERVAL = duration_option(
    "coordinator.producer-offsets.cleanup-interval", "1 h",
    "How often the coordinator deletes expired producer offsets.",
)
AUTO_PARTITION_CHECK_INTERVAL = duration_option(
    "auto-partition.check.interval", "10 min",
    "How often the coordinator creates upcoming partitions and drops expired ones of auto-partitioned tables.",
)
SERVER_HISTORICAL_PARTITION_THREAD_POOL_MAX_SIZE = int_option(
    "server.historical-partition.thread-pool.max-size", 10,
    "Threads a tablet server reads expired partitions from the lake with, for lookups of tables with "
    "`table.datalake.historical-partition.enabled`.", minimum=1,
)
NETTY_SERVER_MAX_QUEUED_HISTORICAL_REQUESTS = int_option(
    "netty.server.max-queued-historical-requests", 50,
    "Lookups of expired partitions a tablet server takes at once; more are refused with "
    "HistoricalPartitionThrottled (73, retriable: clients back off and retry).", minimum=1,
)
SERVER_HISTORICAL_PARTITION_LOOKUPER_CACHE_EXPIRE = duration_option(
    "server.historical-partition.lookuper-cache.expire-after-access", "3 h",
    "How long a tablet server keeps a lake bucket it read for historical lookups without a lookup of it. "
    "strom keeps each bucket it read as an index of keys in memory (at most "
    "`server.historical-partition.lookup-cache.max-entries` of them) where Fluss keeps lookup files on disk.",
)
SERVER_HISTORICAL_PARTITION_LOOKUP_CACHE_MAX_ENTRIES = int_option(
    "server.historical-partition.lookup-cache.max-entries", 16,
    "Lake buckets a tablet server keeps indexed in memory for historical lookups, least recently used out "
    "(strom's key, in place of Fluss's `server.historical-partition.lookup-cache.max-disk-ratio`).", minimum=1,
)
KV_SCANNER_TTL = duration_option("kv.scanner.ttl", "10 min", "Idle time after which a KV scan session is closed.")
KV_SCANNER_EXPIRATION_INTERVAL = duration_option(
    "kv.scanner.expiration-interval", "30s", "How often idle KV scan sessions are looked for."
)
KV_SCANNER_MAX_PER_BUCKET = int_option(
    "kv.scanner.max-per-bucket", 8, "Open KV scan sessions allowed per bucket.", minimum=1
)
KV_SCANNER_MAX_PER_SERVER = int_option(
    "kv.scanner.max-per-server", 200, "Open KV scan sessions allowed per server.", minimum=1
)
KV_SCANNER_MAX_BATCH_SIZE = memory_option(
    "kv.scanner.max-batch-size", "10mb", "Server cap on a ScanKv response's `batch_size_bytes`.", minimum=1
)
KV_ROW_CACHE_SIZE = _option(
    "kv.row-cache.size", None,
    "A tablet server's cache of current rows, shared by its primary-key buckets and consulted before RocksDB "
    "by every put's old-value read and every lookup; written through, least recently used out. Unset: an "
    "eighth of the machine's memory, at most 4 GiB; 0 turns it off (strom's key).",
    lambda value: None if value is None else parse_memory_size(value), "MemorySize",
)
KV_ROCKSDB_BLOCK_CACHE_SIZE = memory_option(
    "kv.rocksdb.block.cache-size", "8mb", "RocksDB block cache of each bucket.", minimum=1
)
KV_ROCKSDB_BLOCK_SIZE = memory_option(
    "kv.rocksdb.block.blocksize", "4kb", "Uncompressed size of a RocksDB data block.", minimum=1
)
KV_ROCKSDB_WRITE_BUFFER_SIZE = memory_option(
    "kv.rocksdb.writebuffer.size", "64mb", "Size of one RocksDB memtable of a bucket before it is flushed to disk.",
    minimum=64 << 10,
)
KV_ROCKSDB_WRITE_BUFFER_COUNT = int_option(
    "kv.rocksdb.writebuffer.count", 2, "Memtables a bucket's RocksDB holds at most (active and being flushed).",
    minimum=2,
)
KV_BACKPRESSURE_L0_SLOWDOWN_TRIGGER = int_option(
    "kv.backpressure.l0-slowdown-trigger", 8,
    "Level-0 files of a bucket's RocksDB at which its PutKv answers start carrying Fluss's `pressure` signal, "
    "rising step by step to RocksDB's own slowdown trigger (20), so writers slow down before RocksDB stalls "
    "them; 20 or more turns the signal off. Writes that would bring the level-0 files, memtables and the "
    "bucket's pre-write buffer to 20 are refused with StorageBackpressure (72, retriable) whatever its value.",
    minimum=0,
)
KV_ROCKSDB_USE_BLOOM_FILTER = bool_option(
    "kv.rocksdb.use-bloom-filter", True,
    "Bloom filters over RocksDB's SST files and (strom) a whole-key bloom filter over each memtable, so reading "
    "a key that does not exist — the old value of every new row — is cheap. A new bucket whose row cache holds "
    "all of its keys reads nothing from RocksDB: it writes an unsorted vector memtable without a filter until its "
    "first read reaches RocksDB, which reopens it with the skip list and the filter.",
)
KV_ROCKSDB_MMAP_READS = bool_option(
    "kv.rocksdb.mmap-reads", True,
    "(strom) Read RocksDB's SST files through memory maps instead of pread: a block the page cache holds is read "
    "in place, without a system call or a copy into the block cache (a cache-cold update ~20 % faster, "
    "docs/benchmarks.md). An I/O error of the disk under a mapped file then stops the process (SIGBUS) instead "
    "of failing one read; nothing acknowledged is lost either way.",
)
KV_ROCKSDB_BLOOM_FILTER_BITS_PER_KEY = float_option(
    "kv.rocksdb.bloom-filter.bits-per-key", 10.0, "Bits per key of the SST bloom filters.", minimum=1.0
)
KV_ROCKSDB_BLOOM_FILTER_BLOCK_BASED_MODE = bool_option(
    "kv.rocksdb.bloom-filter.block-based-mode", False,
    "Accepted for Fluss configurations, without effect: RocksDB 7 removed block-based filters, so RocksDB 9 "
    "builds full filters whatever this says (a warning is logged when it is true).",
)
KV_ROCKSDB_THREAD_NUM = int_option(
    "kv.rocksdb.thread.num", 2,
    "Background flush and compaction jobs each bucket's RocksDB runs at once (RocksDB's `max_background_jobs`).",
    minimum=1,
)
KV_ROCKSDB_FILES_OPEN = int_option(
    "kv.rocksdb.files.open", -1,
    "Files each bucket's RocksDB keeps open at most (RocksDB raises 0-19 to 20); -1: no limit.", minimum=-1,
)
KV_ROCKSDB_LOG_MAX_FILE_SIZE = memory_option(
    "kv.rocksdb.log.max-file-size", "25mb",
    "Size at which a bucket's RocksDB info log (`LOG`) rolls to a new file; 0: one file that grows.", minimum=0,
)
KV_ROCKSDB_LOG_FILE_NUM = int_option(
    "kv.rocksdb.log.file-num", 4, "Info log files each bucket's RocksDB keeps (the current one included).",
    minimum=1,
)
KV_ROCKSDB_LOG_DIR = string_option(
    "kv.rocksdb.log.dir", None,
    "Directory of the buckets' RocksDB info logs, each file named after its database's path (created if "
    "missing). Unset or empty: `LOG` in each database's directory.",
)
KV_ROCKSDB_LOG_LEVEL = choice_option(
    "kv.rocksdb.log.level", "info_level",
    ("debug_level", "info_level", "warn_level", "error_level", "fatal_level", "header_level"),
    "Level of the buckets' RocksDB info logs (`DEBUG_LEVEL` … `HEADER_LEVEL`, any case). The native binding "
    "only: rocksdict 0.3.29 has no setter for it, so under rocksdict RocksDB logs at `INFO_LEVEL`.",
)
KV_ROCKSDB_WRITE_BATCH_SIZE = memory_option(
    "kv.rocksdb.write-batch-size", "2mb",
    "Accepted for Fluss configurations, without effect: strom never splits a write. Each committed group of rows "
    "goes to RocksDB as one atomic batch with the bucket's applied log offset, so neither a memtable flush, a "
    "crash nor a reader ever sees part of a group; splitting it at a size would give that up.",
    minimum=1,
)
KV_ROCKSDB_SHARED_RATE_LIMITER_BYTES_PER_SEC = memory_option(
    "kv.rocksdb.shared-rate-limiter.bytes-per-sec", str((1 << 63) - 1),
    "Flush and compaction write rate of all of the server's buckets' RocksDB together: one rate limiter the "
    "server's databases share (both bindings). The default (Long.MAX_VALUE bytes) means no limiter.",
    minimum=1, maximum=(1 << 63) - 1,
)
KV_ROCKSDB_COMPACTION_STYLE = choice_option(
    "kv.rocksdb.compaction.style", "level", ("level", "universal", "none"),
    "Compaction style of the buckets' RocksDB: `LEVEL`, `UNIVERSAL` or `NONE`. `NONE` never compacts, so a "
    "bucket's level-0 files pile up until its writes are refused (StorageBackpressure at 20). rocksdict has no "
    "`NONE`: under it, `NONE` is the level style with automatic compactions disabled. Fluss's `FIFO` is refused: "
    "it deletes the oldest SST files once they pass 1 GiB, which loses current rows of a primary-key table.",
    refused={"fifo": "FIFO compaction deletes the oldest SST files of a bucket once they pass 1 GiB in all, "
                     "losing current rows of a primary-key table; use LEVEL or UNIVERSAL"},
)
KV_ROCKSDB_COMPACTION_LEVEL_USE_DYNAMIC_SIZE = bool_option(
    "kv.rocksdb.compaction.level.use-dynamic-size", False,
    "Level sizes derived from the last level's size (RocksDB's `level_compaction_dynamic_level_bytes`, "
    "true by default since RocksDB 8.4; Fluss's default false is kept). Either opens the other's data.",
)
KV_ROCKSDB_COMPRESSION_PER_LEVEL: ConfigOption[tuple[str, ...]] = _option(
    "kv.rocksdb.compression.per.level", ("lz4", "lz4", "lz4", "lz4", "lz4", "zstd", "zstd"),
    "Compression of each level's SST files, level 0 first (comma-separated `NO`, `SNAPPY`, `LZ4`, `ZSTD`); "
    "levels past the list use its last entry. Each SST file records its own compression, so a change applies "
    "to files written from then on and existing data opens unchanged.",
    _parse_compression_per_level, "List<Enum>",
)
KV_ROCKSDB_COMPACTION_LEVEL_TARGET_FILE_SIZE_BASE = memory_option(
    "kv.rocksdb.compaction.level.target-file-size-base", "64mb",
    "Target size of an SST file at level 1 (RocksDB's `target_file_size_base`).", minimum=1,
)
KV_ROCKSDB_COMPACTION_LEVEL_MAX_SIZE_LEVEL_BASE = memory_option(
    "kv.rocksdb.compaction.level.max-size-level-base", "256mb",
    "Target size of level 1, each level below ten times the one above (RocksDB's `max_bytes_for_level_base`).",
    minimum=1,
)
KV_ROCKSDB_WRITE_BUFFER_NUMBER_TO_MERGE = int_option(
    "kv.rocksdb.writebuffer.number-to-merge", 1,
    "Full memtables a flush merges into one SST file at least (RocksDB's `min_write_buffer_number_to_merge`). "
    "Passed to RocksDB, but only 1 takes effect: strom flushes a bucket's column families together without a "
    "WAL (atomic flush), and RocksDB 9 then lowers any larger value to 1, as more would lose data.",
    minimum=1,
)
KV_ROCKSDB_BLOCK_METADATA_BLOCKSIZE = memory_option(
    "kv.rocksdb.block.metadata-blocksize", "4kb",
    "Block size of partitioned index and filter blocks (RocksDB's `metadata_block_size`). strom builds neither "
    "partitioned, so it is passed to RocksDB but changes nothing.",
    minimum=1,
)
KV_ROCKSDB_BLOCK_CACHE_INDEX_AND_FILTER_BLOCKS = bool_option(
    "kv.rocksdb.block.cache-index-and-filter-blocks", False,
    "Index and filter blocks in the bucket's block cache (bounded by it, evicted from it) instead of held in "
    "memory for as long as their SST file is open.",
)
KV_ROCKSDB_BLOCK_CACHE_INDEX_AND_FILTER_BLOCKS_WITH_HIGH_PRIORITY = bool_option(
    "kv.rocksdb.block.cache-index-and-filter-blocks-with-high-priority", False,
    "With `kv.rocksdb.block.cache-index-and-filter-blocks`, those blocks in the cache's high-priority pool. The "
    "native binding only: rocksdict 0.3.29 has no setter for it, so under rocksdict RocksDB's default (true) holds.",
)
KV_ROCKSDB_BLOCK_PIN_L0_FILTER_AND_INDEX_BLOCKS_IN_CACHE = bool_option(
    "kv.rocksdb.block.pin-l0-filter-and-index-blocks-in-cache", False,
    "With `kv.rocksdb.block.cache-index-and-filter-blocks`, level-0 files' index and filter blocks pinned in the "
    "block cache.",
)
KV_ROCKSDB_BLOCK_PIN_TOP_LEVEL_INDEX_AND_FILTER = bool_option(
    "kv.rocksdb.block.pin-top-level-index-and-filter", False,
    "With `kv.rocksdb.block.cache-index-and-filter-blocks`, the top level of partitioned index and filter blocks "
    "pinned in the block cache (RocksDB's default is true). strom builds no partitioned ones: passed to RocksDB, "
    "it changes nothing.",
)
KV_ROCKSDB_BINDING = choice_option(
    "kv.rocksdb.binding", "auto", ("auto", "native", "rocksdict"),
    "How the server opens its buckets' RocksDB (strom's key): `native`, strom's own binding over RocksDB's C API "
    "(9.10, built at install; writes, multi-gets, flushes and checkpoints release the GIL), or `rocksdict` (9.8, "
    "the PyPI binding, whose writes hold the GIL). `auto`: the environment variable STROM_ROCKSDB_BINDING if set, "
    "else `native` where it is built. Both open the same files. The start-up line and the metric "
    "`strom_kv_rocksdb_binding_info` name the one in use.",
)


# ---- lake ----
SUPPORTED_LAKE_FORMATS = ("delta", "iceberg", "lance", "paimon")
REFUSED_LAKE_FORMATS = {
    "hudi": "no library on PyPI writes Hudi tables (hudi 0.5.0 only reads them): docs/lake.md",
}
"""The other formats Fluss tiers into, and why strom does not."""
DATALAKE_FORMAT = choice_option(
    "datalake.format", "delta", SUPPORTED_LAKE_FORMATS,
    "Lake format of lake-enabled tables (`table.datalake.enabled`): `delta`, `iceberg`, `paimon` or `lance` "
    "(log tables only, as in Fluss); Paimon and Lance need `pip install 'strom[paimon]'` or `'strom[lance]'` "
    "where the tiering service and readers run. Another value stops the server at start. With `iceberg` or `paimon` every table is created with that "
    "`table.datalake.format`, which makes its keys encode and bucket as the format does (Iceberg's `bucket[N]` "
    "transform over a single key column, Paimon's BinaryRow hash), as in Fluss. Its options are `datalake.<format>.<key>`: the coordinator copies them "
    "into each lake-enabled table's properties as `table.datalake.<format>.<key>`, except keys naming a "
    "password, secret or key, which the tiering service must be given itself. Fluss's `hudi` is refused with "
    "the reason (docs/lake.md).",
    refused=REFUSED_LAKE_FORMATS,
)
DATALAKE_DELTA_WAREHOUSE = string_option(
    "datalake.delta.warehouse", None,
    "Root of the Delta lake tables (`<warehouse>/<database>/<table>`): a local path or a URL delta-rs reads "
    "(e.g. s3://bucket/lake). Defaults to `<data.dir>/lake`; a relative local path is made absolute at "
    "start. Other `datalake.delta.*` keys are passed to delta-rs as storage options.",
)
DATALAKE_ICEBERG_WAREHOUSE = string_option(
    "datalake.iceberg.warehouse", None,
    "Warehouse of the Iceberg lake tables. A local path gets an embedded SQL catalog on SQLite inside it; a "
    "URL pyiceberg writes (e.g. s3://bucket/lake) needs a catalog named by `datalake.iceberg.type` (e.g. "
    "`rest` with `datalake.iceberg.uri`). Defaults to `<data.dir>/lake`; a relative local path is made "
    "absolute at start. Other `datalake.iceberg.*` keys are passed to the catalog as its properties.",
)
DATALAKE_LANCE_WAREHOUSE = string_option(
    "datalake.lance.warehouse", None,
    "Root of the Lance datasets (`<warehouse>/<database>/<table>.lance`, Fluss's layout): a local path or a "
    "URL Lance writes (e.g. s3://bucket/lake). Defaults to `<data.dir>/lake`; a relative local path is made "
    "absolute at start. `datalake.lance.max_row_per_file`, `max_rows_per_group` and `max_bytes_per_file` "
    "size the files; other `datalake.lance.*` keys are passed to Lance as storage options.",
)
DATALAKE_PAIMON_WAREHOUSE = string_option(
    "datalake.paimon.warehouse", None,
    "Warehouse of the Paimon lake tables (a filesystem catalog: `<warehouse>/<database>.db/<table>`, Fluss's "
    "layout): a local path or a URL pypaimon-rust writes (e.g. s3://bucket/lake). Defaults to "
    "`<data.dir>/lake`; a relative local path is made absolute at start. Other `datalake.paimon.*` keys (e.g. "
    "`metastore`, `uri`) are passed to the Paimon catalog.",
)
TABLE_DATALAKE_FRESHNESS = duration_option(
    DATALAKE_FRESHNESS, "3 min",
    "Default for tables that do not set it: how stale a table's lake copy may get; the next tiering round "
    "is due this long after the last one ended, and a round is cut when it runs longer.",
)
LAKE_TIERING_HEARTBEAT_TIMEOUT = duration_option(
    "lake.tiering.heartbeat-timeout", "2 min",
    "A tiering job that sends no heartbeat for a table this long loses it: the table is tiered again with "
    "the next epoch (Fluss fixes it at 120 s; strom extension).",
)
LAKE_TIERING_HEARTBEAT_CHECK_INTERVAL = duration_option(
    "lake.tiering.heartbeat-check-interval", "15s",
    "How often the coordinator looks for tiering jobs whose heartbeats stopped (Fluss fixes it at 15 s; "
    "strom extension).",
)


class Configuration:
    """An immutable set of option values: defaults overlaid with what the user set.

    Unknown keys are kept (table properties and client options pass through) but never validated.
    """

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._raw: dict[str, Any] = dict(values or {})
        for key, raw in self._raw.items():
            option = ALL_OPTIONS.get(key)
            if option is not None:
                try:
                    option.parse(raw)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"invalid value for {key}: {exc}") from exc

    def get(self, option: ConfigOption[T]) -> T:
        if option.key in self._raw:
            return option.parse(self._raw[option.key])
        return option.default

    def get_ms(self, option: ConfigOption[timedelta]) -> int:
        return int(self.get(option).total_seconds() * 1000)

    def with_values(self, values: Mapping[str, Any]) -> Configuration:
        merged = dict(self._raw)
        merged.update(values)
        return Configuration(merged)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._raw)

    def __repr__(self) -> str:
        return f"Configuration({self._raw!r})"


DYNAMIC_OPTIONS = frozenset({
    KV_SNAPSHOT_INTERVAL.key,
    SERVER_DATA_DISK_WRITE_LIMIT_RATIO.key,
    SERVER_DATA_DISK_WRITE_RECOVER_RATIO.key,
    SECURITY_SASL_PLAIN_CREDENTIALS.key,
    LOG_REPLICA_MIN_IN_SYNC_REPLICAS_NUMBER.key,
    TABLE_DATALAKE_FRESHNESS.key,
    COORDINATOR_PRODUCER_OFFSETS_TTL.key,
    AUTO_PARTITION_CHECK_INTERVAL.key,
    KV_LEADER_REPLICA_MEMORY_RESERVED.key,
})
"""The options AlterClusterConfigs may change while the cluster runs; each takes effect without a restart
(docs/cluster-configs.md says where and how soon)."""


class DynamicConfig:
    """A server's configuration with the cluster configs set at run time (AlterClusterConfigs) laid over
    it. Components read :attr:`current` and register a listener for the keys they apply while running."""

    def __init__(self, initial: Configuration) -> None:
        self.initial = initial
        self.dynamic: dict[str, str] = {}
        self._listeners: list[Callable[[Configuration], None]] = []

    @property
    def current(self) -> Configuration:
        return self.initial.with_values(self.dynamic)

    def on_change(self, listener: Callable[[Configuration], None]) -> None:
        """Call ``listener(current)`` after every change of the dynamic values."""
        self._listeners.append(listener)

    def set_dynamic(self, values: Mapping[str, str]) -> bool:
        """Replace the dynamic values (each a :data:`DYNAMIC_OPTIONS` key with a valid value) and tell the
        listeners; False if nothing changed. A listener's failure is logged, the others still run.

        Raises:
            ValueError: a key that is not dynamic, or a value that does not parse.
        """
        for key, value in values.items():
            if key not in DYNAMIC_OPTIONS:
                raise ValueError(f"{key} is not a dynamic option")
            ALL_OPTIONS[key].parse(value)
        if dict(values) == self.dynamic:
            return False
        self.dynamic = dict(values)
        current = self.current
        for listener in self._listeners:
            try:
                listener(current)
            except Exception:
                _log.exception("applying changed cluster configs failed in %r", listener)
        return True

    @staticmethod
    def decode(payload: bytes | None) -> dict[str, str]:
        """The dynamic values a metadata store holds (as ``encode`` wrote them)."""
        if payload is None:
            return {}
        document = json.loads(payload)
        return {str(key): str(value) for key, value in document.items()}

    @staticmethod
    def encode(values: Mapping[str, str]) -> bytes:
        return json.dumps(dict(sorted(values.items())), separators=(",", ":")).encode()


def options_markdown() -> str:
    """The configuration reference page, generated from the declarations above."""
    lines = [
        "# Configuration",
        "",
        "Generated from `strom/config.py` by `strom config docs`. Set any key with `strom server -D key=value`",
        "or in a YAML file passed with `--config`. The options of a table (its `table.*` properties) are",
        "listed in [table-options.md](table-options.md).",
        "",
        "| key | type | default | description |",
        "|---|---|---|---|",
    ]
    for key in sorted(ALL_OPTIONS):
        option = ALL_OPTIONS[key]
        default = option.default
        if isinstance(default, timedelta):
            shown = _format_duration(default)
        elif isinstance(default, tuple):
            shown = ",".join(default)
        elif option.type_name == "MemorySize" and default is not None:
            shown = _format_memory(int(default))
        else:
            shown = "(none)" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        dynamic = " Changeable at run time (AlterClusterConfigs)." if key in DYNAMIC_OPTIONS else ""
        lines.append(f"| `{key}` | {option.type_name} | {shown} | {option.description}{dynamic} |")
    return "\n".join(lines) + "\n"


def _format_duration(value: timedelta) -> str:
    ms = int(value.total_seconds() * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def _format_memory(value: int) -> str:
    for unit, size in (("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10)):
        if value and value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} bytes"
