"""The authorizer: whether a principal may do an operation on a resource, decided from the ACLs and the
super users, as Fluss's default authorizer decides.

An entry on a resource also covers what lies below it (an entry on a database covers its tables; one on
the cluster covers everything); ``ALL`` covers every operation; any of READ, WRITE, CREATE, DROP, ALTER
also grants DESCRIBE; a ``*`` resource name, principal name or host matches any. Nothing else is allowed.
Managing ACLs needs ``ALL`` on the resource (on a table's database, for a table), as in Fluss.

The ACLs live in the metadata store; this class keeps them in memory too, and writes through the store
before changing memory, so a failed write changes nothing. Not thread-safe: the server's event loop
alone calls it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Collection, Iterable

from strom.errors import AuthorizationError
from strom.metadata.off_loop import off_loop
from strom.metadata.store import AclRecord, AclStore
from strom.security.acl import (
    DESCRIBE_IMPLIED_BY,
    WILDCARD,
    AclBinding,
    AclFilter,
    OperationType,
    PermissionType,
    Principal,
    Resource,
    ResourceType,
)
from strom.security.internal import is_server


def parse_super_users(text: str | None) -> list[Principal]:
    """``User:admin;User:ops`` → principals (Fluss separates them with semicolons).

    Raises:
        ValueError: an entry is not ``TYPE:NAME``.
    """
    return [Principal.parse(entry) for entry in (text or "").split(";") if entry.strip()]


def is_super_user(principal: Principal, super_users: Collection[Principal]) -> bool:
    """Whether ``principal`` may do everything: one of ``super_users`` (``super.users``), or one of the
    cluster's own servers (their requests to each other)."""
    return is_server(principal) or any(super_user.matches(principal) for super_user in super_users)


def _to_record(binding: AclBinding) -> AclRecord:
    return AclRecord(
        int(binding.resource.type), binding.resource.name, binding.principal.type, binding.principal.name,
        binding.host, int(binding.operation), int(binding.permission),
    )


def _from_record(record: AclRecord) -> AclBinding:
    return AclBinding(
        Resource(ResourceType(record.resource_type), record.resource_name),
        Principal(record.principal_type, record.principal_name),
        record.host,
        OperationType(record.operation),
        PermissionType(record.permission),
    )


