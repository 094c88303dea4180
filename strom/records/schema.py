"""Table schemas and descriptors, and the JSON Fluss stores for them.

``TableDescriptor.to_json()`` is the ``table_json`` of CreateTable/GetTableInfo/Metadata,
``Schema.to_json_bytes()`` the ``schema_json`` of GetTableSchema, and
``DatabaseDescriptor.to_json()`` the ``database_json``. Parsing is tolerant of keys it does
not know and strict about the ones Fluss requires; the normalisation (primary-key columns
made NOT NULL, default bucket keys, field-id assignment) follows Java's Schema and
TableDescriptor so what we hand back is what a Fluss server would.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from strom.records.types import (
    FIELD_ID_UNASSIGNED,
    ArrayType,
    BigIntType,
    DataField,
    DataType,
    IntType,
    MapType,
    MetadataJsonError,
    RowType,
    data_type_from_json,
    data_type_to_json,
    from_arrow_field,
    to_arrow_schema,
)
from strom.table_properties import TableProperties

JSON_VERSION = 1
_AUTO_INCREMENT_ROOTS = (IntType.type_root, BigIntType.type_root)


def _load(raw: Mapping[str, Any] | str | bytes, what: str) -> Mapping[str, Any]:
    if isinstance(raw, Mapping):
        return raw
    if not isinstance(raw, (str, bytes, bytearray)):
        raise MetadataJsonError(f"{what} must be a JSON object, got {raw!r}")
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MetadataJsonError(f"{what} is not valid JSON: {e}") from e
    if not isinstance(obj, Mapping):
        raise MetadataJsonError(f"{what} must be a JSON object, got {type(obj).__name__}")
    return obj


def _dump(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _required(obj: Mapping[str, Any], key: str, what: str) -> Any:
    if key not in obj:
        raise MetadataJsonError(f"{what}: missing required key {key!r}")
    return obj[key]


def _string_list(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MetadataJsonError(f"{what} must be an array of strings, got {value!r}")
    return tuple(value)


def _string_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise MetadataJsonError(f"{what} must be an object, got {value!r}")
    # Java reads each value with asText(), so scalars are accepted and stringified.
    result = {}
    for key, item in value.items():
        if isinstance(item, (dict, list)) or item is None:
            raise MetadataJsonError(f"{what}[{key!r}] must be a string, got {item!r}")
        result[key] = item if isinstance(item, str) else json.dumps(item)
    return result


# ---------------------------------------------------------------------------------------
# Field ids
# ---------------------------------------------------------------------------------------


def _nested_field_ids(t: DataType) -> list[int]:
    if isinstance(t, RowType):
        ids = []
        for f in t.fields:
            ids.append(f.field_id)
            ids.extend(_nested_field_ids(f.type))
        return ids
    if isinstance(t, ArrayType):
        return _nested_field_ids(t.element)
    if isinstance(t, MapType):
        return _nested_field_ids(t.key) + _nested_field_ids(t.value)
    return []


def _reassign_field_ids(t: DataType, next_id: list[int]) -> DataType:
    """Depth-first id assignment for nested ROW fields (Java ReassignFieldId)."""
    if isinstance(t, RowType):
        fields = []
        for f in t.fields:
            next_id[0] += 1
            field_id = next_id[0]
            fields.append(DataField(f.name, _reassign_field_ids(f.type, next_id), f.description, field_id))
        return RowType(tuple(fields), nullable=t.nullable)
    if isinstance(t, ArrayType):
        return ArrayType(_reassign_field_ids(t.element, next_id), nullable=t.nullable)
    if isinstance(t, MapType):
        key = _reassign_field_ids(t.key, next_id)
        return MapType(key, _reassign_field_ids(t.value, next_id), nullable=t.nullable)
    return t


# ---------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    """One table column; ``agg_function`` is kept as the opaque JSON object Fluss stores."""

    name: str
    data_type: DataType
    comment: str | None = None
    column_id: int = FIELD_ID_UNASSIGNED
    agg_function: Mapping[str, Any] | None = field(default=None, hash=False)

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"name": self.name, "data_type": data_type_to_json(self.data_type)}
        if self.comment is not None:
            obj["comment"] = self.comment
        if self.agg_function is not None:
            obj["agg_function"] = dict(self.agg_function)
        obj["id"] = self.column_id
        return obj

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Column:
        if not isinstance(obj, Mapping):
            raise MetadataJsonError(f"column must be a JSON object, got {obj!r}")
        name = _required(obj, "name", "column")
        if not isinstance(name, str):
            raise MetadataJsonError(f"column: 'name' must be a string, got {name!r}")
        data_type = data_type_from_json(_required(obj, "data_type", f"column {name!r}"))
        column_id = obj.get("id", FIELD_ID_UNASSIGNED)
        if isinstance(column_id, bool) or not isinstance(column_id, int):
            raise MetadataJsonError(f"column {name!r}: id must be an integer, got {column_id!r}")
        return cls(name, data_type, obj.get("comment"), column_id, obj.get("agg_function"))


@dataclass(frozen=True, slots=True)
class Schema:
    """Columns, primary key and field ids of a table.

    Construction normalises like Java's ``Schema``: primary-key columns become NOT NULL,
    ids are assigned depth-first when no column has one, and ``highest_field_id`` defaults
    to the largest id in use.

    Raises:
        ValueError: duplicate names or ids, unknown key columns, or mixed id assignment.
    """

    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] | None = None
    highest_field_id: int = FIELD_ID_UNASSIGNED
    auto_increment_columns: tuple[str, ...] = ()
    _row_type: RowType = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        columns = tuple(self.columns)
        names = [c.name for c in columns]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate column names {duplicates}")
        columns = self._assign_ids(columns)
        primary_key = None if self.primary_key is None else tuple(self.primary_key)
        if primary_key is not None:
            if not primary_key or len(set(primary_key)) != len(primary_key):
                raise ValueError(f"primary key must be non-empty and distinct, got {list(primary_key)}")
            missing = [k for k in primary_key if k not in names]
            if missing:
                raise ValueError(f"primary key columns {missing} are not in the schema {names}")
            columns = tuple(
                Column(c.name, c.data_type.copy(False), c.comment, c.column_id, c.agg_function)
                if c.name in primary_key and c.data_type.nullable
                else c
                for c in columns
            )
        auto_increment = tuple(self.auto_increment_columns)
        if len(auto_increment) > 1:
            raise ValueError(f"multiple auto-increment columns {list(auto_increment)} are not supported; a table has at most one")
        for name in auto_increment:
            if primary_key is None or name not in names or name in primary_key:
                raise ValueError(f"auto-increment column {name!r} must be a non-key column of a PK table")
            if columns[names.index(name)].data_type.type_root not in _AUTO_INCREMENT_ROOTS:
                raise ValueError(f"auto-increment column {name!r} must be INT or BIGINT")
        all_ids = [i for c in columns for i in [c.column_id, *_nested_field_ids(c.data_type)]]
        if len(set(all_ids)) != len(all_ids):
            raise ValueError(f"field ids must be unique, got {all_ids}")
        highest = self.highest_field_id
        if highest == FIELD_ID_UNASSIGNED:
            highest = max(all_ids, default=FIELD_ID_UNASSIGNED)
        if all_ids and highest < max(all_ids):
            raise ValueError(f"highest_field_id {highest} is below the largest field id {max(all_ids)}")
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "primary_key", primary_key)
        object.__setattr__(self, "highest_field_id", highest)
        object.__setattr__(self, "auto_increment_columns", auto_increment)
        row_type = RowType(tuple(DataField(c.name, c.data_type, c.comment, c.column_id) for c in columns))
        object.__setattr__(self, "_row_type", row_type)

    @staticmethod
    def _assign_ids(columns: tuple[Column, ...]) -> tuple[Column, ...]:
        with_id = sum(1 for c in columns if c.column_id != FIELD_ID_UNASSIGNED)
        if with_id == len(columns):
            return columns
        if with_id:
            raise ValueError("either every column has an id or none has")
        next_id = [FIELD_ID_UNASSIGNED]
        assigned = []
        for c in columns:
            next_id[0] += 1
            column_id = next_id[0]
            data_type = _reassign_field_ids(c.data_type, next_id)
            assigned.append(Column(c.name, data_type, c.comment, column_id, c.agg_function))
        return tuple(assigned)

    @classmethod
    def of(
        cls,
        columns: Iterable[tuple[str, DataType]],
        primary_key: Sequence[str] | None = None,
        auto_increment_column: str | None = None,
    ) -> Schema:
        """Build from ``(name, type)`` pairs, assigning ids as a Fluss client does; ``auto_increment_column``
        names the column the server fills with unique ids (a non-key INT or BIGINT of a primary-key table)."""
        return cls(
            tuple(Column(name, t) for name, t in columns),
            None if primary_key is None else tuple(primary_key),
            auto_increment_columns=() if auto_increment_column is None else (auto_increment_column,),
        )

    @classmethod
    def from_arrow(cls, arrow_schema: pa.Schema, primary_key: Sequence[str] | None = None) -> Schema:
        """Build from an Arrow schema (e.g. a DataFrame's), mapping each Arrow type to its Fluss type."""
        return cls.of(((f.name, from_arrow_field(f)) for f in arrow_schema), primary_key)

    @property
    def row_type(self) -> RowType:
        return self._row_type

    @property
    def arrow_schema(self) -> pa.Schema:
        return to_arrow_schema(self._row_type)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def has_primary_key(self) -> bool:
        return self.primary_key is not None

    @property
    def primary_key_indexes(self) -> tuple[int, ...]:
        names = self.column_names
        return tuple(names.index(k) for k in self.primary_key or ())

    def column_indexes(self, names: Iterable[str]) -> tuple[int, ...]:
        index_by_name = {c.name: i for i, c in enumerate(self.columns)}
        try:
            return tuple(index_by_name[n] for n in names)
        except KeyError as e:
            raise ValueError(f"column {e.args[0]!r} is not in the schema {self.column_names}") from None

    def with_columns_appended(self, added: Iterable[Column]) -> Schema:
        """This schema with ``added`` at the end under fresh ids (each column's, then its nested fields'
        depth-first), continuing from ``highest_field_id`` so no id is ever reused (ALTER TABLE ADD COLUMN)."""
        next_id = [self.highest_field_id]
        columns = list(self.columns)
        for column in added:
            next_id[0] += 1
            column_id = next_id[0]
            data_type = _reassign_field_ids(column.data_type, next_id)
            columns.append(Column(column.name, data_type, column.comment, column_id, column.agg_function))
        return Schema(tuple(columns), self.primary_key, next_id[0], self.auto_increment_columns)

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"version": JSON_VERSION, "columns": [c.to_json() for c in self.columns]}
        if self.primary_key is not None:
            obj["primary_key"] = list(self.primary_key)
        if self.auto_increment_columns:
            obj["auto_increment_column"] = list(self.auto_increment_columns)
        obj["highest_field_id"] = self.highest_field_id
        return obj

    def to_json_bytes(self) -> bytes:
        return _dump(self.to_json())

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | str | bytes) -> Schema:
        """Raises: ValueError: not a valid Fluss schema object."""
        obj = _load(raw, "schema")
        columns = _required(obj, "columns", "schema")
        if not isinstance(columns, list):
            raise MetadataJsonError(f"schema: 'columns' must be an array, got {columns!r}")
        primary_key = obj.get("primary_key")
        highest = obj.get("highest_field_id", FIELD_ID_UNASSIGNED)
        if isinstance(highest, bool) or not isinstance(highest, int):
            raise MetadataJsonError(f"schema: 'highest_field_id' must be an integer, got {highest!r}")
        return cls(
            tuple(Column.from_json(c) for c in columns),
            None if primary_key is None else _string_list(primary_key, "schema 'primary_key'"),
            highest,
            _string_list(obj.get("auto_increment_column", []), "schema 'auto_increment_column'"),
        )


