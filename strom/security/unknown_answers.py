"""What a tablet server answers about a table it does not know, built for a table the caller may not DESCRIBE.

To a principal without DESCRIBE on a table, the table does not exist: a request naming it by id is answered
exactly as one naming an id nobody uses, so neither its name nor its existence can be learnt by probing ids
(``tests/integration/test_no_oracles.py`` compares the two answers for every api key). The data-path
requests answer an unknown table per bucket, "not hosted by this server" (:meth:`UnknownTableOrBucketError.
not_hosted`, the text the replica manager uses); these functions build that answer without reaching the
handler.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from strom.errors import UnknownTableOrBucketError
from strom.ids import TableBucket
from strom.rpc.messages import pb


def _partition_of(entry: Any) -> int | None:
    return entry.partition_id if entry.HasField("partition_id") else None


def _fill(entry: Any, bucket: TableBucket) -> None:
    error = UnknownTableOrBucketError.not_hosted(bucket)
    entry.error_code, entry.error_message = error.code, str(error)


def per_bucket(response: Any, table_id: int, bucket_requests: Iterable[Any]) -> Any:
    """``response`` (ProduceLog, PutKv, Lookup, PrefixLookup, GetTableStats) with each requested bucket
    answered as not hosted, partition ids echoed."""
    for request in bucket_requests:
        bucket = TableBucket(table_id, request.bucket_id, _partition_of(request))
        entry = response.buckets_resp.add(bucket_id=request.bucket_id)
        if bucket.partition_id is not None:
            entry.partition_id = bucket.partition_id
        _fill(entry, bucket)
    return response


def fetch_log_table(response: Any, table_request: Any) -> None:
    """One table of a FetchLog request, added to ``response`` with each bucket answered as not hosted."""
    per_bucket(response.tables_resp.add(table_id=table_request.table_id), table_request.table_id,
               table_request.buckets_req)


def list_offsets(request: Any) -> Any:
    """A ListOffsets answer (per bucket id, no partition echoed, as the handler answers)."""
    response = pb.ListOffsetsResponse()
    for bucket_id in request.bucket_id:
        _fill(response.buckets_resp.add(bucket_id=bucket_id),
              TableBucket(request.table_id, bucket_id, _partition_of(request)))
    return response


def one_bucket(response: Any, table_id: int, request: Any) -> Any:
    """A LimitScan or ScanKv answer: one bucket, the error in the response itself."""
    _fill(response, TableBucket(table_id, request.bucket_id, _partition_of(request)))
    return response


__all__ = ["fetch_log_table", "list_offsets", "one_bucket", "per_bucket"]
