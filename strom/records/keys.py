"""Which key bytes and which bucket function a table uses: Fluss picks both by the table's lake format.

Tables of a cluster whose lake format is Iceberg carry ``table.datalake.format=iceberg`` from their
creation: their primary key (a single column) is encoded as Iceberg hashes it and bucketed with Iceberg's
murmur3, so a strom bucket is exactly an Iceberg ``bucket[N]`` partition of the lake copy. Tables of a
Paimon cluster likewise carry ``paimon``: their keys are Paimon ``BinaryRow`` bytes, bucketed as Paimon
buckets a row, so a strom bucket is a Paimon bucket. Every other table (no lake format, Delta, which has
no bucket transform, or Lance) uses the CompactedRow key encoding and Fluss's own bucket hash.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from strom.records.bucketing import bucket_for_key, iceberg_bucket_for_key, paimon_bucket_for_key
from strom.records.compacted import CompactedKeyEncoder
from strom.records.iceberg_key import IcebergKeyEncoder
from strom.records.paimon_key import PaimonKeyEncoder
from strom.records.types import RowType
from strom.table_properties import TableProperties

ICEBERG = "iceberg"
PAIMON = "paimon"
KEYED_LAKE_FORMATS = (ICEBERG, PAIMON)
"""The lake formats that decide a table's key bytes and buckets (every table of such a cluster carries its
format from creation)."""

KeyEncoder = CompactedKeyEncoder | IcebergKeyEncoder | PaimonKeyEncoder
BucketFunction = Callable[[bytes, int], int]


def key_lake_format(properties: Mapping[str, str]) -> str | None:
    """The lake format that decides the table's key encoding and bucketing (None: Fluss's defaults)."""
    lake_format = TableProperties(properties).datalake_format
    return lake_format if lake_format in KEYED_LAKE_FORMATS else None


def key_encoder(row_type: RowType, key_indexes: Sequence[int], lake_format: str | None) -> KeyEncoder:
    """The encoder of primary-key and bucket-key bytes (Fluss's ``KeyEncoder.of``).

    Raises:
        InvalidTableError: Iceberg with several key columns, or a column type Iceberg or Paimon cannot key by.
    """
    if lake_format == ICEBERG and key_indexes:  # a table without keys (a log table) never encodes one
        return IcebergKeyEncoder(row_type, key_indexes)
    if lake_format == PAIMON and key_indexes:
        return PaimonKeyEncoder(row_type, key_indexes)
    return CompactedKeyEncoder(row_type, key_indexes)


def bucket_function(lake_format: str | None) -> BucketFunction:
    """``(key bytes, bucket count) -> bucket`` (Fluss's ``BucketingFunction.of``)."""
    if lake_format == ICEBERG:
        return iceberg_bucket_for_key
    return paimon_bucket_for_key if lake_format == PAIMON else bucket_for_key
