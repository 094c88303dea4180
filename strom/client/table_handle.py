"""The part of a table handle that writers, lookupers and scanners use; ``Table`` builds on it."""

from __future__ import annotations

import pyarrow as pa

from strom.client.layout import TableLayout
from strom.client.rpc_client import ClusterRpc
from strom.ids import TableBucket, TablePath
from strom.metadata.table_info import TableInfo


class TableHandle:
    """An existing table of the cluster: its connection and layout, what writers, lookupers and scanners
    work on. :class:`~strom.client.table.Table` adds the builders that hand them out."""

    def __init__(self, connection: ClusterRpc, info: TableInfo) -> None:
        self.connection = connection
        self.layout = TableLayout(info)

    @property
    def table_info(self) -> TableInfo:
        return self.layout.info

    def get_table_info(self) -> TableInfo:
        return self.layout.info

    @property
    def table_path(self) -> TablePath:
        return self.layout.info.path

    @property
    def arrow_schema(self) -> pa.Schema:
        return self.layout.arrow_schema

    def has_primary_key(self) -> bool:
        return self.layout.info.has_primary_key

    def bucket(self, bucket_id: int, partition_id: int | None = None) -> TableBucket:
        return TableBucket(self.layout.info.table_id, bucket_id, partition_id)


__all__ = ["TableHandle"]
