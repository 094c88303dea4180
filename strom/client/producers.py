"""Producer offsets from the client: what an exactly-once writer registers before it writes.

The RPCs are Fluss's (RegisterProducerOffsets 1053, GetProducerOffsets 1054, DeleteProducerOffsets 1055);
see ``strom/coordinator/producer_offsets.py`` for what the coordinator does with them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from strom.client.rpc_client import ClusterRpc
from strom.ids import TableBucket
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import add_producer_offsets, pb, read_producer_offsets


class RegisterResult(enum.IntEnum):
    """Fluss's codes: a new registration, or unexpired offsets kept as they were."""

    CREATED = 0
    ALREADY_EXISTS = 1


@dataclass(frozen=True, slots=True)
class ProducerOffsets:
    producer_id: str
    expiration_time_ms: int
    offsets: dict[TableBucket, int]
    """Each bucket's log end offset when the producer registered."""


class ProducerOffsetsAdmin:
    """The producer-offsets part of :class:`~strom.client.admin.Admin`."""

    _connection: ClusterRpc

    async def register_producer_offsets(
        self, producer_id: str, offsets: Mapping[TableBucket, int], ttl_ms: int | None = None
    ) -> RegisterResult:
        """Store ``offsets`` under ``producer_id`` unless it has unexpired ones (then nothing changes).

        Raises InvalidProducerIdError (63) for an id that is not a valid name, InvalidConfigError for a
        negative TTL, AuthorizationError without WRITE on every table named."""
        request = pb.RegisterProducerOffsetsRequest(producer_id=producer_id)
        add_producer_offsets(request.table_offsets, offsets)
        if ttl_ms is not None:
            request.ttl_ms = ttl_ms
        response = await self._connection.coordinator_request(ApiKey.REGISTER_PRODUCER_OFFSETS, request)
        return RegisterResult(response.result)

    async def get_producer_offsets(self, producer_id: str) -> ProducerOffsets | None:
        """The producer's unexpired offsets (only of tables the caller may READ), None if it has none."""
        request = pb.GetProducerOffsetsRequest(producer_id=producer_id)
        response = await self._connection.coordinator_request(ApiKey.GET_PRODUCER_OFFSETS, request)
        if not response.HasField("producer_id"):
            return None
        return ProducerOffsets(response.producer_id, response.expiration_time,
                               read_producer_offsets(response.table_offsets))

    async def delete_producer_offsets(self, producer_id: str) -> None:
        """Delete the producer's offsets (nothing happens if it has none)."""
        request = pb.DeleteProducerOffsetsRequest(producer_id=producer_id)
        await self._connection.coordinator_request(ApiKey.DELETE_PRODUCER_OFFSETS, request)


__all__ = ["ProducerOffsets", "ProducerOffsetsAdmin", "RegisterResult"]
