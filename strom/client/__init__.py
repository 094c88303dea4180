"""strom's Python client. Names mirror pyfluss so its users feel at home::

    async with await Connection.create("127.0.0.1:9123") as connection:
        table = await connection.get_table(TablePath("fluss", "orders"))
        writer = table.new_upsert().create_writer()
        writer.upsert({"id": 1, "amount": 10})
        await writer.flush()
"""

from strom.client.admin import Admin, DatabaseInfo, OffsetSpec, PartitionInfo, ServerNode
from strom.client.connection import Connection
from strom.client.log_scanner import EARLIEST_OFFSET, LogScanner, ScanBatch
from strom.client.lookup import Lookuper, PrefixLookuper
from strom.client.predicates import Predicate, col
from strom.client.producers import ProducerOffsets, RegisterResult
from strom.client.rebalance import RebalanceProgress
from strom.client.table import Table
from strom.client.writer import AppendWriter, ReplayableWriterId, UpsertWriter, WriteResultHandle
from strom.ids import TableBucket, TablePath
from strom.metadata.rebalance_plan import GoalType, RebalanceStatus, ServerTag
from strom.records.schema import Column, DatabaseDescriptor, Schema, TableDescriptor

__all__ = [
    "EARLIEST_OFFSET",
    "Admin",
    "AppendWriter",
    "Column",
    "Connection",
    "DatabaseDescriptor",
    "DatabaseInfo",
    "GoalType",
    "LogScanner",
    "Lookuper",
    "OffsetSpec",
    "PartitionInfo",
    "Predicate",
    "PrefixLookuper",
    "ProducerOffsets",
    "RebalanceProgress",
    "RebalanceStatus",
    "RegisterResult",
    "ReplayableWriterId",
    "ScanBatch",
    "Schema",
    "ServerNode",
    "ServerTag",
    "Table",
    "TableBucket",
    "TableDescriptor",
    "TablePath",
    "UpsertWriter",
    "WriteResultHandle",
    "col",
]
