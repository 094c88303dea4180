"""The ACL requests (CreateAcls 1039, ListAcls 1040, DropAcls 1041), answered from the authorizer.

Without ``authorizer.enabled`` there is no authorizer and each of them fails with SecurityDisabledException
(code 47), as in Fluss. A malformed entry fails alone (its own error code in the response); a principal
without ALL on a resource it names fails the whole request with AuthorizationException (code 48).
"""

from __future__ import annotations

from typing import Any

from strom.errors import SecurityDisabledError
from strom.rpc.messages import pb
from strom.rpc.server import RequestContext
from strom.security.access import caller_of
from strom.security.acl import (
    AclBinding,
    InvalidAclError,
    binding_from_pb,
    binding_to_pb,
    filter_from_pb,
)
from strom.security.authorizer import Authorizer


class AclService:
    def __init__(self, authorizer: Authorizer | None) -> None:
        self._authorizer = authorizer

    def _require(self) -> Authorizer:
        if self._authorizer is None:
            raise SecurityDisabledError("no authorizer is configured: set authorizer.enabled=true")
        return self._authorizer

    async def create_acls(self, request: Any, context: RequestContext) -> Any:
        authorizer = self._require()
        caller = caller_of(context)
        parsed: list[AclBinding | InvalidAclError] = []
        for info in request.acl:
            try:
                binding = binding_from_pb(info)
                binding.validate()
                parsed.append(binding)
            except ValueError as exc:
                parsed.append(InvalidAclError(str(exc)))
        await authorizer.add_acls(caller.principal, caller.host, [b for b in parsed if isinstance(b, AclBinding)])
        response = pb.CreateAclsResponse()
        for info, outcome in zip(request.acl, parsed, strict=True):
            entry = response.aclRes.add()
            entry.acl.CopyFrom(info)
            if isinstance(outcome, InvalidAclError):
                entry.error_code = outcome.code
                entry.error_message = str(outcome)
        return response

    def list_acls(self, request: Any, context: RequestContext) -> Any:
        authorizer = self._require()
        caller = caller_of(context)
        try:
            acl_filter = filter_from_pb(request.acl_filter)
        except ValueError as exc:
            raise InvalidAclError(str(exc)) from None
        response = pb.ListAclsResponse()
        for binding in authorizer.list_acls(caller.principal, caller.host, acl_filter):
            binding_to_pb(binding, response.acl.add())
        return response

    async def drop_acls(self, request: Any, context: RequestContext) -> Any:
        authorizer = self._require()
        caller = caller_of(context)
        try:
            filters = [filter_from_pb(message) for message in request.acl_filter]
        except ValueError as exc:
            raise InvalidAclError(str(exc)) from None
        response = pb.DropAclsResponse()
        for matched in await authorizer.drop_acls(caller.principal, caller.host, filters):
            result = response.filter_results.add()
            for binding in matched:
                binding_to_pb(binding, result.matching_acls.add().acl)
        return response
