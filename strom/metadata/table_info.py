"""A table as both roles see it: id, path, schema id and the parsed Fluss descriptor."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from strom.errors import (
    InvalidDatabaseError,
    InvalidProducerIdError,
    InvalidTableError,
    PartitionSpecInvalidError,
    SchemaNotExistError,
)
from strom.ids import TableBucket, TablePath
from strom.metadata.store import TableRecord
from strom.records.schema import Schema, TableDescriptor
from strom.table_properties import TableProperties

NAME_LENGTH_MAX = 200
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
INTERNAL_NAME_PREFIX = "__"
PARTITION_NAME_SEPARATOR = "$"


def _name_problem(name: str, *, internal_allowed: bool = False) -> str | None:
    if not isinstance(name, str):  # protobuf hands a string field that is not valid UTF-8 over as bytes
        return "it is not valid UTF-8"
    if not name:
        return "the empty string is not allowed"
    if len(name) > NAME_LENGTH_MAX:
        return f"it is longer than {NAME_LENGTH_MAX} characters"
    if not _NAME.match(name):
        return "it contains characters other than ASCII alphanumerics, '_' and '-'"
    if name.startswith(INTERNAL_NAME_PREFIX) and not internal_allowed:
        return f"the prefix '{INTERNAL_NAME_PREFIX}' is reserved for internal objects"
    return None


def validate_database_name(name: str) -> None:
    problem = _name_problem(name)
    if problem:
        raise InvalidDatabaseError(f"Database name {name!r} is invalid: {problem}.")


def validate_table_name(name: str) -> None:
    problem = _name_problem(name)
    if problem:
        raise InvalidTableError(f"Table name {name!r} is invalid: {problem}.")


def validate_producer_id(producer_id: str) -> None:
    """A producer id names a node in the metadata store: the rules of table names (as Fluss has them, so
    the ``__`` prefix is allowed)."""
    problem = _name_problem(producer_id, internal_allowed=True)
    if problem:
        raise InvalidProducerIdError(f"Invalid producer ID {producer_id!r}: {problem}.")


def partition_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be a partition value (None: it can)."""
    return _name_problem(value)


def validate_partition_value(key: str, value: str) -> None:
    problem = _name_problem(value)
    if problem:
        raise PartitionSpecInvalidError(f"Partition value {value!r} of {key!r} is invalid: {problem}.")


@dataclass(frozen=True)
class TableInfo:
    table_id: int
    path: TablePath
    schema_id: int
    table_json: bytes
    created_ms: int
    modified_ms: int
    versions: Mapping[int, bytes] = field(default_factory=dict, compare=False, repr=False)
    """The table's documents under its earlier schema ids (empty for a table whose columns never changed)."""

    @classmethod
    def from_record(cls, record: TableRecord, versions: Mapping[int, bytes] | None = None) -> TableInfo:
        return cls(
            record.table_id,
            TablePath(record.database, record.name),
            record.schema_id,
            bytes(record.table_json),
            record.created_ms,
            record.modified_ms,
            dict(versions or {}),
        )

    @cached_property
    def schemas(self) -> dict[int, Schema]:
        """Every schema rows of this table may carry, by schema id (the current one included)."""
        found = {schema_id: TableDescriptor.from_json(raw).schema for schema_id, raw in self.versions.items()}
        found[self.schema_id] = self.schema
        return found

    def schema_of(self, schema_id: int) -> Schema:
        """The schema with ``schema_id``. Raises SchemaNotExistError."""
        if schema_id == self.schema_id:
            return self.schema
        try:
            return self.schemas[schema_id]
        except KeyError:
            raise SchemaNotExistError(f"Schema {schema_id} of table '{self.path}' does not exist.") from None

    @cached_property
    def descriptor(self) -> TableDescriptor:
        return TableDescriptor.from_json(self.table_json)

    @property
    def schema(self) -> Schema:
        return self.descriptor.schema

    @property
    def bucket_count(self) -> int:
        count = self.descriptor.bucket_count
        assert count is not None and count > 0, "the coordinator always stores a bucket count"
        return count

    @property
    def has_primary_key(self) -> bool:
        return self.descriptor.has_primary_key

    @property
    def is_partitioned(self) -> bool:
        return self.descriptor.is_partitioned

    @property
    def partition_keys(self) -> list[str]:
        return list(self.descriptor.partition_keys)

    @property
    def properties(self) -> dict[str, str]:
        return dict(self.descriptor.properties)

    @property
    def options(self) -> TableProperties:
        """Typed reads of the table's options (``table.*`` properties), with Fluss's defaults."""
        return self.descriptor.options

    def buckets(self, partition_id: int | None = None) -> list[TableBucket]:
        return [TableBucket(self.table_id, bucket, partition_id) for bucket in range(self.bucket_count)]


def partition_name(spec: dict[str, str], partition_keys: list[str]) -> str:
    """Fluss's partition name: the values in partition-key order, joined with ``$``."""
    missing = [key for key in partition_keys if key not in spec]
    extra = [key for key in spec if key not in partition_keys]
    if missing or extra:
        raise PartitionSpecInvalidError(
            f"Partition spec {spec} must give exactly the partition keys {partition_keys} "
            f"(missing {missing}, unknown {extra})."
        )
    for key in partition_keys:
        validate_partition_value(key, spec[key])
    return PARTITION_NAME_SEPARATOR.join(spec[key] for key in partition_keys)
