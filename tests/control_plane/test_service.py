"""The control plane service over HTTP (Litestar's TestClient, the app's real lifespan and stores on a
fresh SQLite file): who may call what (401 / 403 / 200), tenant keys refused, token management, the
OpenAPI schema, the metrics; and over a real PostgreSQL cut and restored under it (503, then back)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from litestar.testing import TestClient
from psycopg.conninfo import conninfo_to_dict
from tcp_proxy import ProxyThread

from control_plane.service.app import create_app
from control_plane.service.auth import check_roles_declared
from sluice.domain import Tenant
from sluice.settings import Settings, load_settings
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.admin_tokens.store import SqliteAdminTokenStore
from sluice.stores.openers import open_registry
from sluice.stores.registry.base import ReplicaState, VersionState
from sluice.stores.tenants.store import SqliteTenantStore


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def error_of(resp: httpx.Response) -> dict[str, Any]:
    """The OpenAI-style error body, checked for its shape."""
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error: dict[str, Any] = body["error"]
    return error


def make_tokens(settings: Settings) -> dict[Role, str]:
    """One token per role (named after it), made through the store as ``sluice admin-tokens`` would."""

    async def run() -> dict[Role, str]:
        store = SqliteAdminTokenStore(settings.sqlite_path)
        await store.open()
        try:
            return {role: await store.create(str(role), role) for role in Role}
        finally:
            await store.close()

    return asyncio.run(run())


def make_tenant_keys(settings: Settings, *api_keys: str) -> list[str]:
    """A tenant in the same database with a generated key and ``api_keys``, as ``sluice tenants`` would
    make them; every key."""

    async def run() -> list[str]:
        store = SqliteTenantStore(settings.sqlite_path)
        await store.open()
        try:
            keys = [await store.create(Tenant("acme", "Acme"))]
            for api_key in api_keys:
                await store.add_key("acme", api_key)
            return keys + list(api_keys)
        finally:
            await store.close()

    return asyncio.run(run())


@pytest.fixture
def settings(clean_env: Path) -> Settings:
    return load_settings()


@pytest.fixture
def tokens(settings: Settings) -> dict[Role, str]:
    return make_tokens(settings)


@pytest.fixture
def client(settings: Settings, tokens: dict[Role, str]) -> Iterator[TestClient[Any]]:
    with TestClient(create_app(settings)) as client:
        yield client


def test_probes_answer_without_auth(client: TestClient[Any]) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "admin_token_store": "ok", "registry": "ok"}


@pytest.mark.parametrize(
    ("headers", "hint"),
    [
        ({}, "No admin token"),
        ({"Authorization": "Bearer"}, "No admin token"),
        ({"Authorization": f"Basic {DEV_ADMIN_TOKEN}"}, "No admin token"),
        (bearer("sladm-" + "x" * 32), "Unknown or revoked"),
        (bearer(DEV_ADMIN_TOKEN), "Unknown or revoked"),  # dev tokens are off here
        (bearer("sk-acme-dev"), "Not an admin token"),
    ],
)
def test_missing_and_unknown_tokens_get_401(
    client: TestClient[Any], headers: dict[str, str], hint: str
) -> None:
    resp = client.get("/admin/v1/whoami", headers=headers)
    assert resp.status_code == 401 and resp.headers["WWW-Authenticate"] == 'Bearer realm="sluice-admin"'
    error = error_of(resp)
    assert error["code"] == "invalid_admin_token" and hint in error["message"]


def test_an_unknown_route_gets_the_same_error_shape(client: TestClient[Any]) -> None:
    resp = client.get("/admin/v2/whoami")
    assert resp.status_code == 404
    assert error_of(resp) == {
        "message": "No route /admin/v2/whoami: see /schema/openapi.json.",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }
    wrong_method = client.put("/admin/v1/whoami")
    assert wrong_method.status_code == 405 and error_of(wrong_method)["code"] == "method_not_allowed"


def test_a_tenant_key_is_refused_on_the_admin_api(settings: Settings, tokens: dict[Role, str]) -> None:
    """Real tenant keys of a real tenant, in the same database: 401, whatever their format."""
    keys = make_tenant_keys(settings, "sladm-registered-as-a-tenant-key")
    with TestClient(create_app(settings)) as client:
        for key in keys:
            resp = client.get("/admin/v1/whoami", headers=bearer(key))
            assert resp.status_code == 401 and error_of(resp)["code"] == "invalid_admin_token", key
        assert client.get("/admin/v1/whoami", headers=bearer(tokens[Role.VIEWER])).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "needed"),
    [
        ("GET", "/admin/v1/whoami", Role.VIEWER),
        ("GET", "/admin/v1/models", Role.VIEWER),
        ("GET", "/admin/v1/tokens", Role.PLATFORM_ADMIN),
        ("POST", "/admin/v1/tokens", Role.PLATFORM_ADMIN),
        ("DELETE", "/admin/v1/tokens/nobody", Role.PLATFORM_ADMIN),
    ],
)
def test_each_route_needs_its_role_and_every_role_above_it_passes(
    client: TestClient[Any], tokens: dict[Role, str], method: str, path: str, needed: Role
) -> None:
    body = {"name": f"new-{needed}", "role": "viewer"} if method == "POST" else None
    ranks = list(Role)
    for role in Role:
        resp = client.request(method, path, headers=bearer(tokens[role]), json=body)
        if ranks.index(role) < ranks.index(needed):
            assert resp.status_code == 403, (role, resp.text)
            error = error_of(resp)
            assert error["code"] == "insufficient_role" and f"needs role {needed}" in error["message"]
        else:
            assert resp.status_code != 403 and resp.status_code < 500, (role, resp.text)


def test_auth_runs_before_the_body_is_read(client: TestClient[Any], tokens: dict[Role, str]) -> None:
    bad = {"nonsense": True}
    assert client.post("/admin/v1/tokens", json=bad).status_code == 401
    assert client.post("/admin/v1/tokens", json=bad, headers=bearer(tokens[Role.VIEWER])).status_code == 403
    resp = client.post("/admin/v1/tokens", json=bad, headers=bearer(tokens[Role.PLATFORM_ADMIN]))
    assert resp.status_code == 400


def test_whoami(client: TestClient[Any], tokens: dict[Role, str]) -> None:
    resp = client.get("/admin/v1/whoami", headers=bearer(tokens[Role.RELEASE_MANAGER]))
    assert resp.json() == {
        "name": "release-manager",
        "role": "release-manager",
        "roles_covered": ["viewer", "release-manager"],
    }


def test_token_management_create_list_revoke(client: TestClient[Any], tokens: dict[Role, str]) -> None:
    admin = bearer(tokens[Role.PLATFORM_ADMIN])
    created = client.post(
        "/admin/v1/tokens", json={"name": "carol", "role": "release-manager"}, headers=admin
    )
    assert created.status_code == 201, created.text
    body = created.json()
    token = body["token"]
    assert re.fullmatch(r"sladm-[A-Za-z0-9_-]{32}", token) and body["token_prefix"] == token[:12]
    assert (body["name"], body["role"]) == ("carol", "release-manager") and "shown only now" in body["note"]
    assert client.get("/admin/v1/whoami", headers=bearer(token)).json()["name"] == "carol"

    listed = client.get("/admin/v1/tokens", headers=admin)
    assert listed.status_code == 200
    assert token not in listed.text and all(t not in listed.text for t in tokens.values())
    rows = {row["name"]: row for row in listed.json()}
    assert set(rows) == {"carol", "viewer", "release-manager", "platform-admin"}
    assert rows["carol"]["active"] and rows["carol"]["last_used_at"] is not None  # used just above
    assert rows["viewer"]["last_used_at"] is None

    again = client.post("/admin/v1/tokens", json={"name": "carol", "role": "viewer"}, headers=admin)
    assert again.status_code == 409 and error_of(again)["code"] == "admin_token_exists"

    revoked = client.delete("/admin/v1/tokens/carol", headers=admin)
    assert revoked.status_code == 200 and revoked.json()["active"] is False
    assert revoked.json()["revoked_at"] is not None
    assert client.get("/admin/v1/whoami", headers=bearer(token)).status_code == 401  # at once
    gone = client.delete("/admin/v1/tokens/carol", headers=admin)
    assert gone.status_code == 404 and error_of(gone)["code"] == "admin_token_not_found"
    assert (
        client.post("/admin/v1/tokens", json={"name": "carol", "role": "viewer"}, headers=admin).status_code
        == 201
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "carol", "role": "god"}, "role"),
        ({"name": "Carol Smith", "role": "viewer"}, "name"),
        ({"name": "carol"}, None),
        ({"name": "carol", "role": "viewer", "extra": 1}, None),
        ([], None),
    ],
)
def test_bad_bodies_get_400_naming_the_field(
    client: TestClient[Any], tokens: dict[Role, str], body: Any, param: str | None
) -> None:
    resp = client.post("/admin/v1/tokens", json=body, headers=bearer(tokens[Role.PLATFORM_ADMIN]))
    assert resp.status_code == 400, resp.text
    error = error_of(resp)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    assert len(client.get("/admin/v1/tokens", headers=bearer(tokens[Role.PLATFORM_ADMIN])).json()) == 3


def fill_registry(settings: Settings) -> None:
    """One model with a serving v1 (one ready replica, all the traffic) and a staged v2; a second model
    never routed."""

    async def run() -> None:
        registry = await open_registry(settings)
        try:
            await registry.create_model("sluice-tiny", actor="test", description="the dev model")
            for version in ["v1", "v2"]:
                await registry.add_version(
                    "sluice-tiny",
                    version,
                    artifact_uri=f"s3://models/sluice-tiny/{version}",
                    weights_digest="sha256:" + "ab" * 32,
                    build_config={"dtype": "float32"},
                    actor="test",
                )
            for state in [VersionState.WARMING, VersionState.SERVING]:
                await registry.set_version_state("sluice-tiny", "v1", state, actor="test")
            await registry.set_route("sluice-tiny", {"v1": 10_000}, actor="test")
            await registry.register_replica(
                "r-1",
                endpoint="127.0.0.1:8001",
                model="sluice-tiny",
                version="v1",
                actor="test",
                state=ReplicaState.READY,
            )
            await registry.create_model("other", actor="test")
        finally:
            await registry.close()

    asyncio.run(run())


def test_models_lists_the_registry(settings: Settings, tokens: dict[Role, str]) -> None:
    with TestClient(create_app(settings)) as client:
        resp = client.get("/admin/v1/models", headers=bearer(tokens[Role.VIEWER]))
        assert resp.status_code == 200 and resp.json() == {"generation": 0, "models": []}
    fill_registry(settings)
    # No health check during the test: r-1's endpoint is made up, and a check would mark it failed.
    with TestClient(create_app(settings, health_interval_s=3600)) as client:
        body = client.get("/admin/v1/models", headers=bearer(tokens[Role.VIEWER])).json()
    assert body["generation"] == 8  # 2 models, 2 versions, 2 state changes, a route, a replica
    other, tiny = body["models"]
    assert (other["name"], other["versions"], other["route"]) == ("other", [], None)
    assert (tiny["name"], tiny["description"]) == ("sluice-tiny", "the dev model")
    assert tiny["route"] == [{"version": "v1", "weight_bp": 10_000}]
    v1, v2 = tiny["versions"]
    assert (v1["version"], v1["state"], v1["num_ready_replicas"]) == ("v1", "serving", 1)
    assert (v2["version"], v2["state"], v2["num_ready_replicas"]) == ("v2", "staged", 0)
    assert v2["artifact_uri"] == "s3://models/sluice-tiny/v2" and v2["build_config"] == {"dtype": "float32"}
    assert v2["weights_digest"] == "sha256:" + "ab" * 32


def test_the_openapi_schema_documents_the_admin_api(client: TestClient[Any]) -> None:
    resp = client.get("/schema/openapi.json")
    assert resp.status_code == 200
    schema = resp.json()
    assert schema["info"]["title"] == "Sluice control plane"
    assert schema["components"]["securitySchemes"]["AdminToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schema["components"]["securitySchemes"]["AdminToken"]["description"],
    }
    paths = schema["paths"]
    assert {"/admin/v1/whoami", "/admin/v1/tokens", "/admin/v1/tokens/{name}", "/admin/v1/models"} <= set(
        paths
    )
    assert {"/healthz", "/readyz"} <= set(paths) and "/metrics" not in paths
    for path, operations in paths.items():
        for method, operation in operations.items():
            secured = operation.get("security") == [{"AdminToken": []}]
            assert secured is path.startswith("/admin/"), (method, path)
            if secured:
                assert "401" in operation["responses"], (method, path)
    assert {"403", "409", "400"} <= set(paths["/admin/v1/tokens"]["post"]["responses"])
    assert "CreateTokenBody" in str(paths["/admin/v1/tokens"]["post"]["requestBody"])


def test_metrics_count_requests_by_route_template_and_status(
    client: TestClient[Any], tokens: dict[Role, str]
) -> None:
    client.get("/admin/v1/whoami")
    client.get("/admin/v1/whoami", headers=bearer("sk-acme-dev"))
    client.get("/admin/v1/tokens", headers=bearer(tokens[Role.VIEWER]))
    client.delete("/admin/v1/tokens/nobody-1", headers=bearer(tokens[Role.PLATFORM_ADMIN]))
    client.delete("/admin/v1/tokens/nobody-2", headers=bearer(tokens[Role.PLATFORM_ADMIN]))
    client.get("/no/such/route")
    text = client.get("/metrics").text
    requests = "sluice_control_plane_requests_total"
    expected = [
        f'{requests}{{method="GET",route="/admin/v1/whoami",status_code="401"}} 2.0',
        f'{requests}{{method="GET",route="/admin/v1/tokens",status_code="403"}} 1.0',
        f'{requests}{{method="DELETE",route="/admin/v1/tokens/{{name}}",status_code="404"}} 2.0',
        f'{requests}{{method="GET",route="unmatched",status_code="404"}} 1.0',
        'sluice_control_plane_auth_refusals_total{reason="no_token"} 1.0',
        'sluice_control_plane_auth_refusals_total{reason="not_admin_token"} 1.0',
        'sluice_control_plane_auth_refusals_total{reason="insufficient_role"} 1.0',
    ]
    for line in expected:
        assert line in text, line
    assert "nobody" not in text  # names never become labels


def test_an_admin_route_without_a_declared_role_is_refused_at_start(settings: Settings) -> None:
    from litestar import Litestar, get

    @get("/admin/v1/forgotten")
    async def forgotten() -> None: ...

    with pytest.raises(RuntimeError, match="/admin/v1/forgotten"):
        check_roles_declared(Litestar(route_handlers=[forgotten]))


def test_the_dev_admin_token_works_only_when_dev_tenants_is_on(clean_env: Path) -> None:
    with TestClient(create_app(load_settings(dev_tenants=True))) as client:
        resp = client.get("/admin/v1/whoami", headers=bearer(DEV_ADMIN_TOKEN))
        assert resp.json() == {
            "name": "dev-admin",
            "role": "platform-admin",
            "roles_covered": ["viewer", "release-manager", "platform-admin"],
        }
    with TestClient(create_app(load_settings(state_dir=clean_env / "other"))) as client:
        assert client.get("/admin/v1/whoami", headers=bearer(DEV_ADMIN_TOKEN)).status_code == 401


def _wait_for_status(client: TestClient[Any], path: str, headers: dict[str, str], status: int) -> None:
    deadline = time.monotonic() + 20
    while (resp := client.get(path, headers=headers)).status_code != status:
        assert time.monotonic() < deadline, f"{path}: {resp.status_code} {resp.text}"
        time.sleep(0.2)


def test_postgres_down_at_start_and_later_gives_503_then_recovers(
    clean_env: Path, pg_schema_url: str
) -> None:
    """The service starts with PostgreSQL unreachable (stores open in the background): 503 with
    Retry-After, not 401 (a token cannot be judged) nor 500; then 200 once it answers; 503 again when it
    is cut, and back again."""
    info = conninfo_to_dict(pg_schema_url)
    proxy = ProxyThread(str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))
    try:
        proxy.cut()
        parts = urlsplit(pg_schema_url)
        url = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
        settings = load_settings(database_url=url, dev_tenants=True)
        with TestClient(create_app(settings)) as client:
            resp = client.get("/admin/v1/whoami", headers=bearer(DEV_ADMIN_TOKEN))
            assert resp.status_code == 503, resp.text
            assert error_of(resp)["code"] == "admin_token_store_unavailable" and resp.headers["Retry-After"]
            assert client.get("/readyz").status_code == 503
            proxy.restore()
            _wait_for_status(client, "/admin/v1/whoami", bearer(DEV_ADMIN_TOKEN), 200)  # seeded on open
            _wait_for_status(client, "/readyz", {}, 200)
            proxy.cut()
            assert client.get("/admin/v1/whoami", headers=bearer(DEV_ADMIN_TOKEN)).status_code == 503
            assert client.get("/readyz").json()["admin_token_store"] == "unavailable"
            proxy.restore()
            _wait_for_status(client, "/admin/v1/whoami", bearer(DEV_ADMIN_TOKEN), 200)
    finally:
        proxy.close()