class Authorizer:
    """Decides requests and keeps the ACLs (``store`` is their durable copy)."""

    def __init__(self, store: AclStore, super_users: Collection[Principal]) -> None:
        self._store = store
        self._super_users = tuple(super_users)
        self._acls: dict[Resource, set[AclBinding]] = defaultdict(set)  # guarded by: the event loop
        self._changing = asyncio.Lock()
        """One change at a time: each decides on what the one before it stored."""
        for record in store.list_acls():
            binding = _from_record(record)
            self._acls[binding.resource].add(binding)

    def reload(self, records: list[AclRecord]) -> None:
        """Replace the entries with ``records`` (the store's, read by the caller): in a cluster every server
        keeps its own copy, and the coordinator is the one that changes them."""
        acls: dict[Resource, set[AclBinding]] = defaultdict(set)
        for record in records:
            binding = _from_record(record)
            acls[binding.resource].add(binding)
        self._acls = acls

    @property
    def store(self) -> AclStore:
        return self._store

    # ---- decisions ----
    def is_super_user(self, principal: Principal) -> bool:
        return is_super_user(principal, self._super_users)

    def is_authorized(self, principal: Principal, host: str, operation: OperationType, resource: Resource) -> bool:
        assert operation not in (OperationType.ANY,)
        if self.is_super_user(principal):
            return True
        for covering in resource.with_parents():
            for candidates in (self._acls.get(covering), self._acls.get(Resource(covering.type, WILDCARD))):
                for acl in candidates or ():
                    if self._grants(acl, principal, host, operation):
                        return True
        return False

    @staticmethod
    def _grants(acl: AclBinding, principal: Principal, host: str, operation: OperationType) -> bool:
        if acl.permission is not PermissionType.ALLOW:
            return False
        if not acl.principal.matches(principal):
            return False
        if acl.host != WILDCARD and acl.host != host:
            return False
        if acl.operation in (OperationType.ALL, operation):
            return True
        return operation is OperationType.DESCRIBE and acl.operation in DESCRIBE_IMPLIED_BY

    def authorize(self, principal: Principal, host: str, operation: OperationType, resource: Resource) -> None:
        """Raises AuthorizationError unless :meth:`is_authorized`."""
        if not self.is_authorized(principal, host, operation, resource):
            raise AuthorizationError(f"principal {principal} may not {operation.name} {resource}")

    # ---- ACL management ----
    @staticmethod
    def _managed_by(resource: Resource) -> Resource:
        """Whose ALL lets one manage ``resource``'s entries: a table's database, else the resource itself."""
        if resource.type is ResourceType.TABLE:
            return Resource.database(resource.name.split(".", 1)[0])
        return resource

    def _may_manage(self, principal: Principal, host: str, resource: Resource) -> bool:
        return self.is_authorized(principal, host, OperationType.ALL, self._managed_by(resource))

    def _authorize_acl_management(self, principal: Principal, host: str, resources: Iterable[Resource]) -> None:
        for resource in resources:
            self.authorize(principal, host, OperationType.ALL, self._managed_by(resource))

    async def add_acls(self, principal: Principal, host: str, bindings: Collection[AclBinding]) -> None:
        """Store ``bindings`` (valid ones: see :meth:`AclBinding.validate`).

        Raises:
            AuthorizationError: ``principal`` lacks ALL on one of the resources; nothing is added.
        """
        self._authorize_acl_management(principal, host, {binding.resource for binding in bindings})
        async with self._changing:
            new = [binding for binding in bindings if binding not in self._acls.get(binding.resource, ())]
            if not new:
                return
            await off_loop(self._store.add_acls, [_to_record(binding) for binding in new])
            self._show_added(new)

    def _show_added(self, new: Iterable[AclBinding]) -> None:
        for binding in new:
            self._acls[binding.resource].add(binding)

    async def drop_acls(
        self, principal: Principal, host: str, filters: Collection[AclFilter],
    ) -> list[list[AclBinding]]:
        """Remove every entry a filter matches; per filter, the entries it matched (sorted).

        The answer never depends on entries the caller may not manage, so it tells someone without the
        right nothing about the ACLs: a filter naming one resource needs ALL on it (on its database, for a
        table) whether or not entries exist; a filter that may match several resources drops (and reports)
        only the entries on resources the caller may manage, as listing shows only what it may describe.

        Raises:
            AuthorizationError: ``principal`` lacks ALL on a resource a filter names; nothing is removed.
        """
        for acl_filter in filters:
            if acl_filter.resource_type is not ResourceType.ANY and acl_filter.resource_name is not None:
                named = Resource(acl_filter.resource_type, acl_filter.resource_name)
                self._authorize_acl_management(principal, host, {named})
        async with self._changing:
            return await self._drop_acls(principal, host, filters)

    async def _drop_acls(self, principal: Principal, host: str, filters: Collection[AclFilter]) -> list[list[AclBinding]]:
        manageable = [binding for binding in self.bindings() if self._may_manage(principal, host, binding.resource)]
        matched = [sorted(binding for binding in manageable if acl_filter.matches(binding)) for acl_filter in filters]
        doomed = {binding for bindings in matched for binding in bindings}
        if doomed:
            await off_loop(self._store.delete_acls, [_to_record(binding) for binding in sorted(doomed)])
            for binding in doomed:
                entries = self._acls.get(binding.resource)
                if entries is not None:
                    entries.discard(binding)
                    if not entries:
                        del self._acls[binding.resource]
        return matched

    def list_acls(self, principal: Principal, host: str, acl_filter: AclFilter) -> list[AclBinding]:
        """The entries ``acl_filter`` matches on resources ``principal`` may DESCRIBE."""
        visible: list[AclBinding] = []
        for resource in sorted(self._acls):
            if not self.is_authorized(principal, host, OperationType.DESCRIBE, resource):
                continue
            visible.extend(binding for binding in sorted(self._acls[resource]) if acl_filter.matches(binding))
        return visible

    def bindings(self) -> list[AclBinding]:
        return sorted(binding for entries in self._acls.values() for binding in entries)
