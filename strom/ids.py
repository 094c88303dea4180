"""Value types that name things across every layer: tables, partitions and buckets."""

from __future__ import annotations

from typing import NamedTuple


class TablePath(NamedTuple):
    """``database.table``. A named tuple: hashing and comparing these is on hot paths."""

    database_name: str
    table_name: str

    def __str__(self) -> str:
        return f"{self.database_name}.{self.table_name}"

    @classmethod
    def parse(cls, text: str) -> TablePath:
        database, sep, table = text.partition(".")
        if not sep or not database or not table:
            raise ValueError(f"expected DATABASE.TABLE, got {text!r}")
        return cls(database, table)


class TableBucket(NamedTuple):
    """One bucket of a table (of one partition, for partitioned tables). A named tuple: buckets key the
    lease, snapshot and scan bookkeeping, where hashing speed matters."""

    table_id: int
    bucket: int
    partition_id: int | None = None

    def sort_key(self) -> tuple[int, int, int]:
        """Table, partition (none first), bucket: an order for buckets of partitioned and plain tables alike
        (the tuple order would compare a partition id with None)."""
        return self.table_id, -1 if self.partition_id is None else self.partition_id, self.bucket

    def __str__(self) -> str:
        if self.partition_id is None:
            return f"TableBucket(table_id={self.table_id}, bucket={self.bucket})"
        return f"TableBucket(table_id={self.table_id}, partition_id={self.partition_id}, bucket={self.bucket})"
