"""Requests behind their authorization rules, with the catalog and the coordinator's records naming the
tables each request touches: one wiring for ``strom server`` and for every process of a cluster."""

from __future__ import annotations

from collections.abc import Mapping

from strom.coordinator.catalog import CatalogReader
from strom.coordinator.role import CoordinatorRole
from strom.rpc.api_keys import ApiKey
from strom.rpc.server import Handler
from strom.security.access import no_producer_tables
from strom.security.server_security import ServerSecurity


def guard_with_catalog(
    security: ServerSecurity, handlers: Mapping[ApiKey, Handler], catalog: CatalogReader,
    role: CoordinatorRole | None = None,
) -> dict[ApiKey, Handler]:
    """``handlers`` behind ``security``'s checks; ``role``: the coordinator's (where this process is the
    active coordinator), whose leases and producer offsets name the tables their requests touch."""
    return security.guard(
        handlers,
        lambda table_id: table.path if (table := catalog.table_info_by_id(table_id)) else None,
        (lambda lease_id, principal: role.leases.own_table_ids(lease_id, str(principal))) if role is not None
        else (lambda _lease_id, _principal: ()),
        lambda partition_id: p.table_id if (p := catalog.partition_by_id(partition_id)) else None,
        role.producer_offsets.stored_table_ids if role is not None else no_producer_tables,
    )


__all__ = ["guard_with_catalog"]
