"""The authorizer over a real SQLite store: Fluss's matching rules, super users, ACL management rights,
and ACLs surviving a reopen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.errors import AuthorizationError
from strom.metadata.sqlite_store import SqliteMetadataStore
from strom.security.acl import (
    AclBinding,
    AclFilter,
    OperationType,
    Principal,
    Resource,
    ResourceType,
)
from strom.security.authorizer import Authorizer, parse_super_users

ADMIN = Principal("User", "admin")
ALICE = Principal("User", "alice")
BOB = Principal("User", "bob")
ANY_HOST = "*"
ORDERS = Resource.table("shop", "orders")
READ, WRITE, DESCRIBE = OperationType.READ, OperationType.WRITE, OperationType.DESCRIBE


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    yield store
    store.close()


@pytest.fixture
def authorizer(store: SqliteMetadataStore) -> Authorizer:
    return Authorizer(store, parse_super_users("User:admin"))


async def grant(authorizer: Authorizer, principal: Principal, operation: OperationType, resource: Resource,
                host: str = ANY_HOST) -> None:
    await authorizer.add_acls(ADMIN, "127.0.0.1", [AclBinding(resource, principal, host, operation)])


def test_nothing_is_allowed_without_an_acl_except_to_super_users(authorizer: Authorizer) -> None:
    assert not authorizer.is_authorized(ALICE, "10.0.0.1", READ, ORDERS)
    assert authorizer.is_authorized(ADMIN, "10.0.0.1", OperationType.DROP, Resource.cluster())
    with pytest.raises(AuthorizationError, match="User:alice"):
        authorizer.authorize(ALICE, "10.0.0.1", READ, ORDERS)


@pytest.mark.asyncio
async def test_an_acl_on_a_database_or_the_cluster_covers_its_tables(authorizer: Authorizer) -> None:
    await grant(authorizer, ALICE, READ, Resource.database("shop"))
    await grant(authorizer, BOB, WRITE, Resource.cluster())
    assert authorizer.is_authorized(ALICE, "h", READ, ORDERS)
    assert not authorizer.is_authorized(ALICE, "h", READ, Resource.table("other", "orders"))
    assert not authorizer.is_authorized(ALICE, "h", WRITE, ORDERS)
    assert authorizer.is_authorized(BOB, "h", WRITE, Resource.table("any", "table"))


@pytest.mark.asyncio
async def test_all_covers_every_operation_and_others_imply_describe(authorizer: Authorizer) -> None:
    await grant(authorizer, ALICE, OperationType.ALL, ORDERS)
    await grant(authorizer, BOB, WRITE, ORDERS)
    for operation in (READ, WRITE, OperationType.ALTER, OperationType.DROP, DESCRIBE):
        assert authorizer.is_authorized(ALICE, "h", operation, ORDERS)
    assert authorizer.is_authorized(BOB, "h", DESCRIBE, ORDERS)
    assert not authorizer.is_authorized(BOB, "h", READ, ORDERS)


@pytest.mark.asyncio
async def test_wildcards_match_any_principal_resource_name_or_host(authorizer: Authorizer) -> None:
    await grant(authorizer, Principal("User", "*"), DESCRIBE, Resource(ResourceType.TABLE, "*"))
    await grant(authorizer, ALICE, READ, ORDERS, host="10.0.0.1")
    assert authorizer.is_authorized(BOB, "h", DESCRIBE, Resource.table("x", "y"))
    assert authorizer.is_authorized(ALICE, "10.0.0.1", READ, ORDERS)
    assert not authorizer.is_authorized(ALICE, "10.0.0.2", READ, ORDERS)


@pytest.mark.asyncio
async def test_managing_acls_needs_all_on_the_resource_or_a_tables_database(authorizer: Authorizer) -> None:
    entry = AclBinding(ORDERS, BOB, ANY_HOST, READ)
    with pytest.raises(AuthorizationError):
        await authorizer.add_acls(ALICE, "h", [entry])
    await grant(authorizer, ALICE, OperationType.ALL, Resource.database("shop"))
    await authorizer.add_acls(ALICE, "h", [entry])
    assert authorizer.is_authorized(BOB, "h", READ, ORDERS)
    # Bob may manage nothing: his filter drops nothing and says so, as it would with no entry at all
    assert await authorizer.drop_acls(BOB, "h", [AclFilter(principal=BOB)]) == [[]]
    with pytest.raises(AuthorizationError):
        await authorizer.drop_acls(BOB, "h", [AclFilter(resource_type=ResourceType.TABLE, resource_name="shop.orders")])
    assert await authorizer.drop_acls(ALICE, "h", [AclFilter(principal=BOB)]) == [[entry]]
    assert not authorizer.is_authorized(BOB, "h", READ, ORDERS)


@pytest.mark.asyncio
async def test_dropping_acls_answers_the_same_whether_or_not_an_entry_exists(authorizer: Authorizer) -> None:
    """No oracle: a caller without the right learns nothing about which entries exist."""
    named = AclFilter(resource_type=ResourceType.TABLE, resource_name="shop.orders")
    pattern = AclFilter(principal=ALICE)

    async def answers() -> list[object]:
        outcomes: list[object] = []
        for acl_filter in (named, pattern):
            try:
                outcomes.append(await authorizer.drop_acls(BOB, "h", [acl_filter]))
            except AuthorizationError as exc:
                outcomes.append(str(exc))
        return outcomes

    without = await answers()
    await grant(authorizer, ALICE, READ, ORDERS)
    assert await answers() == without
    assert authorizer.is_authorized(ALICE, "h", READ, ORDERS), "Bob's attempts removed nothing"


@pytest.mark.asyncio
async def test_listing_shows_only_resources_the_caller_may_describe(authorizer: Authorizer) -> None:
    await grant(authorizer, ALICE, READ, ORDERS)
    await grant(authorizer, BOB, READ, Resource.table("hr", "salaries"))
    everything = AclFilter()
    assert [b.resource for b in authorizer.list_acls(ALICE, "h", everything)] == [ORDERS]
    assert len(authorizer.list_acls(ADMIN, "h", everything)) == 2
    assert authorizer.list_acls(ADMIN, "h", AclFilter(resource_type=ResourceType.TABLE, resource_name="hr.salaries"))[0].principal == BOB


@pytest.mark.asyncio
async def test_acls_are_stored_once_and_survive_a_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    store = SqliteMetadataStore(path)
    authorizer = Authorizer(store, [ADMIN])
    await grant(authorizer, ALICE, READ, ORDERS)
    await grant(authorizer, ALICE, READ, ORDERS)
    assert len(store.list_acls()) == 1
    store.close()
    reopened = SqliteMetadataStore(path)
    try:
        assert Authorizer(reopened, [ADMIN]).is_authorized(ALICE, "h", READ, ORDERS)
    finally:
        reopened.close()


def test_invalid_entries_are_refused_by_validation() -> None:
    for entry in (
        AclBinding(Resource(ResourceType.ANY, "x"), ALICE, ANY_HOST, READ),
        AclBinding(ORDERS, ALICE, ANY_HOST, OperationType.ANY),
        AclBinding(Resource(ResourceType.TABLE, "no_dot"), ALICE, ANY_HOST, READ),
        AclBinding(Resource(ResourceType.CLUSTER, "other"), ALICE, ANY_HOST, READ),
    ):
        with pytest.raises(ValueError):
            entry.validate()


def test_super_users_are_separated_by_semicolons() -> None:
    assert parse_super_users("User:admin; User:ops") == [ADMIN, Principal("User", "ops")]
    assert parse_super_users(None) == []
    with pytest.raises(ValueError):
        parse_super_users("admin")
