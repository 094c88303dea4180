"""Which operation on which resource each request needs: the one place requests are authorized.

:meth:`AccessControl.guard` wraps a handler with its api key's rule; the server wraps every handler when
``authorizer.enabled`` is set (and none otherwise, so an unsecured server runs exactly as before). The
rules follow Fluss's services:

- cluster: CREATE to create a database; DESCRIBE to list leases or lake tiering state (strom extensions);
- database: DROP to drop it, ALTER to alter it, DESCRIBE to read its info, CREATE to create a table in it;
- table: DESCRIBE for its info, schema, partitions, offsets, snapshots and lake snapshot; READ to fetch,
  look up, prefix-look-up, limit-scan, ScanKv, and to acquire, release or drop KV snapshot leases on it;
  WRITE to produce, put, initialise a writer, create or drop partitions, register producer offsets on it
  or delete a producer's offsets that cover it; ALTER to alter; DROP to drop;
- GetProducerOffsets leaves out the tables the principal may not READ, as Fluss does;
- listings (databases, tables) and GetMetadata leave out what the principal may not DESCRIBE;
- FetchLog, Lookup and PrefixLookup answer a denied table per bucket with the authorization error code, as
  Fluss does (the official client reports it per bucket); the others fail as a whole (code 48).

No oracles: a table the principal may not DESCRIBE does not exist for it. A request naming it by id is
answered exactly as one naming an id nobody uses (an unknown table, or a bucket not hosted here; see
:mod:`strom.security.unknown_answers`); TableExists and DatabaseExists answer false, ListTables of a database
it may not DESCRIBE that does not exist answers an empty list, and a producer whose offsets cover such a
table looks like no producer to GetProducerOffsets and DeleteProducerOffsets. An error naming a table is
sent only to a principal that may DESCRIBE it; a request naming a table by path is refused with that path
whether the table exists or not. (Fluss's errors name the table, and answer a missing one differently.)

Requests Fluss leaves unchecked are unchecked here too (ApiVersions, GetFileSystemSecurityToken), but for
DatabaseExists and TableExists, which answer false for what the principal may not DESCRIBE. Fluss leaves the tiering service's coordinator calls unchecked as well; here
they need ALTER on the cluster (LakeTieringHeartbeat, PrepareLakeTableSnapshot, CommitLakeTableSnapshot):
they hand out tables and move their lake offsets, which is the tiering service's privilege.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from strom.errors import (
    AuthorizationError,
    DatabaseNotExistError,
    PartitionNotExistError,
    StromError,
    UnknownTableOrBucketError,
)
from strom.ids import TablePath
from strom.rpc.api_keys import ApiKey
from strom.rpc.auth import ANONYMOUS, Principal
from strom.rpc.messages import Message, pb
from strom.rpc.server import Handler, RequestContext
from strom.security import unknown_answers
from strom.security.acl import OperationType, Resource
from strom.security.authorizer import Authorizer

READ, WRITE, DESCRIBE = OperationType.READ, OperationType.WRITE, OperationType.DESCRIBE


@dataclass(frozen=True, slots=True)
class Caller:
    principal: Principal
    host: str


def caller_of(context: RequestContext) -> Caller:
    """The principal and the client's IP address (the peer without its port)."""
    host = context.peer.rpartition(":")[0].strip("[]") or context.peer
    return Caller(context.principal or ANONYMOUS, host)


Finish = Callable[[Any], Any]
Rule = Callable[[Any, Caller], "Message | Finish | Awaitable[Message | Finish | None] | None"]
"""Checks a request: raises AuthorizationError, returns a response to send instead of calling the handler,
a function that adjusts the handler's response, or None to let the handler answer as it would. A rule that
reads the metadata store is a coroutine (the read runs off the event loop)."""
ProducerTableIds = Callable[[str], Awaitable[Iterable[int]]]
"""The tables a producer's stored offsets cover (read from the metadata store)."""


async def no_producer_tables(_producer_id: str) -> Iterable[int]:
    """For a server that stores no producer offsets."""
    return ()
