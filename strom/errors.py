"""Every error strom raises, each bound to its Apache Fluss error code.

The codes are part of the wire protocol: clients branch on them (pyfluss retries some per-bucket codes,
treats 32 as success, turns 36 into "no row"), so a code is never renumbered. The server maps an exception
to a code in exactly one place (:func:`code_for_exception`); the client maps a code back with
:func:`error_for_code`. Retriable errors derive from :class:`RetriableError`: the caller may try again.
"""

from __future__ import annotations


class StromError(Exception):
    """Base of every error with a Fluss error code."""

    code: int = -1
    default_message = "An unexpected server error occurred."

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.default_message)

    @property
    def message(self) -> str:
        return str(self)


class RetriableError(StromError):
    """A transient failure: the same request may succeed if sent again (after a metadata refresh)."""


class UnknownServerError(StromError):
    """A bug or an unexpected failure in the server; the message says what happened."""

    code = -1


class NotInstalledError(UnknownServerError):
    """An optional part's library is missing (ZooKeeper's client); the message names the extra to install."""


class MalformedRowError(UnknownServerError):
    """A record passed its CRC but its row does not decode with the table's schema: the client wrote
    bytes for another schema. Nothing of the request was written. (Fluss has no dedicated code; -1 is
    not retried by clients, unlike CORRUPT_RECORD.)"""

    default_message = "A row does not decode with the table's schema."


class UnsupportedMergeOperationError(UnknownServerError):
    """The table's merge engine does not support this kind of write (a partial update of a first_row or
    versioned table). Fluss fails such a write with an unknown server error too; nothing was written."""

    default_message = "The merge engine of this table does not support this operation."


class BitmapFormatError(UnknownServerError):
    """A value of an rbm32/rbm64 aggregation column is not a serialized roaring bitmap of that width
    (Fluss fails the write with an unknown server error as well). Nothing of the request was written."""

    default_message = "A value is not a serialized roaring bitmap."


class InvalidAlterDatabaseError(UnknownServerError):
    """An AlterDatabase change strom cannot apply: an op type other than SET and DELETE, a SET without a
    value, a key, value or comment that is not valid UTF-8. Fluss fails such a request with an unknown
    server error too (it has no dedicated code); nothing was changed."""

    default_message = "The database change is not supported."


class NetworkError(RetriableError):
    code = 1
    default_message = "The server disconnected before a response was received."


class UnsupportedVersionError(StromError):
    """The api key or version is not served here; upgrade the server or use another call."""

    code = 2
    default_message = "The version of API is not supported."


class CorruptMessageError(RetriableError):
    """The request frame or its protobuf body could not be parsed."""

    code = 3
    default_message = "The message is corrupt (for example a bad CRC or a truncated body)."


class DatabaseNotExistError(StromError):
    code = 4
    default_message = "The database does not exist."


class DatabaseNotEmptyError(StromError):
    """Drop the tables first, or drop with cascade."""

    code = 5
    default_message = "The database is not empty."


class DatabaseAlreadyExistError(StromError):
    code = 6
    default_message = "The database already exists."


class TableNotExistError(StromError):
    code = 7
    default_message = "The table does not exist."


class TableAlreadyExistError(StromError):
    code = 8
    default_message = "The table already exists."


class SchemaNotExistError(StromError):
    code = 9
    default_message = "The schema does not exist."


class LogStorageError(RetriableError):
    code = 10
    default_message = "The log storage failed."


class KvStorageError(RetriableError):
    code = 11
    default_message = "The kv storage failed."


class NotLeaderOrFollowerError(RetriableError):
    """Refresh metadata and send the request to the bucket's current leader."""

    code = 12
    default_message = "This server is not the leader of the bucket."


class RecordTooLargeError(StromError):
    code = 13
    default_message = "The record is too large."


class CorruptRecordError(RetriableError):
    code = 14
    default_message = "The record is corrupt."


class InvalidTableError(StromError):
    code = 15
    default_message = "The table is invalid."


class InvalidDatabaseError(StromError):
    code = 16
    default_message = "The database name is invalid."


class InvalidReplicationFactorError(StromError):
    code = 17
    default_message = "The replication factor is larger than the number of available tablet servers."


class InvalidRequiredAcksError(StromError):
    code = 18
    default_message = "The required acks are invalid."


class LogOffsetOutOfRangeError(StromError):
    code = 19
    default_message = "The requested offset is out of the log's range."


class NonPrimaryKeyTableError(StromError):
    code = 20
    default_message = "The table is not a primary key table."


