"""Request fields the network fuzzer found handlers choking on, checked without a server."""

from __future__ import annotations

import pytest

from strom.errors import InvalidDatabaseError, InvalidTableError, PartitionSpecInvalidError
from strom.metadata.table_info import validate_database_name, validate_partition_value, validate_table_name
from strom.rpc.messages import pb


def _path_with_invalid_utf8() -> object:
    body = pb.PbTablePath(database_name="fluss", table_name="ab").SerializeToString().replace(b"ab", b"a\xff")
    return pb.PbTablePath.FromString(body)


def test_protobuf_hands_an_invalid_utf8_string_field_over_as_bytes() -> None:
    """The premise: proto2 strings are not validated, and Python's protobuf returns such a field as bytes."""
    assert _path_with_invalid_utf8().table_name == b"a\xff"  # type: ignore[attr-defined]


def test_a_name_that_is_not_valid_utf8_is_invalid_not_a_type_error() -> None:
    """CreateTable with such a name failed with TypeError (an unknown server error, logged with a
    traceback) instead of INVALID_TABLE_EXCEPTION."""
    name = _path_with_invalid_utf8().table_name  # type: ignore[attr-defined]
    with pytest.raises(InvalidTableError, match="not valid UTF-8"):
        validate_table_name(name)
    with pytest.raises(InvalidDatabaseError, match="not valid UTF-8"):
        validate_database_name(name)
    with pytest.raises(PartitionSpecInvalidError, match="not valid UTF-8"):
        validate_partition_value("p", name)
