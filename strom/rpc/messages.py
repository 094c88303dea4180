"""The protobuf message classes, generated from ``proto/*.proto`` at install time: Fluss's (``pb``) and
strom's extensions (``ext``)."""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf.message import DecodeError, Message

try:
    from strom.rpc.proto import fluss_api_pb2 as _fluss_api
    from strom.rpc.proto import strom_ext_pb2 as _strom_ext
except ImportError as exc:  # pragma: no cover - only when the package was copied without building
    raise ImportError(
        "strom's protocol module is not built: run `make install` (or `pip install -e .`), which compiles "
        "strom/rpc/proto/fluss_api.proto"
    ) from exc

from strom.rpc.api_keys import ApiKey, message_names

# Generated modules have no type stubs: their message classes are attributes created at import.
pb: Any = _fluss_api
ext: Any = _strom_ext

__all__ = ["DecodeError", "Message", "ext", "pb", "request_class", "response_class"]


def _message_class(name: str) -> type[Message] | None:
    cls: Any = getattr(pb, name, None)
    if cls is None:
        cls = getattr(ext, name, None)
    return cls


@functools.cache
def request_class(key: ApiKey) -> type[Message] | None:
    """The request message of ``key``, or None when strom's proto does not define it (not served)."""
    return _message_class(message_names(key)[0])


@functools.cache
def response_class(key: ApiKey) -> type[Message] | None:
    return _message_class(message_names(key)[1])