# ---------------------------------------------------------------------------------------
# Table and database descriptors
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableDescriptor:
    """Everything CreateTable sends: schema, partitioning, distribution, properties.

    Bucket keys are normalised as Java does: a primary-key table without them gets its
    physical primary key. ``bucket_count`` may be None in a request; the server must fill
    it in (``with_bucket_count``) before handing the JSON back, or pyfluss panics.

    Raises:
        ValueError: partition or bucket keys inconsistent with the schema.
    """

    schema: Schema
    partition_keys: tuple[str, ...] = ()
    bucket_keys: tuple[str, ...] = ()
    bucket_count: int | None = None
    properties: Mapping[str, str] = field(default_factory=dict, hash=False)
    custom_properties: Mapping[str, str] = field(default_factory=dict, hash=False)
    comment: str | None = None

    def __post_init__(self) -> None:
        partition_keys = tuple(self.partition_keys)
        bucket_keys = tuple(self.bucket_keys)
        names = self.schema.column_names
        primary_key = self.schema.primary_key
        for key in partition_keys:
            if primary_key is not None and key not in primary_key:
                raise ValueError(f"partition key {key!r} must be part of the primary key {list(primary_key)}")
            if key not in names:
                raise ValueError(f"partition key {key!r} is not in the schema {names}")
        overlap = [k for k in bucket_keys if k in partition_keys]
        if overlap:
            raise ValueError(f"bucket keys {overlap} must not include partition keys")
        if primary_key is not None:
            if not bucket_keys:
                bucket_keys = tuple(k for k in primary_key if k not in partition_keys)
                if not bucket_keys:
                    raise ValueError("the primary key must not consist of partition keys only")
            elif not set(bucket_keys) <= set(primary_key):
                raise ValueError(f"bucket keys {list(bucket_keys)} must be a subset of the primary key")
        for key in bucket_keys:
            if key not in names:
                raise ValueError(f"bucket key {key!r} is not in the schema {names}")
        if self.bucket_count is not None and self.bucket_count <= 0:
            raise ValueError(f"bucket_count must be positive, got {self.bucket_count}")
        object.__setattr__(self, "partition_keys", partition_keys)
        object.__setattr__(self, "bucket_keys", bucket_keys)
        object.__setattr__(self, "properties", dict(self.properties))
        object.__setattr__(self, "custom_properties", dict(self.custom_properties))

    @property
    def has_primary_key(self) -> bool:
        return self.schema.has_primary_key

    @property
    def is_partitioned(self) -> bool:
        return bool(self.partition_keys)

    @property
    def physical_primary_key(self) -> tuple[str, ...]:
        """The primary key without partition columns: the columns key bytes are built from."""
        return tuple(k for k in self.schema.primary_key or () if k not in self.partition_keys)

    @property
    def options(self) -> TableProperties:
        """Typed reads of the table options among the properties, with Fluss's defaults."""
        return TableProperties(self.properties)

    @property
    def kv_format(self) -> str:
        return self.options.kv_format

    def with_bucket_count(self, bucket_count: int) -> TableDescriptor:
        return TableDescriptor(
            self.schema,
            self.partition_keys,
            self.bucket_keys,
            bucket_count,
            self.properties,
            self.custom_properties,
            self.comment,
        )

    def to_json(self) -> bytes:
        """The ``table_json`` bytes, keys in Java's order."""
        obj: dict[str, Any] = {"version": JSON_VERSION, "schema": self.schema.to_json()}
        if self.comment is not None:
            obj["comment"] = self.comment
        obj["partition_key"] = list(self.partition_keys)
        if self.bucket_keys or self.bucket_count is not None:
            obj["bucket_key"] = list(self.bucket_keys)
            if self.bucket_count is not None:
                obj["bucket_count"] = self.bucket_count
        obj["properties"] = dict(self.properties)
        obj["custom_properties"] = dict(self.custom_properties)
        return _dump(obj)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | str | bytes) -> TableDescriptor:
        """Raises: ValueError: not a valid Fluss table descriptor."""
        obj = _load(raw, "table descriptor")
        schema = Schema.from_json(_required(obj, "schema", "table descriptor"))
        partition_keys = _string_list(_required(obj, "partition_key", "table descriptor"), "'partition_key'")
        bucket_keys = _string_list(obj.get("bucket_key", []), "'bucket_key'")
        bucket_count = obj.get("bucket_count")
        if bucket_count is not None and (isinstance(bucket_count, bool) or not isinstance(bucket_count, int)):
            raise MetadataJsonError(f"'bucket_count' must be an integer, got {bucket_count!r}")
        comment = obj.get("comment")
        if comment is not None and not isinstance(comment, str):
            raise MetadataJsonError(f"'comment' must be a string, got {comment!r}")
        return cls(
            schema,
            partition_keys,
            bucket_keys,
            bucket_count,
            _string_map(_required(obj, "properties", "table descriptor"), "'properties'"),
            _string_map(_required(obj, "custom_properties", "table descriptor"), "'custom_properties'"),
            comment,
        )


@dataclass(frozen=True, slots=True)
class DatabaseDescriptor:
    """A database's comment and custom properties (``database_json``)."""

    comment: str | None = None
    custom_properties: Mapping[str, str] = field(default_factory=dict, hash=False)

    def to_json(self) -> bytes:
        obj: dict[str, Any] = {"version": JSON_VERSION}
        if self.comment is not None:
            obj["comment"] = self.comment
        obj["custom_properties"] = dict(self.custom_properties)
        return _dump(obj)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | str | bytes) -> DatabaseDescriptor:
        """Missing ``custom_properties`` reads as empty: clients may send a bare object."""
        obj = _load(raw, "database descriptor")
        comment = obj.get("comment")
        if comment is not None and not isinstance(comment, str):
            raise MetadataJsonError(f"'comment' must be a string, got {comment!r}")
        return cls(comment, _string_map(obj.get("custom_properties", {}), "'custom_properties'"))