class UnknownTableOrBucketError(RetriableError):
    code = 21
    default_message = "This server does not host the table or bucket."

    @classmethod
    def not_hosted(cls, bucket: object) -> UnknownTableOrBucketError:
        """What a tablet server answers for a bucket it does not host: one text, so that a bucket of a table
        the caller may not DESCRIBE is answered exactly alike."""
        return cls(f"{bucket} is not hosted by this server")

    @classmethod
    def unknown_table_id(cls, table_id: int) -> UnknownTableOrBucketError:
        """What the coordinator answers for a table id it does not know (and, alike, for one of a table the
        caller may not DESCRIBE)."""
        return cls(f"Table id {table_id} does not exist.")


class InvalidUpdateVersionError(StromError):
    """An ISR change proposed against a bucket state that has since been rewritten (AdjustIsr)."""

    code = 22
    default_message = "The update version is invalid."


class InvalidCoordinatorError(StromError):
    code = 23
    default_message = "The coordinator epoch is invalid."


class FencedLeaderEpochError(StromError):
    """A request made by a bucket's leader under an epoch that has since been superseded (a snapshot taken
    by a replica that no longer leads): its result must not be recorded."""

    code = 24
    default_message = "The leader epoch is invalid."


class RequestTimeoutError(RetriableError):
    code = 25
    default_message = "The request timed out."


class StorageError(RetriableError):
    code = 26
    default_message = "The storage failed."


class NotEnoughReplicasAfterAppendError(RetriableError):
    """The write is in the leader's log and committed, but the in-sync replicas shrank below
    ``log.replica.min-in-sync-replicas-number`` before it was acknowledged (an idempotent writer's retry
    is a duplicate the server recognises)."""

    code = 28
    default_message = "Records are written to the server already, but to fewer in-sync replicas than required."


class NotEnoughReplicasError(RetriableError):
    """A write with acks = all was refused before it was appended: fewer in-sync replicas than
    ``log.replica.min-in-sync-replicas-number``."""

    code = 29
    default_message = "Messages are rejected since there are fewer in-sync replicas than required."


class OutOfOrderSequenceError(StromError):
    code = 31
    default_message = "The writer's batch sequence is out of order."


class DuplicateSequenceError(StromError):
    """The batch was already written; clients treat this as success."""

    code = 32
    default_message = "The batch was already written (duplicate sequence)."


class UnknownWriterIdError(StromError):
    """The server has no state for this writer id; the client re-initialises its writer."""

    code = 33
    default_message = "The writer id is unknown."


class InvalidColumnProjectionError(StromError):
    code = 34
    default_message = "The column projection is invalid."


class InvalidTargetColumnError(StromError):
    code = 35
    default_message = "The target columns of the partial update are invalid."


class PartitionNotExistError(StromError):
    code = 36
    default_message = "The partition does not exist."

    @classmethod
    def unknown_id(cls, partition_id: int) -> PartitionNotExistError:
        """A partition id nobody knows (and, alike, one of a table the caller may not DESCRIBE)."""
        return cls(f"Partition id {partition_id} does not exist.")


class TableNotPartitionedError(StromError):
    code = 37
    default_message = "The table is not partitioned."


class InvalidTimestampError(StromError):
    code = 38
    default_message = "The timestamp is invalid."


class InvalidConfigError(StromError):
    code = 39
    default_message = "The config is invalid."


class KvSnapshotNotExistError(StromError):
    code = 41
    default_message = "The kv snapshot does not exist."


class PartitionAlreadyExistsError(StromError):
    code = 42
    default_message = "The partition already exists."


class PartitionSpecInvalidError(StromError):
    code = 43
    default_message = "The partition spec is invalid."


class LeaderNotAvailableError(RetriableError):
    code = 44
    default_message = "No leader is available for the bucket."


class PartitionMaxNumError(StromError):
    code = 45
    default_message = "The maximum number of partitions is reached."


class AuthenticationError(StromError):
    code = 46
    default_message = "Authentication failed."


class SecurityDisabledError(StromError):
    code = 47
    default_message = "Security is disabled."


class AuthorizationError(StromError):
    code = 48
    default_message = "Authorization failed."


class BucketMaxNumError(StromError):
    code = 49
    default_message = "The maximum number of buckets is reached."


class FencedTieringEpochError(StromError):
    code = 50
    default_message = "The tiering epoch is fenced."


class LakeSnapshotNotExistError(StromError):
    code = 53
    default_message = "The lake snapshot does not exist."