Recovery = Callable[[Any, Caller, StromError], "Message | None"]
"""Turns a handler's error into the answer to send instead (None: the error stands)."""


class AccessControl:
    """The rules, bound to an authorizer and to the catalog (table id → path, partition id → table id,
    lease → tables)."""

    def __init__(
        self,
        authorizer: Authorizer,
        table_path_by_id: Callable[[int], TablePath | None],
        lease_table_ids: Callable[[str, Principal], Iterable[int]],
        partition_table_id: Callable[[int], int | None] = lambda _partition_id: None,
        producer_table_ids: ProducerTableIds = no_producer_tables,
    ) -> None:
        self._authorizer = authorizer
        self._producer_table_ids = producer_table_ids
        self._table_path_by_id = table_path_by_id
        self._lease_table_ids = lease_table_ids
        self._partition_table_id = partition_table_id
        self._rules: dict[ApiKey, Rule] = {
            ApiKey.CREATE_DATABASE: lambda r, c: self._check(c, OperationType.CREATE, Resource.cluster()),
            ApiKey.DROP_DATABASE: lambda r, c: self._check(c, OperationType.DROP, Resource.database(r.database_name)),
            ApiKey.ALTER_DATABASE: lambda r, c: self._check(
                c, OperationType.ALTER, Resource.database(r.database_name)
            ),
            ApiKey.GET_DATABASE_INFO: lambda r, c: self._check(c, DESCRIBE, Resource.database(r.database_name)),
            ApiKey.LIST_DATABASES: self._list_databases,
            ApiKey.CREATE_TABLE: lambda r, c: self._check(
                c, OperationType.CREATE, Resource.database(r.table_path.database_name)
            ),
            ApiKey.DROP_TABLE: lambda r, c: self._check_path(c, OperationType.DROP, r.table_path),
            ApiKey.ALTER_TABLE: lambda r, c: self._check_path(c, OperationType.ALTER, r.table_path),
            ApiKey.GET_TABLE_INFO: lambda r, c: self._check_path(c, DESCRIBE, r.table_path),
            ApiKey.GET_TABLE_SCHEMA: lambda r, c: self._check_path(c, DESCRIBE, r.table_path),
            ApiKey.LIST_TABLES: self._list_tables,
            ApiKey.LIST_PARTITION_INFOS: lambda r, c: self._check_path(c, DESCRIBE, r.table_path),
            ApiKey.CREATE_PARTITION: lambda r, c: self._check_path(c, WRITE, r.table_path),
            ApiKey.DROP_PARTITION: lambda r, c: self._check_path(c, WRITE, r.table_path),
            ApiKey.GET_METADATA: self._metadata,
            ApiKey.INIT_WRITER: self._init_writer,
            ApiKey.GET_LATEST_KV_SNAPSHOTS: lambda r, c: self._check_path(c, DESCRIBE, r.table_path),
            ApiKey.GET_KV_SNAPSHOT_METADATA: lambda r, c: self._check_id(c, DESCRIBE, r.table_id),
            ApiKey.LIST_KV_SNAPSHOTS: lambda r, c: self._check_id(c, DESCRIBE, r.table_id),
            ApiKey.LIST_REMOTE_LOG_MANIFESTS: lambda r, c: self._check_id(c, DESCRIBE, r.table_id),
            ApiKey.TABLE_EXISTS: self._table_exists,
            ApiKey.DATABASE_EXISTS: self._database_exists,
            ApiKey.ACQUIRE_KV_SNAPSHOT_LEASE: lambda r, c: self._check_ids(
                c, READ, (t.table_id for t in r.snapshots_to_lease)
            ),
            ApiKey.RELEASE_KV_SNAPSHOT_LEASE: self._release_lease,
            # the tables of the caller's own lease only: another's lease is none of its business, and must
            # answer like a missing one (no error naming a table it pins)
            ApiKey.DROP_KV_SNAPSHOT_LEASE: lambda r, c: self._check_ids(
                c, READ, [t for t in self._lease_table_ids(r.lease_id, c.principal) if not self._hidden(c, t)]
            ),
            ApiKey.LIST_KV_SNAPSHOT_LEASES: lambda r, c: self._check(c, DESCRIBE, Resource.cluster()),
            ApiKey.DESCRIBE_LAKE_TIERING: lambda r, c: self._check(c, DESCRIBE, Resource.cluster()),
            ApiKey.GET_LAKE_SNAPSHOT: lambda r, c: self._check_path(c, DESCRIBE, r.table_path),
            ApiKey.LAKE_TIERING_HEARTBEAT: lambda r, c: self._check(c, OperationType.ALTER, Resource.cluster()),
            ApiKey.PREPARE_LAKE_TABLE_SNAPSHOT: lambda r, c: self._check(c, OperationType.ALTER, Resource.cluster()),
            ApiKey.COMMIT_LAKE_TABLE_SNAPSHOT: lambda r, c: self._check(c, OperationType.ALTER, Resource.cluster()),
            ApiKey.REGISTER_PRODUCER_OFFSETS: lambda r, c: self._check_ids(c, WRITE, (t.table_id for t in r.table_offsets)),
            ApiKey.GET_PRODUCER_OFFSETS: self._get_producer_offsets,
            ApiKey.DELETE_PRODUCER_OFFSETS: self._delete_producer_offsets,
            ApiKey.PRODUCE_LOG: lambda r, c: self._unknown_or_check(
                c, WRITE, r.table_id, lambda: unknown_answers.per_bucket(pb.ProduceLogResponse(), r.table_id, r.buckets_req)),
            ApiKey.PUT_KV: lambda r, c: self._unknown_or_check(
                c, WRITE, r.table_id, lambda: unknown_answers.per_bucket(pb.PutKvResponse(), r.table_id, r.buckets_req)),
            ApiKey.LIST_OFFSETS: lambda r, c: self._unknown_or_check(
                c, DESCRIBE, r.table_id, lambda: unknown_answers.list_offsets(r)),
            ApiKey.LIMIT_SCAN: lambda r, c: self._unknown_or_check(
                c, READ, r.table_id, lambda: unknown_answers.one_bucket(pb.LimitScanResponse(), r.table_id, r)),
            ApiKey.GET_TABLE_STATS: lambda r, c: self._unknown_or_check(
                c, READ, r.table_id,
                lambda: unknown_answers.per_bucket(pb.GetTableStatsResponse(), r.table_id, r.buckets_req)),
            ApiKey.GET_CLUSTER_HEALTH: lambda r, c: self._check(c, DESCRIBE, Resource.cluster()),
            ApiKey.DESCRIBE_CLUSTER_CONFIGS: lambda r, c: self._check(c, DESCRIBE, Resource.cluster()),
            ApiKey.ALTER_CLUSTER_CONFIGS: lambda r, c: self._check(c, OperationType.ALTER, Resource.cluster()),
            ApiKey.ADD_SERVER_TAG: lambda r, c: self._check(c, OperationType.ALTER, Resource.cluster()),
            ApiKey.REMOVE_SERVER_TAG: lambda r, c: self._check(c, OperationType.ALTER, Resource.cluster()),
            ApiKey.REBALANCE: lambda r, c: self._check(c, OperationType.ALTER, Resource.cluster()),
            ApiKey.CANCEL_REBALANCE: lambda r, c: self._check(c, OperationType.ALTER, Resource.cluster()),
            ApiKey.LIST_REBALANCE_PROGRESS: lambda r, c: self._check(c, DESCRIBE, Resource.cluster()),
            ApiKey.SCAN_KV: self._scan_kv,
            ApiKey.LOOKUP: self._lookup,
            ApiKey.PREFIX_LOOKUP: lambda r, c: self._per_bucket(c, r, pb.PrefixLookupResponse),
            ApiKey.FETCH_LOG: self._fetch_log,
        }

        self._recoveries: dict[ApiKey, Recovery] = {ApiKey.LIST_TABLES: self._list_tables_of_unknown}

    def guard(self, key: ApiKey, handler: Handler) -> Handler:
        """``handler`` behind ``key``'s rule (``handler`` itself when the key has none); a plain handler
        stays plain, so it still runs inline."""
        recovery = self._recoveries.get(key)
        if recovery is not None:
            handler = _recovering(handler, recovery)
        rule = self._rules.get(key)
        if rule is None:
            return handler
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(rule):
            async def guarded_async(request: Message, context: RequestContext) -> Message:
                outcome = rule(request, caller_of(context))
                if inspect.isawaitable(outcome):  # a rule that reads the metadata store
                    outcome = await outcome
                if isinstance(outcome, Message):
                    return outcome
                response = handler(request, context)
                if inspect.isawaitable(response):
                    response = await response
                return outcome(response) if outcome is not None else response  # type: ignore[no-any-return]

            return guarded_async

        def guarded(request: Message, context: RequestContext) -> Message | Awaitable[Message]:
            outcome = rule(request, caller_of(context))
            if isinstance(outcome, Message):
                return outcome
            response = handler(request, context)
            if outcome is None:
                return response
            assert not inspect.isawaitable(outcome), "a coroutine rule guards through guarded_async"
            if inspect.isawaitable(response):  # a plain handler that had to wait this time
                finish = outcome

                async def finished() -> Message:
                    return finish(await response)  # type: ignore[no-any-return]

                return finished()
            return outcome(response)  # type: ignore[no-any-return]

        return guarded

    # ---- checks ----
    def _allowed(self, caller: Caller, operation: OperationType, resource: Resource) -> bool:
        return self._authorizer.is_authorized(caller.principal, caller.host, operation, resource)

    def _check(self, caller: Caller, operation: OperationType, resource: Resource) -> None:
        self._authorizer.authorize(caller.principal, caller.host, operation, resource)

    def _check_path(self, caller: Caller, operation: OperationType, path: Any) -> None:
        self._check(caller, operation, Resource.table(path.database_name, path.table_name))

    def _table_resource(self, table_id: int) -> Resource | None:
        """None for an unknown table: the handler answers that with its own error."""
        path = self._table_path_by_id(table_id)
        return None if path is None else Resource.table(path.database_name, path.table_name)

    def _hidden(self, caller: Caller, table_id: int) -> bool:
        """Whether ``table_id`` is a table the caller may not DESCRIBE, which therefore does not exist for it."""
        resource = self._table_resource(table_id)
        return resource is not None and not self._allowed(caller, DESCRIBE, resource)

    def _check_id(self, caller: Caller, operation: OperationType, table_id: int) -> None:
        """``operation`` on a known table; a hidden one is refused as the coordinator refuses an unknown id,
        an unknown one is left to the handler."""
        resource = self._table_resource(table_id)
        if resource is None:
            return
        if not self._allowed(caller, DESCRIBE, resource):
            raise UnknownTableOrBucketError.unknown_table_id(table_id)
        self._check(caller, operation, resource)

    def _check_ids(self, caller: Caller, operation: OperationType, table_ids: Iterable[int]) -> None:
        for table_id in sorted(set(table_ids)):
            self._check_id(caller, operation, table_id)

    def _unknown_or_check(
        self, caller: Caller, operation: OperationType, table_id: int, unknown: Callable[[], Message]
    ) -> Message | None:
        """A data-path request: ``unknown()`` (the not-hosted answer) for a hidden table, else the check."""
        if self._hidden(caller, table_id):
            return unknown()
        self._check_id(caller, operation, table_id)
        return None

    def _denied_id(self, caller: Caller, operation: OperationType, table_id: int | None) -> bool:
        """Whether a known table is denied (an unknown one is left to the handler's own error)."""
        if table_id is None:
            return False
        resource = self._table_resource(table_id)
        return resource is not None and not self._allowed(caller, operation, resource)

    # ---- rules that shape requests or responses ----
    def _get_producer_offsets(self, request: Any, caller: Caller) -> Finish:
        """Only the tables the caller may READ (Fluss leaves the others out); a producer left with none
        answers as one that does not exist."""
        def finish(response: Any) -> Any:
            kept = [t for t in response.table_offsets if not self._denied_id(caller, READ, t.table_id)]
            if response.table_offsets and not kept:
                return pb.GetProducerOffsetsResponse()
            del response.table_offsets[:]
            response.table_offsets.extend(kept)
            return response

        return finish

    async def _delete_producer_offsets(self, request: Any, caller: Caller) -> Message | None:
        """WRITE on every table the producer's offsets cover; one the caller may not DESCRIBE makes the
        producer none of its business: answered as a producer that does not exist, nothing deleted."""
        table_ids = set(await self._producer_table_ids(request.producer_id))
        if any(self._hidden(caller, table_id) for table_id in table_ids):
            return pb.DeleteProducerOffsetsResponse()  # type: ignore[no-any-return]
        self._check_ids(caller, WRITE, table_ids)
        return None

    def _release_lease(self, request: Any, caller: Caller) -> None:
        """READ on the tables released; buckets of a table the caller may not DESCRIBE are left out, as
        releasing a bucket of an unknown table changes nothing."""
        _keep_only(request.buckets_to_release, lambda bucket: not self._hidden(caller, bucket.table_id))
        self._check_ids(caller, READ, (bucket.table_id for bucket in request.buckets_to_release))

    def _table_exists(self, request: Any, caller: Caller) -> Finish:
        path = request.table_path
        visible = self._allowed(caller, DESCRIBE, Resource.table(path.database_name, path.table_name))
        return lambda response: response if visible else pb.TableExistsResponse(exists=False)

    def _database_exists(self, request: Any, caller: Caller) -> Finish:
        visible = self._allowed(caller, DESCRIBE, Resource.database(request.database_name))
        return lambda response: response if visible else pb.DatabaseExistsResponse(exists=False)

    def _list_tables_of_unknown(self, request: Any, caller: Caller, error: StromError) -> Message | None:
        """A database the caller may not DESCRIBE lists no table to it, existing or not."""
        if isinstance(error, DatabaseNotExistError) and not self._allowed(
                caller, DESCRIBE, Resource.database(request.database_name)):
            return pb.ListTablesResponse()  # type: ignore[no-any-return]
        return None

    def _list_databases(self, request: Any, caller: Caller) -> Finish:
        def finish(response: Any) -> Any:
            names = [n for n in response.database_name if self._allowed(caller, DESCRIBE, Resource.database(n))]
            summaries = [
                s for s in response.database_summary
                if self._allowed(caller, DESCRIBE, Resource.database(s.database_name))
            ]
            del response.database_name[:]
            response.database_name.extend(names)
            del response.database_summary[:]
            response.database_summary.extend(summaries)
            return response

        return finish

    def _list_tables(self, request: Any, caller: Caller) -> Finish:
        database = request.database_name

        def finish(response: Any) -> Any:
            names = [n for n in response.table_name if self._allowed(caller, DESCRIBE, Resource.table(database, n))]
            del response.table_name[:]
            response.table_name.extend(names)
            return response

        return finish

    def _metadata(self, request: Any, caller: Caller) -> None:
        """Leave out the tables and partitions the principal may not DESCRIBE (Fluss answers without them)."""
        def visible(path: Any) -> bool:
            return self._allowed(caller, DESCRIBE, Resource.table(path.database_name, path.table_name))

        for field in (request.table_path, request.partitions_path):
            _keep_only(field, visible)
        for partition_id in request.partitions_id:  # by id: a hidden table's partition is an unknown id
            if self._denied_id(caller, DESCRIBE, self._partition_table_id(partition_id)):
                raise PartitionNotExistError.unknown_id(partition_id)

    def _init_writer(self, request: Any, caller: Caller) -> None:
        """WRITE on at least one of the tables the writer will write (Fluss's rule)."""
        paths = list(request.table_path)
        if self._authorizer.is_super_user(caller.principal):
            return
        if not paths:
            raise AuthorizationError("InitWriter names no table to authorize")
        if not any(self._allowed(caller, WRITE, Resource.table(p.database_name, p.table_name)) for p in paths):
            tables = ", ".join(f"{p.database_name}.{p.table_name}" for p in paths)
            raise AuthorizationError(f"principal {caller.principal} may not WRITE any of: {tables}")

    def _scan_kv(self, request: Any, caller: Caller) -> Message | None:
        """A new scan needs READ; continuations carry the id of a scan that was authorized when opened."""
        if not request.HasField("bucket_scan_req"):
            return None
        bucket = request.bucket_scan_req
        return self._unknown_or_check(
            caller, READ, bucket.table_id, lambda: unknown_answers.one_bucket(pb.ScanKvResponse(), bucket.table_id, bucket))

    def _denial_message(self, caller: Caller, table_id: int, operation: OperationType = READ) -> str:
        return f"principal {caller.principal} may not {operation.name} {self._table_resource(table_id)}"

    def _lookup(self, request: Any, caller: Caller) -> Message | None:
        """READ; a lookup that inserts missing keys also writes, so it needs WRITE as well (as in Fluss)."""
        if request.HasField("insert_if_not_exists") and request.insert_if_not_exists:
            denied = self._per_bucket(caller, request, pb.LookupResponse, WRITE)
            if denied is not None:
                return denied
        return self._per_bucket(caller, request, pb.LookupResponse)

    def _per_bucket(
        self, caller: Caller, request: Any, response_class: Any, operation: OperationType = READ
    ) -> Message | None:
        """Lookup and PrefixLookup: one table per request; when it is denied every bucket says so (as not
        hosted when the caller may not DESCRIBE it)."""
        if self._hidden(caller, request.table_id):
            return unknown_answers.per_bucket(response_class(), request.table_id, request.buckets_req)  # type: ignore[no-any-return]
        if not self._denied_id(caller, operation, request.table_id):
            return None
        response = response_class()
        message = self._denial_message(caller, request.table_id, operation)
        for bucket in request.buckets_req:
            entry = response.buckets_resp.add(
                bucket_id=bucket.bucket_id, error_code=AuthorizationError.code, error_message=message
            )
            if bucket.HasField("partition_id"):
                entry.partition_id = bucket.partition_id
        return response  # type: ignore[no-any-return]

    def _fetch_log(self, request: Any, caller: Caller) -> Message | Finish | None:
        """Denied tables are taken out of the request and answered per bucket; the rest is fetched."""
        denied = [table for table in request.tables_req if self._denied_id(caller, READ, table.table_id)]
        if not denied:
            return None
        errors = pb.FetchLogResponse()
        for table in denied:
            if self._hidden(caller, table.table_id):
                unknown_answers.fetch_log_table(errors, table)
                continue
            entry = errors.tables_resp.add(table_id=table.table_id)
            message = self._denial_message(caller, table.table_id)
            for bucket in table.buckets_req:
                item = entry.buckets_resp.add(
                    bucket_id=bucket.bucket_id, error_code=AuthorizationError.code, error_message=message
                )
                if bucket.HasField("partition_id"):
                    item.partition_id = bucket.partition_id
        denied_ids = {table.table_id for table in denied}
        if len(denied_ids) == len({table.table_id for table in request.tables_req}):
            return errors  # type: ignore[no-any-return]
        _keep_only(request.tables_req, lambda table: table.table_id not in denied_ids)

        def finish(response: Any) -> Any:
            response.tables_resp.extend(errors.tables_resp)
            return response

        return finish


def _recovering(handler: Handler, recovery: Recovery) -> Handler:
    """``handler`` whose StromError ``recovery`` may turn into an answer (async, as it awaits the handler)."""
    async def recovered(request: Message, context: RequestContext) -> Message:
        try:
            response = handler(request, context)
            return await response if inspect.isawaitable(response) else response  # type: ignore[no-any-return]
        except StromError as exc:
            answer = recovery(request, caller_of(context), exc)
            if answer is None:
                raise
            return answer

    return recovered


def _keep_only(field: Any, keep: Callable[[Any], bool]) -> None:
    """Remove the entries of a repeated message field that ``keep`` rejects (copies survive the clear)."""
    kept = [entry.SerializeToString() for entry in field if keep(entry)]
    del field[:]
    for data in kept:
        field.add().MergeFromString(data)
