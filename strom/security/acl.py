"""ACLs as Fluss models them: who (a principal such as ``User:alice``) may do what (an operation) on which
resource (the cluster, a database, a table), from which host.

The numeric codes of the enums are part of the wire protocol (``PbAclInfo``/``PbAclFilter``); they are
Fluss's and never change. Only ``ALLOW`` exists: Fluss has no deny entries, and neither does strom.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from strom.errors import UnknownServerError
from strom.rpc.auth import WILDCARD, Principal


class ResourceType(IntEnum):
    ANY = 1  # filters only
    CLUSTER = 2
    DATABASE = 3
    TABLE = 4


class OperationType(IntEnum):
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DROP = 6
    ALTER = 7
    DESCRIBE = 8


class PermissionType(IntEnum):
    ANY = 1  # filters only
    ALLOW = 2


class InvalidAclError(UnknownServerError):
    """An ACL entry or filter that cannot be used (an unknown code, a filter-only value in an entry, a
    malformed name). Fluss has no dedicated code and answers these with -1 too; fix the entry and retry."""

    default_message = "The ACL is invalid."


CLUSTER_RESOURCE_NAME = "fluss-cluster"
"""As a resource name: every resource of its type; as a principal name: every principal; as a host: any."""

DESCRIBE_IMPLIED_BY = frozenset(
    {OperationType.DESCRIBE, OperationType.READ, OperationType.WRITE, OperationType.CREATE, OperationType.DROP,
     OperationType.ALTER}
)
"""An entry for any of these operations also grants DESCRIBE (whoever may read a table may see it)."""


def _enum_by_name(enum: type[IntEnum], text: str) -> Any:
    try:
        return enum[text.strip().upper()]
    except KeyError:
        names = ", ".join(member.name for member in enum)
        raise ValueError(f"unknown {enum.__name__} {text!r}; one of {names}") from None


def _enum_by_code(enum: type[IntEnum], code: int) -> Any:
    try:
        return enum(code)
    except ValueError:
        raise ValueError(f"unknown {enum.__name__} code {code}") from None


def parse_resource_type(text: str) -> ResourceType:
    return _enum_by_name(ResourceType, text)  # type: ignore[no-any-return]


def parse_operation(text: str) -> OperationType:
    return _enum_by_name(OperationType, text)  # type: ignore[no-any-return]


def parse_permission(text: str) -> PermissionType:
    return _enum_by_name(PermissionType, text)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, order=True)
class Resource:
    type: ResourceType
    name: str

    @classmethod
    def cluster(cls) -> Resource:
        return cls(ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME)

    @classmethod
    def database(cls, name: str) -> Resource:
        return cls(ResourceType.DATABASE, name)

    @classmethod
    def table(cls, database: str, name: str) -> Resource:
        return cls(ResourceType.TABLE, f"{database}.{name}")

    def with_parents(self) -> tuple[Resource, ...]:
        """This resource and those whose entries also cover it: a table's database, and the cluster."""
        if self.type is ResourceType.TABLE:
            database = self.name.split(".", 1)[0]
            return (self, Resource.database(database), Resource.cluster())
        if self.type is ResourceType.DATABASE:
            return (self, Resource.cluster())
        return (self,)

    def __str__(self) -> str:
        return f"{self.type.name}:{self.name}"


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One ACL entry: ``principal`` may do ``operation`` on ``resource`` from ``host``."""

    resource: Resource
    principal: Principal
    host: str
    operation: OperationType
    permission: PermissionType = PermissionType.ALLOW

    def validate(self) -> None:
        """Raises ValueError when the entry cannot be stored (a filter-only value, a malformed name)."""
        if self.resource.type is ResourceType.ANY:
            raise ValueError("an ACL needs a resource type (CLUSTER, DATABASE or TABLE), not ANY")
        if self.operation is OperationType.ANY:
            raise ValueError("an ACL needs an operation, not ANY")
        if self.permission is not PermissionType.ALLOW:
            raise ValueError("an ACL's permission must be ALLOW")
        if not self.resource.name:
            raise ValueError("an ACL needs a resource name")
        if self.resource.type is ResourceType.CLUSTER and self.resource.name != CLUSTER_RESOURCE_NAME:
            raise ValueError(f"the cluster resource is named {CLUSTER_RESOURCE_NAME!r}, got {self.resource.name!r}")
        if self.resource.type is ResourceType.TABLE and self.resource.name != WILDCARD:
            database, sep, table = self.resource.name.partition(".")
            if not sep or not database or not table:
                raise ValueError(f"a table resource is named DATABASE.TABLE, got {self.resource.name!r}")
        if not self.host:
            raise ValueError("an ACL needs a host ('*' for any)")

    def __str__(self) -> str:
        return (f"{self.principal} {self.permission.name} {self.operation.name} on {self.resource} "
                f"from {self.host}")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Selects ACL entries (list, drop): ``None`` and the ``ANY`` members match everything."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    principal: Principal | None = None
    host: str | None = None
    operation: OperationType = OperationType.ANY
    permission: PermissionType = PermissionType.ANY

    def matches(self, binding: AclBinding) -> bool:
        return (
            self.resource_type in (ResourceType.ANY, binding.resource.type)
            and (self.resource_name is None or self.resource_name == binding.resource.name)
            and (self.principal is None or self.principal == binding.principal)
            and (self.host is None or self.host == binding.host)
            and self.operation in (OperationType.ANY, binding.operation)
            and self.permission in (PermissionType.ANY, binding.permission)
        )


# ---- wire form (PbAclInfo / PbAclFilter) ----
def binding_from_pb(info: Any) -> AclBinding:
    """Raises ValueError on an unknown code."""
    return AclBinding(
        Resource(_enum_by_code(ResourceType, info.resource_type), info.resource_name),
        Principal(info.principal_type, info.principal_name),
        info.host,
        _enum_by_code(OperationType, info.operation_type),
        _enum_by_code(PermissionType, info.permission_type),
    )


def binding_to_pb(binding: AclBinding, target: Any) -> Any:
    """Fill a ``PbAclInfo`` (``target``) from ``binding``; returns ``target``."""
    target.resource_type = int(binding.resource.type)
    target.resource_name = binding.resource.name
    target.principal_type = binding.principal.type
    target.principal_name = binding.principal.name
    target.host = binding.host
    target.operation_type = int(binding.operation)
    target.permission_type = int(binding.permission)
    return target


def filter_from_pb(message: Any) -> AclFilter:
    """Raises ValueError on an unknown code or a principal given by half."""
    principal = None
    has_name, has_type = message.HasField("principal_name"), message.HasField("principal_type")
    if has_name != has_type:
        raise ValueError("an ACL filter names a principal by both its type and its name, or neither")
    if has_name:
        principal = Principal(message.principal_type, message.principal_name)
    return AclFilter(
        _enum_by_code(ResourceType, message.resource_type),
        message.resource_name if message.HasField("resource_name") else None,
        principal,
        message.host if message.HasField("host") else None,
        _enum_by_code(OperationType, message.operation_type),
        _enum_by_code(PermissionType, message.permission_type),
    )


def filter_to_pb(acl_filter: AclFilter, target: Any) -> Any:
    target.resource_type = int(acl_filter.resource_type)
    if acl_filter.resource_name is not None:
        target.resource_name = acl_filter.resource_name
    if acl_filter.principal is not None:
        target.principal_type = acl_filter.principal.type
        target.principal_name = acl_filter.principal.name
    if acl_filter.host is not None:
        target.host = acl_filter.host
    target.operation_type = int(acl_filter.operation)
    target.permission_type = int(acl_filter.permission)
    return target