class IneligibleReplicaError(StromError):
    """A proposed ISR names a replica that may not be in it: not live, or the leader left out (AdjustIsr)."""

    code = 55
    default_message = "The new ISR contains at least one ineligible replica."


class InvalidAlterTableError(StromError):
    code = 56
    default_message = "The alter table request is invalid."


class DeletionDisabledError(StromError):
    code = 57
    default_message = "Deletion is disabled on this table."


class ServerNotExistError(StromError):
    """A server id no tablet server of the cluster has."""

    code = 58
    default_message = "The server does not exist."


class ServerTagAlreadyExistError(StromError):
    """The server carries another tag; remove that one first."""

    code = 59
    default_message = "The server tag already exists."


class ServerTagNotExistError(StromError):
    code = 60
    default_message = "The server tag does not exist."


class RebalanceFailureError(StromError):
    """A rebalance could not be planned or started (another is in progress, no server can take a replica)."""

    code = 61
    default_message = "The rebalance task failed."


class NoRebalanceInProgressError(StromError):
    code = 62
    default_message = "No rebalance task is in progress."


class InvalidProducerIdError(StromError):
    """A producer id that cannot name a producer's offsets (it follows the rules of table names)."""

    code = 63
    default_message = "The client has attempted to perform an operation with an invalid producer ID."


class NotCoordinatorLeaderError(RetriableError):
    """A standby coordinator got a request only the active one serves; ask the active coordinator."""

    code = 65
    default_message = "The coordinator is not a leader and cannot process request."


class ScannerExpiredError(StromError):
    """The scan session idled past ``kv.scanner.ttl`` or lost its bucket; restart the scan."""

    code = 66
    default_message = "The scanner expired; restart the scan."


class UnknownScannerIdError(StromError):
    """The scan session is unknown or already finished; restart the scan."""

    code = 67
    default_message = "Unknown scanner id."


class InvalidScanRequestError(StromError):
    code = 68
    default_message = "The scan request is invalid."


class TooManyScannersError(StromError):
    """The per-bucket or per-server scanner limit is reached; back off and open again."""

    code = 69
    default_message = "The per-bucket or per-server scanner session limit has been reached."


class DiskWriteLockedError(RetriableError):
    """The tablet server's data disk reached ``server.data-disk.write-limit-ratio``: client writes are
    refused until usage falls to ``server.data-disk.write-recover-ratio`` (followers still replicate)."""

    code = 70
    default_message = (
        "The tablet server has rejected writes because its data disk usage reached the configured write-limit ratio."
    )


class InsufficientKvLeaderReplicaCapacityError(StromError):
    """Creating a primary-key table or partition would take the cluster past its KV leader replica capacity
    (``kv.leader-replica.memory-reserved``); nothing was created. Not retriable (Fluss's
    InsufficientKvLeaderReplicaCapacityException): drop primary-key tables, add tablet servers or raise
    the cap first."""

    code = 71
    default_message = "The cluster does not have enough KV leader replica capacity."


class StorageBackpressureError(RetriableError):
    code = 72
    default_message = "The storage is applying back pressure; retry later."


class HistoricalPartitionThrottledError(RetriableError):
    """Too many lookups of expired partitions are being read from the lake on this tablet server
    (``netty.server.max-queued-historical-requests``): retry after a back-off."""

    code = 73
    default_message = "Too many historical partition lookups are in progress; retry later."


class ConnectionFailedError(RetriableError):
    """Client side: the server could not be reached (it never sent a code, so this maps to NETWORK)."""

    code = 1
    default_message = "Could not connect to the server."


_BY_CODE: dict[int, type[StromError]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, StromError) and _cls not in (
        StromError,
        RetriableError,
        ConnectionFailedError,
        MalformedRowError,
        UnsupportedMergeOperationError,
        BitmapFormatError,
        InvalidAlterDatabaseError,
        NotInstalledError,
    ):
        assert _cls.code not in _BY_CODE, f"duplicate error code {_cls.code}"
        _BY_CODE[_cls.code] = _cls


def error_for_code(code: int, message: str | None = None) -> StromError:
    """The exception a client raises for an error code received on the wire."""
    cls = _BY_CODE.get(code)
    if cls is None:
        error = StromError(message or f"Fluss error code {code}")
        error.code = code
        return error
    return cls(message)


def code_for_exception(exc: BaseException) -> tuple[int, str]:
    """The error code and message the server sends for an exception; unknown failures are -1."""
    if isinstance(exc, StromError):
        return exc.code, str(exc)
    return UnknownServerError.code, f"{type(exc).__name__}: {exc}"
