"""The gateway on a server with SASL/PLAIN and the authorizer: HTTP Basic credentials (or a bearer token
standing for a login) become the user's own SASL login, so the cluster's ACLs judge gateway users exactly as
RPC users."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from strom.client import Connection
from strom.gateway.app import create_app
from strom.gateway.tokens import TokenFileError
from strom.security.acl import AclBinding, AclFilter, OperationType, Principal, Resource
from tests.conftest import unique_name
from tests.gateway.support import served
from tests.integration.security_support import SECURE_CONFIG, USERS, strom_config
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.timeout(120)]

DATABASE = "fluss"


@pytest.fixture(scope="module")
def secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("gateway_secure") / "data", SECURE_CONFIG)
    process.start()
    yield process
    assert process.stop() == 0, process.log_text()[-3000:]
    assert not process.internal_errors()


@pytest_asyncio.fixture
async def gateway(secure_server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(secure_server.address, {"gateway.max-user-connections": "2"})
    async with served(app) as client:
        yield client


def as_user(user: str, password: str | None = None) -> httpx.BasicAuth:
    return httpx.BasicAuth(user, password if password is not None else USERS[user])


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["request_id"] == response.headers["x-request-id"]


@pytest.mark.asyncio
async def test_credentials_are_required_and_checked(gateway: httpx.AsyncClient) -> None:
    anonymous = await gateway.get("/v1/databases")
    assert_error(anonymous, 401, "unauthenticated")
    assert anonymous.headers["www-authenticate"].startswith("Basic")
    assert_error(await gateway.get("/v1/databases", auth=as_user("admin", "wrong")), 401, "unauthenticated")
    assert_error(await gateway.get("/v1/databases", headers={"authorization": "Basic %%%"}), 401, "unauthenticated")
    assert_error(await gateway.get("/v1/databases", headers={"authorization": "Bearer x"}), 401, "unauthenticated")
    assert (await gateway.get("/v1/databases", auth=as_user("admin"))).json()["databases"] == [DATABASE]
    assert (await gateway.get("/health")).status_code == 200  # health needs no credentials


@pytest.mark.asyncio
async def test_a_user_without_write_gets_403_and_nothing_is_written(
    gateway: httpx.AsyncClient, secure_server: ServerProcess
) -> None:
    name = unique_name("gwacl")
    body: dict[str, Any] = {"name": name, "columns": [{"name": "id", "type": "INT"}, {"name": "v", "type": "STRING"}],
                            "primary_key": ["id"]}
    created = await gateway.post(f"/v1/databases/{DATABASE}/tables", json=body, auth=as_user("admin"))
    assert created.status_code == 201, created.text
    base = f"/v1/databases/{DATABASE}/tables/{name}"
    resource = Resource.table(DATABASE, name)
    async with await Connection.create(strom_config(secure_server, "admin")) as admin:
        await admin.get_admin().create_acls([AclBinding(resource, Principal("User", "alice"), "*", OperationType.READ)])
        try:
            rows = {"rows": [{"id": 1, "v": "alice"}]}
            assert_error(await gateway.post(f"{base}/rows:upsert", json=rows, auth=as_user("alice")), 403, "unauthorized")
            looked = await gateway.post(f"{base}/lookup", json={"keys": [[1]]}, auth=as_user("alice"))
            assert looked.json() == {"rows": [None]}, looked.text  # alice may read: nothing was written
            # bob may not even describe the table: it looks unknown to him, as over RPC
            assert_error(await gateway.get(base, auth=as_user("bob")), 404, "table_not_found")
            await admin.get_admin().create_acls(
                [AclBinding(resource, Principal("User", "alice"), "*", OperationType.WRITE)]
            )
            written = await gateway.post(f"{base}/rows:upsert", json=rows, auth=as_user("alice"))
            assert written.status_code == 200, written.text
            looked = await gateway.post(f"{base}/lookup", json={"keys": [[1]]}, auth=as_user("admin"))
            assert looked.json() == {"rows": [{"id": 1, "v": "alice"}]}
            # more users than the cache holds: the oldest connection is replaced, requests still succeed
            for user in ("bob", "carol", "alice"):
                assert (await gateway.get("/health", auth=as_user(user))).status_code == 200
                assert (await gateway.get("/v1/databases", auth=as_user(user))).status_code == 200
        finally:
            await admin.get_admin().drop_acls([AclFilter(principal=Principal("User", "alice"))])


# ---- bearer tokens ----

TOKENS = {"alice": "tok-alice-7f3a", "admin": "tok-admin-91c2"}


def token_file(directory: Path, document: Any) -> Path:
    path = directory / "tokens.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def bearer(user: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[user]}"}


@pytest_asyncio.fixture
async def token_gateway(secure_server: ServerProcess, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    entries = [{"sha256": hashlib.sha256(TOKENS[user].encode()).hexdigest(), "user": user, "password": USERS[user]}
               for user in TOKENS]
    app = create_app(secure_server.address, {"gateway.auth.token-file": str(token_file(tmp_path, {"tokens": entries}))})
    async with served(app) as client:
        yield client


@pytest.mark.asyncio
async def test_a_bearer_token_acts_as_its_user(token_gateway: httpx.AsyncClient, secure_server: ServerProcess) -> None:
    name = unique_name("gwtoken")
    body: dict[str, Any] = {"name": name, "columns": [{"name": "id", "type": "INT"}, {"name": "v", "type": "STRING"}],
                            "primary_key": ["id"]}
    created = await token_gateway.post(f"/v1/databases/{DATABASE}/tables", json=body, headers=bearer("admin"))
    assert created.status_code == 201, created.text
    base = f"/v1/databases/{DATABASE}/tables/{name}"
    async with await Connection.create(strom_config(secure_server, "admin")) as admin:
        binding = AclBinding(Resource.table(DATABASE, name), Principal("User", "alice"), "*", OperationType.READ)
        await admin.get_admin().create_acls([binding])
        try:
            looked = await token_gateway.post(f"{base}/lookup", json={"keys": [[1]]}, headers=bearer("alice"))
            assert looked.json() == {"rows": [None]}, looked.text
            assert (await token_gateway.get(base, headers=bearer("alice"))).status_code == 200
            rows = {"rows": [{"id": 1, "v": "alice"}]}
            refused = await token_gateway.post(f"{base}/rows:upsert", json=rows, headers=bearer("alice"))
            assert_error(refused, 403, "unauthorized")
            looked = await token_gateway.post(f"{base}/lookup", json={"keys": [[1]]}, headers=bearer("admin"))
            assert looked.json() == {"rows": [None]}  # nothing was written
            # Basic credentials still work beside tokens
            assert (await token_gateway.get(base, auth=as_user("alice"))).status_code == 200
        finally:
            await admin.get_admin().drop_acls([AclFilter(principal=Principal("User", "alice"))])


@pytest.mark.asyncio
async def test_an_unknown_bearer_token_is_401(token_gateway: httpx.AsyncClient) -> None:
    for header in ("Bearer tok-alice-7f3b", "Bearer " + hashlib.sha256(TOKENS["alice"].encode()).hexdigest(), "Bearer "):
        response = await token_gateway.get("/v1/databases", headers={"authorization": header})
        assert_error(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"].startswith("Bearer")
    anonymous = await token_gateway.get("/v1/databases")
    assert_error(anonymous, 401, "unauthenticated")
    assert "Basic" in anonymous.headers["www-authenticate"] and "Bearer" in anonymous.headers["www-authenticate"]


@pytest.mark.parametrize(("document", "fragment"), [
    ("{not json", "not valid JSON"),
    ({"token": []}, '{"tokens": [...]}'),
    ({"tokens": {}}, '{"tokens": [...]}'),
    ({"tokens": ["x"]}, "tokens[0] must be an object"),
    ({"tokens": [{"sha256": "ab", "user": "alice", "password": "p"}]}, "64 hex digits"),
    ({"tokens": [{"token": "clear", "user": "alice", "password": "p"}]}, "missing ['sha256']"),
    ({"tokens": [{"sha256": "a" * 64, "user": "", "password": "p"}]}, "user must be a non-empty string"),
    ({"tokens": [{"sha256": "a" * 64, "user": "u", "password": "p"}] * 2}, "the same sha256 twice"),
])
def test_a_malformed_token_file_is_refused_at_start(tmp_path: Path, document: Any, fragment: str) -> None:
    path = token_file(tmp_path, document)
    with pytest.raises(TokenFileError, match=r"gateway\.auth\.token-file") as refused:
        create_app("127.0.0.1:1", {"gateway.auth.token-file": str(path)})
    assert fragment in str(refused.value)
    with pytest.raises(TokenFileError, match="cannot be read"):
        create_app("127.0.0.1:1", {"gateway.auth.token-file": str(tmp_path / "missing.json")})
