"""ACL administration (``admin.create_acls`` …): the Admin methods for CreateAcls, ListAcls and DropAcls.

The server must run with ``authorizer.enabled``; otherwise each call raises SecurityDisabledError.
"""

from __future__ import annotations

from collections.abc import Sequence

from strom.client.rpc_client import ClusterRpc
from strom.errors import error_for_code
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.security.acl import AclBinding, AclFilter, binding_from_pb, binding_to_pb, filter_to_pb


class AclAdmin:
    """Mixed into :class:`strom.client.admin.Admin`."""

    _connection: ClusterRpc

    async def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        """Add ACL entries (an entry already present is kept once).

        Raises:
            AuthorizationError: the caller lacks ALL on a resource (on a table's database, for a table).
            SecurityDisabledError: the server does not authorize requests.
            StromError: the first entry the server refused, with its code.
        """
        request = pb.CreateAclsRequest()
        for binding in bindings:
            binding_to_pb(binding, request.acl.add())
        response = await self._connection.coordinator_request(ApiKey.CREATE_ACLS, request)
        for result in response.aclRes:
            if result.HasField("error_code") and result.error_code != 0:
                raise error_for_code(result.error_code, result.error_message or None)

    async def list_acls(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        """The entries ``acl_filter`` matches (all by default) on resources the caller may DESCRIBE."""
        request = pb.ListAclsRequest()
        filter_to_pb(acl_filter or AclFilter(), request.acl_filter)
        response = await self._connection.coordinator_request(ApiKey.LIST_ACLS, request)
        return [binding_from_pb(info) for info in response.acl]

    async def drop_acls(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        """Remove the entries each filter matches; per filter, the entries it removed.

        Raises:
            AuthorizationError: the caller lacks ALL on a resource with matching entries; nothing is removed.
        """
        request = pb.DropAclsRequest()
        for acl_filter in filters:
            filter_to_pb(acl_filter, request.acl_filter.add())
        response = await self._connection.coordinator_request(ApiKey.DROP_ACLS, request)
        removed: list[list[AclBinding]] = []
        for result in response.filter_results:
            if result.HasField("error_code") and result.error_code != 0:
                raise error_for_code(result.error_code, result.error_message or None)
            removed.append([binding_from_pb(match.acl) for match in result.matching_acls])
        return removed
