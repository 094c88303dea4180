"""The table options that choose how a primary-key table merges writes, read and checked once.

Keys and rules are Fluss's (``ConfigOptions``, ``TableDescriptorValidation``): ``table.merge-engine``
(first_row | versioned | aggregation, any case), ``table.merge-engine.versioned.ver-column``,
``table.delete.behavior`` (allow | ignore | disable) whose default depends on the engine, and each
column's aggregate function, which Fluss keeps in the schema (``agg_function`` of a column) and SQL users
write as ``fields.<column>.agg`` with ``fields.<column>.<function>.<parameter>`` options. Every check
raises the InvalidConfigError (39) Fluss raises, with Fluss's message.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from strom.errors import InvalidConfigError, InvalidTableError
from strom.kv.merge import aggregators
from strom.records.schema import Schema
from strom.table_properties import (
    CHANGELOG_IMAGE,
    DELETE_BEHAVIOR,
    MERGE_ENGINE,
    VERSION_COLUMN,
    TableProperties,
)

FIELD_OPTION_PREFIX = "fields."
FIELD_FUNCTION_SUFFIX = ".agg"
VERSION_TYPE_ROOTS = ("INTEGER", "BIGINT", "TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE")


class MergeEngine(enum.Enum):
    FIRST_ROW = "first_row"
    VERSIONED = "versioned"
    AGGREGATION = "aggregation"


class DeleteBehavior(enum.Enum):
    ALLOW = "allow"
    IGNORE = "ignore"
    DISABLE = "disable"


@dataclass(frozen=True, slots=True)
class AggFunction:
    """A column's aggregate function: its normalized name and parameters (e.g. a listagg delimiter)."""

    name: str
    parameters: Mapping[str, str]

    def to_json(self) -> dict[str, Any]:
        """Fluss's ``agg_function`` object of a column."""
        obj: dict[str, Any] = {"type": self.name}
        if self.parameters:
            obj["parameters"] = dict(self.parameters)
        return obj


@dataclass(frozen=True, slots=True)
class MergeOptions:
    """What a table's buckets need to merge writes; built from validated options only."""

    engine: MergeEngine | None
    delete_behavior: DeleteBehavior
    version_column_index: int | None = None
    functions: tuple[AggFunction, ...] = ()
    """One per column (primary-key columns: last_value), for the aggregation engine."""


def _enum_option(enum_class: type[enum.Enum], properties: Mapping[str, str], key: str) -> Any:
    raw = properties.get(key)
    if raw is None:
        return None
    for member in enum_class:
        if member.value == raw.strip().lower():
            return member
    expected = ", ".join(m.name for m in enum_class)
    raise InvalidConfigError(
        f"Invalid value for config '{key}'. Reason: Could not parse value '{raw}' for key '{key}'. "
        f"Expected one of: [{expected}]"
    )


def merge_engine(properties: Mapping[str, str]) -> MergeEngine | None:
    engine: MergeEngine | None = _enum_option(MergeEngine, properties, MERGE_ENGINE)
    return engine


def delete_behavior(properties: Mapping[str, str]) -> DeleteBehavior:
    """The table's delete behaviour: the option if set, else ALLOW for the default engine and IGNORE for
    the others (Fluss's defaults)."""
    behavior: DeleteBehavior | None = _enum_option(DeleteBehavior, properties, DELETE_BEHAVIOR)
    if behavior is not None:
        return behavior
    return DeleteBehavior.ALLOW if merge_engine(properties) is None else DeleteBehavior.IGNORE


def column_function(column_agg: Mapping[str, Any] | None) -> AggFunction | None:
    """A column's ``agg_function`` JSON as an AggFunction; InvalidConfigError for an unknown function
    (Fluss's JSON reader would drop it silently; a table must not quietly lose its aggregation)."""
    if column_agg is None:
        return None
    raw_name = column_agg.get("type")
    name = aggregators.normalize_name(raw_name) if isinstance(raw_name, str) else ""
    if name not in aggregators.FUNCTIONS:
        raise InvalidConfigError(_unknown_function_message(raw_name))
    parameters = column_agg.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise InvalidConfigError(f"The parameters of aggregation function '{name}' must be a JSON object.")
    return AggFunction(name, {str(k): str(v) for k, v in parameters.items()})


def _unknown_function_message(name: object, column: str | None = None) -> str:
    supported = ", ".join(sorted(aggregators.FUNCTIONS))
    where = f" for column '{column}'" if column is not None else ""
    return f"Unknown aggregation function{where}: {name}\nSupported functions: {supported}"


