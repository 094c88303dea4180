"""The REST error envelope (FIP-49): ``{"error": {"code", "message", "request_id"}}`` plus ``x-request-id``.

Every failure the gateway answers goes through :func:`envelope`; :func:`classify` is the one place that
maps a strom error (what the cluster answered) to an HTTP status and a stable snake_case code.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from pydantic import BaseModel
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse

from strom import errors
from strom.gateway.values import ValueConversionError
from strom.records.types import MetadataJsonError

REQUEST_ID_HEADER = "x-request-id"

ERROR_CODES = (
    "already_exists", "backend", "cancelled", "cluster_already_exists", "cluster_not_found",
    "database_already_exists", "database_not_empty", "database_not_found", "failed_precondition", "internal",
    "invalid_argument", "limit_exceeded", "method_not_allowed", "not_acceptable", "not_found",
    "partition_already_exists", "partition_not_found", "resource_exhausted", "table_already_exists",
    "table_not_found", "timeout", "unauthenticated", "unauthorized", "unavailable", "unsupported",
    "unsupported_media_type",
)
"""FIP-49's ErrorCode values (fluss-gateway's openapi.yaml); strom answers a subset of them, and
``schema_not_found`` (FIP-49 has no schema routes yet)."""


class LimitExceededError(ValueError):
    """A request asks for more than the gateway answers at once (keys, records); 400 ``limit_exceeded``."""


_BY_STATUS = {
    400: "invalid_argument", 401: "unauthenticated", 403: "unauthorized", 404: "not_found",
    405: "method_not_allowed", 406: "not_acceptable", 409: "already_exists", 413: "limit_exceeded",
    415: "unsupported_media_type", 422: "invalid_argument", 429: "resource_exhausted", 501: "unsupported",
    503: "unavailable", 504: "timeout",
}

# first match wins: subclasses before their bases
_STROM_ERRORS: tuple[tuple[type[BaseException], int, str], ...] = (
    (errors.DatabaseNotExistError, 404, "database_not_found"),
    (errors.DatabaseAlreadyExistError, 409, "database_already_exists"),
    (errors.DatabaseNotEmptyError, 409, "database_not_empty"),
    (errors.TableNotExistError, 404, "table_not_found"),
    (errors.TableAlreadyExistError, 409, "table_already_exists"),
    (errors.PartitionNotExistError, 404, "partition_not_found"),
    (errors.PartitionAlreadyExistsError, 409, "partition_already_exists"),
    (errors.SchemaNotExistError, 404, "schema_not_found"),
    (errors.AuthenticationError, 401, "unauthenticated"),
    (errors.AuthorizationError, 403, "unauthorized"),
    (errors.RequestTimeoutError, 504, "timeout"),
    (errors.RecordTooLargeError, 413, "limit_exceeded"),
    (errors.PartitionMaxNumError, 400, "limit_exceeded"),
    (errors.BucketMaxNumError, 400, "limit_exceeded"),
    (errors.UnsupportedVersionError, 501, "unsupported"),
    (errors.UnsupportedMergeOperationError, 400, "unsupported"),
    (errors.SecurityDisabledError, 400, "unsupported"),
    (errors.RetriableError, 503, "unavailable"),
    (errors.InvalidConfigError, 400, "invalid_argument"),
    (errors.InvalidTableError, 400, "invalid_argument"),
    (errors.InvalidDatabaseError, 400, "invalid_argument"),
    (errors.InvalidReplicationFactorError, 400, "invalid_argument"),
    (errors.InvalidAlterTableError, 400, "invalid_argument"),
    (errors.InvalidTargetColumnError, 400, "invalid_argument"),
    (errors.PartitionSpecInvalidError, 400, "invalid_argument"),
    (errors.TableNotPartitionedError, 400, "invalid_argument"),
    (errors.NonPrimaryKeyTableError, 400, "invalid_argument"),
    (errors.DeletionDisabledError, 400, "failed_precondition"),
    (errors.LogOffsetOutOfRangeError, 400, "invalid_argument"),
    (errors.StromError, 502, "backend"),
    (TimeoutError, 504, "timeout"),  # a log read whose range the cluster stopped serving
    (LimitExceededError, 400, "limit_exceeded"),
    (ValueConversionError, 400, "invalid_argument"),
    (MetadataJsonError, 400, "invalid_argument"),
    (ValueError, 400, "invalid_argument"),
)


class ErrorBody(BaseModel):
    code: str
    message: str
    request_id: str


class ErrorEnvelope(BaseModel):
    """The body of every error answer."""

    error: ErrorBody


def classify(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and error code of an exception (500 ``internal`` for what nothing maps)."""
    for kind, status, code in _STROM_ERRORS:
        if isinstance(exc, kind):
            return status, code
    return 500, "internal"


def code_for_status(status: int) -> str:
    return _BY_STATUS.get(status, "internal" if status >= 500 else "invalid_argument")


def request_id(connection: HTTPConnection | Mapping[str, object]) -> str:
    """The request's id, set by the gateway's middleware (a fresh one where it did not run)."""
    scope = connection.scope if isinstance(connection, HTTPConnection) else connection
    state = scope.get("state")
    if isinstance(state, dict) and isinstance(state.get("request_id"), str):
        return state["request_id"]
    return str(uuid.uuid4())


def envelope(
    rid: str, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "request_id": rid}},
        status_code=status,
        headers={**(headers or {}), REQUEST_ID_HEADER: rid},
    )
