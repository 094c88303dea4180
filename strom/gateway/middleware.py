"""The gateway's ASGI middleware: a request id on every answer, and the request body limit.

The limit is enforced before the body is read: a ``Content-Length`` above it is refused at once, and a body
without one (chunked) is counted as it streams in, the request failing as soon as the count passes it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from strom.gateway.errors import REQUEST_ID_HEADER


class BodyTooLargeError(HTTPException):
    """The request body passed the limit while streaming in (an HTTPException, so that FastAPI's own body
    parsing lets it through instead of answering 400)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than the limit of {limit} bytes (gateway.rest.write.max-request-bytes)")
        self.limit = limit

    def __str__(self) -> str:
        return self.detail


def _incoming_id(scope: Scope) -> str | None:
    """A client's own ``x-request-id`` when it is a UUID (so it can be correlated), else None."""
    for name, value in scope.get("headers", ()):
        if name == REQUEST_ID_HEADER.encode():
            try:
                return str(uuid.UUID(value.decode("latin-1")))
            except ValueError:
                return None
    return None


class GatewayMiddleware:
    """Sets ``scope["state"]["request_id"]``, adds ``x-request-id`` to every response, and limits bodies."""

    def __init__(self, app: ASGIApp, max_body_size: int) -> None:
        self.app = app
        self.max_body_size = max_body_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _incoming_id(scope) or str(uuid.uuid4())
        scope.setdefault("state", {})["request_id"] = rid
        header = (REQUEST_ID_HEADER.encode(), rid.encode())
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != header[0]]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        length = _content_length(scope)
        if length is not None and length > self.max_body_size:
            await _refuse(send_with_id, rid, BodyTooLargeError(self.max_body_size))
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_size:
                    raise BodyTooLargeError(self.max_body_size)
            return message

        try:
            await self.app(scope, counting_receive, send_with_id)
        except BodyTooLargeError as exc:
            if started:
                raise
            await _refuse(send_with_id, rid, exc)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Send, rid: str, exc: BodyTooLargeError) -> None:
    body: dict[str, Any] = {"error": {"code": "limit_exceeded", "message": str(exc), "request_id": rid}}
    payload = json.dumps(body).encode()
    await send({
        "type": "http.response.start",
        "status": 413,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close")],
    })
    await send({"type": "http.response.body", "body": payload})
