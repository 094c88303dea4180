"""Catalog routes: databases, tables, their schemas and partitions (strom's choice of routes; FIP-49 has not
fixed them yet). Every change made here drops what the gateway's table cache holds of the table."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from strom.client import Column, DatabaseDescriptor, Schema, Table, TableDescriptor
from strom.client.admin import Admin, PartitionInfo
from strom.errors import DatabaseNotExistError, PartitionNotExistError, TableNotExistError
from strom.gateway.state import gateway_state
from strom.gateway.values import parse_type
from strom.ids import TablePath
from strom.records.types import data_type_to_json, type_to_string

router = APIRouter(tags=["catalog"])

_ABSENT: dict[int | str, dict[str, Any]] = {204: {"description": "ignore_if_not_exists, and there is nothing to change"}}


# ---- request bodies ----

class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateDatabase(_Body):
    name: str = Field(min_length=1)
    ignore_if_exists: bool = False
    comment: str | None = None
    properties: dict[str, str] = Field(default_factory=dict, description="custom properties")


class AlterDatabase(_Body):
    set: dict[str, str] = Field(default_factory=dict, description="custom properties to set")
    reset: list[str] = Field(default_factory=list, description="custom properties to remove")
    comment: str | None = Field(default=None, description='the new comment ("" removes it)')
    ignore_if_not_exists: bool = False


class ColumnSpec(_Body):
    name: str = Field(min_length=1)
    type: str | dict[str, Any] = Field(description="a Fluss type name (INT, DECIMAL(10, 2), ...) or type object")
    comment: str | None = None


class CreateTable(_Body):
    name: str = Field(min_length=1)
    columns: list[ColumnSpec] = Field(min_length=1)
    primary_key: list[str] | None = None
    partition_keys: list[str] = Field(default_factory=list)
    bucket_keys: list[str] = Field(default_factory=list)
    bucket_count: int | None = Field(default=None, ge=1)
    properties: dict[str, str] = Field(default_factory=dict, description="table options (table.*)")
    custom_properties: dict[str, str] = Field(default_factory=dict)
    comment: str | None = None
    ignore_if_exists: bool = False


class AlterTable(_Body):
    set: dict[str, str] = Field(default_factory=dict, description="table options (table.*) and custom properties")
    reset: list[str] = Field(default_factory=list, description="options and custom properties to remove")
    add_columns: list[ColumnSpec] = Field(default_factory=list, description="nullable columns added at the end")
    ignore_if_not_exists: bool = False


class CreatePartition(_Body):
    spec: dict[str, str] = Field(description="partition column → value")
    ignore_if_exists: bool = False


# ---- databases ----

@router.get("/v1/databases")
async def list_databases(request: Request) -> dict[str, Any]:
    return {"databases": await (await gateway_state(request).connection_for(request)).get_admin().list_databases()}


@router.post("/v1/databases", status_code=201)
async def create_database(request: Request, body: CreateDatabase) -> dict[str, Any]:
    admin = (await gateway_state(request).connection_for(request)).get_admin()
    descriptor = DatabaseDescriptor(body.comment, body.properties)
    await admin.create_database(body.name, descriptor, ignore_if_exists=body.ignore_if_exists)
    return await _database(admin, body.name)


@router.get("/v1/databases/{db}")
async def get_database(request: Request, db: str) -> dict[str, Any]:
    return await _database((await gateway_state(request).connection_for(request)).get_admin(), db)


@router.patch("/v1/databases/{db}", response_model=None, responses=_ABSENT)
async def alter_database(request: Request, db: str, body: AlterDatabase) -> dict[str, Any] | Response:
    if not (body.set or body.reset or body.comment is not None):
        raise ValueError("nothing to change: give set, reset or comment")
    admin = (await gateway_state(request).connection_for(request)).get_admin()
    await admin.alter_database(db, body.set, body.reset, body.comment, ignore_if_not_exists=body.ignore_if_not_exists)
    try:
        return await _database(admin, db)
    except DatabaseNotExistError:
        if body.ignore_if_not_exists:
            return Response(status_code=204)
        raise


@router.delete("/v1/databases/{db}", status_code=204)
async def drop_database(
    request: Request, db: str, cascade: bool = Query(False), ignore_if_not_exists: bool = Query(False)
) -> Response:
    state = gateway_state(request)
    admin = (await state.connection_for(request)).get_admin()
    try:
        await admin.drop_database(db, ignore_if_not_exists=ignore_if_not_exists, cascade=cascade)
    finally:
        state.tables.invalidate(database=db)
    return Response(status_code=204)


# ---- tables ----

@router.get("/v1/databases/{db}/tables")
async def list_tables(request: Request, db: str) -> dict[str, Any]:
    return {"tables": await (await gateway_state(request).connection_for(request)).get_admin().list_tables(db)}


@router.post("/v1/databases/{db}/tables", status_code=201)
async def create_table(request: Request, db: str, body: CreateTable) -> dict[str, Any]:
    descriptor = _descriptor(body)
    state = gateway_state(request)
    conn = await state.connection_for(request)
    path = TablePath(db, body.name)
    await conn.get_admin().create_table(path, descriptor, ignore_if_exists=body.ignore_if_exists)
    return _table_info(state.tables.observe(conn, await conn.get_table(path)).table)


@router.get("/v1/databases/{db}/tables/{name}")
async def get_table(request: Request, db: str, name: str) -> dict[str, Any]:
    state = gateway_state(request)
    conn = await state.connection_for(request)
    return _table_info(state.tables.observe(conn, await conn.get_table(TablePath(db, name))).table)


@router.patch("/v1/databases/{db}/tables/{name}", response_model=None, responses=_ABSENT)
async def alter_table(request: Request, db: str, name: str, body: AlterTable) -> dict[str, Any] | Response:
    if not (body.set or body.reset or body.add_columns):
        raise ValueError("nothing to change: give set, reset or add_columns")
    columns = tuple(Column(c.name, parse_type(c.type), c.comment) for c in body.add_columns)
    state = gateway_state(request)
    conn = await state.connection_for(request)
    path = TablePath(db, name)
    try:
        await conn.get_admin().alter_table(
            path, body.set, body.reset, ignore_if_not_exists=body.ignore_if_not_exists, add_columns=columns
        )
    finally:
        state.tables.invalidate(path)
    try:
        return _table_info(state.tables.observe(conn, await conn.get_table(path)).table)
    except TableNotExistError:
        if body.ignore_if_not_exists:
            return Response(status_code=204)
        raise


@router.delete("/v1/databases/{db}/tables/{name}", status_code=204)
async def drop_table(request: Request, db: str, name: str, ignore_if_not_exists: bool = Query(False)) -> Response:
    state = gateway_state(request)
    admin = (await state.connection_for(request)).get_admin()
    try:
        await admin.drop_table(TablePath(db, name), ignore_if_not_exists=ignore_if_not_exists)
    finally:
        state.tables.invalidate(TablePath(db, name))
    return Response(status_code=204)


# ---- schemas ----

@router.get("/v1/databases/{db}/tables/{name}/schema")
async def get_current_schema(request: Request, db: str, name: str) -> dict[str, Any]:
    info = (await (await gateway_state(request).connection_for(request)).get_table(TablePath(db, name))).table_info
    return _schema(info.schema_id, info.schema)


@router.get("/v1/databases/{db}/tables/{name}/schemas/{schema_id}")
async def get_schema(request: Request, db: str, name: str, schema_id: int) -> dict[str, Any]:
    admin = (await gateway_state(request).connection_for(request)).get_admin()
    return _schema(schema_id, Schema.from_json(await admin.get_table_schema_json(TablePath(db, name), schema_id)))


# ---- partitions ----

@router.get("/v1/databases/{db}/tables/{name}/partitions")
async def list_partitions(request: Request, db: str, name: str) -> dict[str, Any]:
    admin = (await gateway_state(request).connection_for(request)).get_admin()
    return {"partitions": [_partition(info) for info in await admin.list_partition_infos(TablePath(db, name))]}


@router.post("/v1/databases/{db}/tables/{name}/partitions", status_code=201)
async def create_partition(request: Request, db: str, name: str, body: CreatePartition) -> dict[str, Any]:
    admin = (await gateway_state(request).connection_for(request)).get_admin()
    await admin.create_partition(TablePath(db, name), body.spec, ignore_if_exists=body.ignore_if_exists)
    return {"spec": body.spec}


@router.get("/v1/databases/{db}/tables/{name}/partitions/{partition}")
async def get_partition(request: Request, db: str, name: str, partition: str) -> dict[str, Any]:
    state = gateway_state(request)
    spec = _partition_spec(await state.table_for(request, db, name), partition)
    admin = (await state.connection_for(request)).get_admin()
    for info in await admin.list_partition_infos(TablePath(db, name), spec):
        if info.partition_name == partition:
            return _partition(info)
    raise PartitionNotExistError(f"table {db}.{name} has no partition {partition!r}")


@router.delete("/v1/databases/{db}/tables/{name}/partitions/{partition}", status_code=204)
async def drop_partition(
    request: Request, db: str, name: str, partition: str, ignore_if_not_exists: bool = Query(False)
) -> Response:
    state = gateway_state(request)
    found = await state.table_for(request, db, name)
    spec = _partition_spec(found, partition)
    admin = (await state.connection_for(request)).get_admin()
    await admin.drop_partition(found.table_path, spec, ignore_if_not_exists=ignore_if_not_exists)
    return Response(status_code=204)


# ---- answers ----

def _descriptor(body: CreateTable) -> TableDescriptor:
    columns = tuple(Column(c.name, parse_type(c.type), c.comment) for c in body.columns)
    schema = Schema(columns, None if body.primary_key is None else tuple(body.primary_key))
    return TableDescriptor(
        schema, tuple(body.partition_keys), tuple(body.bucket_keys), body.bucket_count, body.properties,
        body.custom_properties, body.comment,
    )


def _partition_spec(found: Table, partition: str) -> dict[str, str]:
    """The spec of a partition name (Fluss's: the values joined by ``$``)."""
    keys = found.layout.partition_keys
    if not keys:
        raise ValueError(f"table {found.table_path} is not partitioned")
    values = partition.split("$")
    if len(values) != len(keys):
        raise ValueError(f"partition {partition!r} must name one value per partition key {keys}, joined by '$'")
    return dict(zip(keys, values, strict=True))


async def _database(admin: Admin, name: str) -> dict[str, Any]:
    info = await admin.get_database_info(name)
    return {
        "name": name,
        "comment": info.descriptor.comment,
        "properties": dict(info.descriptor.custom_properties),
        "created_ms": info.created_time,
        "modified_ms": info.modified_time,
    }


def _columns(schema: Schema) -> list[dict[str, Any]]:
    return [
        {"name": c.name, "type": type_to_string(c.data_type), "data_type": data_type_to_json(c.data_type),
         **({"comment": c.comment} if c.comment is not None else {})}
        for c in schema.columns
    ]


def _schema(schema_id: int, schema: Schema) -> dict[str, Any]:
    return {
        "schema_id": schema_id,
        "columns": _columns(schema),
        "primary_key": None if schema.primary_key is None else list(schema.primary_key),
    }


def _table_info(found: Table) -> dict[str, Any]:
    info = found.layout.info
    descriptor = info.descriptor
    return {
        "database": info.path.database_name,
        "name": info.path.table_name,
        "table_id": info.table_id,
        "schema_id": info.schema_id,
        "columns": _columns(descriptor.schema),
        "primary_key": None if descriptor.schema.primary_key is None else list(descriptor.schema.primary_key),
        "partition_keys": list(descriptor.partition_keys),
        "bucket_keys": list(descriptor.bucket_keys),
        "bucket_count": descriptor.bucket_count,
        "properties": dict(descriptor.properties),
        "custom_properties": dict(descriptor.custom_properties),
        "comment": descriptor.comment,
        "created_ms": info.created_ms,
        "modified_ms": info.modified_ms,
    }


def _partition(info: PartitionInfo) -> dict[str, Any]:
    return {"id": info.partition_id, "name": info.partition_name, "spec": dict(info.spec)}