def fold_field_options(document: MutableMapping[str, Any]) -> None:
    """Turn SQL-style ``fields.<column>.agg`` options of a table document (in its properties or custom
    properties) into the columns' ``agg_function``, where Fluss keeps them; the options leave the table
    properties (which hold ``table.*`` options only) and stay in the custom properties.

    Raises InvalidConfigError for an unknown column or function, or a function the column already has
    a different one of.
    """
    properties: MutableMapping[str, str] = document.get("properties") or {}
    custom: Mapping[str, str] = document.get("custom_properties") or {}
    options = {**custom, **properties}
    columns = document["schema"]["columns"]
    by_name = {column["name"]: column for column in columns}
    for key, value in options.items():
        if not (key.startswith(FIELD_OPTION_PREFIX) and key.endswith(FIELD_FUNCTION_SUFFIX)):
            continue
        column_name = key[len(FIELD_OPTION_PREFIX) : -len(FIELD_FUNCTION_SUFFIX)]
        if column_name not in by_name:
            raise InvalidConfigError(f"'{key}' names no column of the table (columns: {list(by_name)}).")
        name = aggregators.normalize_name(value)
        if name not in aggregators.FUNCTIONS:
            raise InvalidConfigError(_unknown_function_message(value, column_name))
        parameter_prefix = f"{FIELD_OPTION_PREFIX}{column_name}.{name}."
        parameters = {k[len(parameter_prefix) :]: v for k, v in options.items() if k.startswith(parameter_prefix)}
        function = AggFunction(name, parameters).to_json()
        existing = by_name[column_name].get("agg_function")
        if existing is not None and column_function(existing) != column_function(function):
            raise InvalidConfigError(
                f"Column '{column_name}' has aggregation function {existing} in its schema but '{key}' = '{value}'."
            )
        by_name[column_name]["agg_function"] = function
    for key in [k for k in properties if k.startswith(FIELD_OPTION_PREFIX)]:
        del properties[key]


def validate(schema: Schema, properties: Mapping[str, str]) -> MergeOptions:
    """Check the merge options of a table being created (Fluss's checkMergeEngine and
    checkDeleteBehavior) and return them; InvalidConfigError or InvalidTableError with Fluss's message."""
    engine = merge_engine(properties)
    explicit_behavior: DeleteBehavior | None = _enum_option(DeleteBehavior, properties, DELETE_BEHAVIOR)
    functions = [column_function(column.agg_function) for column in schema.columns]
    key_names = set(schema.primary_key or ())
    for column, function in zip(schema.columns, functions, strict=True):
        if function is not None and column.name in key_names:
            raise InvalidTableError(
                f"Cannot set aggregation function for primary key column '{column.name}'. "
                "Primary key columns automatically use 'primary-key' aggregation."
            )
    if engine is not MergeEngine.AGGREGATION:
        for column, function in zip(schema.columns, functions, strict=True):
            if function is not None:
                raise InvalidConfigError(
                    "Aggregation function is only supported for aggregation merge engine table, "
                    f"but column '{column.name}' has aggregation function '{function.name}'."
                )
    if engine is not None and not schema.has_primary_key:
        raise InvalidConfigError("Merge engine is only supported in primary key table.")
    if explicit_behavior is not None and not schema.has_primary_key:
        raise InvalidConfigError(f"The '{DELETE_BEHAVIOR}' configuration is only supported for primary key tables.")
    if engine in (MergeEngine.FIRST_ROW, MergeEngine.VERSIONED) and explicit_behavior is DeleteBehavior.ALLOW:
        raise InvalidConfigError(
            f"Table with '{engine.name}' merge engine does not support delete operations. "
            f"The '{DELETE_BEHAVIOR}' config must be set to 'ignore' or 'disable', but got 'allow'."
        )
    version_index = _version_column(schema, properties) if engine is MergeEngine.VERSIONED else None
    resolved: tuple[AggFunction, ...] = ()
    if engine is MergeEngine.AGGREGATION:
        if TableProperties(properties).changelog_image == "WAL":
            raise InvalidConfigError(
                "Table with 'AGGREGATION' merge engine does not support 'WAL' changelog image mode. "
                "Aggregation merge engine tables require FULL changelog image mode for correct UNDO recovery. "
                f"Please set '{CHANGELOG_IMAGE}' to 'FULL' or remove the setting."
            )
        resolved = tuple(_resolve_functions(schema, functions))
    return MergeOptions(engine, delete_behavior(properties), version_index, resolved)


def _version_column(schema: Schema, properties: Mapping[str, str]) -> int:
    name = properties.get(VERSION_COLUMN)
    if name is None:
        raise InvalidConfigError(f"'{VERSION_COLUMN}' must be set for versioned merge engine.")
    names = schema.column_names
    if name not in names:
        raise InvalidConfigError(f"The version column '{name}' for versioned merge engine doesn't exist in schema.")
    column_type = schema.columns[names.index(name)].data_type
    if column_type.type_root not in VERSION_TYPE_ROOTS:
        raise InvalidConfigError(
            f"The version column '{name}' for versioned merge engine must be one type of "
            f"[INT, BIGINT, TIMESTAMP, TIMESTAMP_LTZ], but got {column_type}."
        )
    return names.index(name)


def _resolve_functions(schema: Schema, functions: list[AggFunction | None]) -> list[AggFunction]:
    """Every column's function, defaults filled in and each checked against its column's type."""
    key_names = set(schema.primary_key or ())
    resolved = []
    for column, function in zip(schema.columns, functions, strict=True):
        if column.name in key_names:
            resolved.append(AggFunction(aggregators.KEY_FUNCTION, {}))
            continue
        if function is None:
            function = AggFunction(aggregators.DEFAULT_FUNCTION, {})
        try:
            aggregators.check_function(function.name, column.data_type, function.parameters)
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"Invalid aggregation function for column '{column.name}': {exc}") from None
        resolved.append(function)
    return resolved
