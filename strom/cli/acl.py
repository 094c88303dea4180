"""``strom acl add|list|remove``: manage the ACLs of a server that runs with ``authorizer.enabled``.

The caller authenticates like any client: ``--username``/``--password`` (or ``STROM_SASL_USERNAME`` /
``STROM_SASL_PASSWORD``) for a SASL listener, and needs ALL on the resources it changes (a super user may
change anything).
"""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table as RichTable

from strom.cli.common import bootstrap_option, client_config, credential_options, json_option, run_on_server
from strom.security.acl import (
    CLUSTER_RESOURCE_NAME,
    AclBinding,
    AclFilter,
    OperationType,
    PermissionType,
    Principal,
    Resource,
    ResourceType,
    parse_operation,
    parse_resource_type,
)

_RESOURCE_TYPES = [t.name for t in ResourceType if t is not ResourceType.ANY]
_OPERATIONS = [o.name for o in OperationType if o is not OperationType.ANY]


def _resource(resource_type: str, name: str | None) -> Resource:
    kind = parse_resource_type(resource_type)
    if kind is ResourceType.CLUSTER:
        return Resource.cluster()
    if not name:
        raise click.BadParameter(f"--resource-name is needed for a {kind.name} resource")
    return Resource(kind, name)


def _binding_json(binding: AclBinding) -> dict[str, str]:
    return {
        "principal": str(binding.principal),
        "resource_type": binding.resource.type.name,
        "resource_name": binding.resource.name,
        "operation": binding.operation.name,
        "permission": binding.permission.name,
        "host": binding.host,
    }


def _print_bindings(title: str, bindings: list[AclBinding], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([_binding_json(b) for b in bindings], indent=2))
        return
    table = RichTable(title=title)
    for column in ("principal", "resource type", "resource name", "operation", "permission", "host"):
        table.add_column(column)
    for binding in bindings:
        row = _binding_json(binding)
        table.add_row(row["principal"], row["resource_type"], row["resource_name"], row["operation"],
                      row["permission"], row["host"])
    Console().print(table)


def _filter(principal: str | None, resource_type: str | None, resource_name: str | None, operation: str | None,
            host: str | None) -> AclFilter:
    try:
        kind = parse_resource_type(resource_type) if resource_type else ResourceType.ANY
        name = resource_name
        if kind is ResourceType.CLUSTER and name is None:
            name = CLUSTER_RESOURCE_NAME
        return AclFilter(
            resource_type=kind,
            resource_name=name,
            principal=Principal.parse(principal) if principal else None,
            host=host,
            operation=parse_operation(operation) if operation else OperationType.ANY,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


resource_type_option = click.option(
    "--resource-type", "-t", type=click.Choice(_RESOURCE_TYPES, case_sensitive=False),
    help="CLUSTER, DATABASE or TABLE.",
)
resource_name_option = click.option(
    "--resource-name", "-r", default=None, help="Database name, or DATABASE.TABLE for a table ('*' for any)."
)


@click.group()
def acl() -> None:
    """ACLs of a server with authorizer.enabled: who may do what on which resource."""


@acl.command("add")
@click.option("--principal", "-p", required=True, help="Whom to allow, e.g. User:alice ('User:*' for everyone).")
@click.option("--operation", "-o", "operations", required=True, multiple=True,
              type=click.Choice(_OPERATIONS, case_sensitive=False), help="Operation to allow (repeatable).")
@click.option("--resource-type", "-t", required=True, type=click.Choice(_RESOURCE_TYPES, case_sensitive=False),
              help="CLUSTER, DATABASE or TABLE.")
@resource_name_option
@click.option("--host", default="*", show_default=True, help="Client host the entry applies to.")
@bootstrap_option
@credential_options
def acl_add(principal: str, operations: tuple[str, ...], resource_type: str, resource_name: str | None, host: str,
            bootstrap_servers: str, username: str | None, password: str | None) -> None:
    """Allow PRINCIPAL the operations on a resource."""
    try:
        who = Principal.parse(principal)
        resource = _resource(resource_type, resource_name)
        bindings = [AclBinding(resource, who, host, parse_operation(op), PermissionType.ALLOW) for op in operations]
        for binding in bindings:
            binding.validate()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    run_on_server(client_config(bootstrap_servers, username, password),
                  lambda c: c.get_admin().create_acls(bindings))
    for binding in bindings:
        click.echo(f"added: {binding}")


@acl.command("list")
@click.option("--principal", "-p", default=None, help="Only entries of this principal, e.g. User:alice.")
@resource_type_option
@resource_name_option
@click.option("--operation", "-o", default=None, type=click.Choice(_OPERATIONS, case_sensitive=False))
@bootstrap_option
@credential_options
@json_option
def acl_list(principal: str | None, resource_type: str | None, resource_name: str | None, operation: str | None,
             bootstrap_servers: str, username: str | None, password: str | None, as_json: bool) -> None:
    """The entries on resources you may describe (all by default)."""
    acl_filter = _filter(principal, resource_type, resource_name, operation, None)
    bindings = run_on_server(client_config(bootstrap_servers, username, password),
                             lambda c: c.get_admin().list_acls(acl_filter))
    _print_bindings(f"{len(bindings)} ACL(s)", bindings, as_json)


@acl.command("remove")
@click.option("--principal", "-p", default=None, help="Only entries of this principal.")
@resource_type_option
@resource_name_option
@click.option("--operation", "-o", default=None, type=click.Choice(_OPERATIONS, case_sensitive=False))
@click.option("--host", default=None, help="Only entries for this host.")
@bootstrap_option
@credential_options
@json_option
def acl_remove(principal: str | None, resource_type: str | None, resource_name: str | None, operation: str | None,
               host: str | None, bootstrap_servers: str, username: str | None, password: str | None,
               as_json: bool) -> None:
    """Remove the entries matching every option given (at least one is required)."""
    if not any((principal, resource_type, resource_name, operation, host)):
        raise click.BadParameter("give at least one of --principal, --resource-type, --resource-name, --operation, --host")
    acl_filter = _filter(principal, resource_type, resource_name, operation, host)
    removed = run_on_server(client_config(bootstrap_servers, username, password),
                            lambda c: c.get_admin().drop_acls([acl_filter]))
    _print_bindings(f"removed {len(removed[0])} ACL(s)", removed[0], as_json)
