"""The release endpoints over HTTP (Litestar's TestClient, the app's real lifespan and stores on a fresh
SQLite file): who may call what (viewer reads, release-manager writes, tenant keys refused), models,
versions and routes with the registry's refusals as 400/404/409, a rollout's start/advance/pause/resume/
rollback cycle with its generations and audit rows, the status comparing versions on live traffic,
model names holding "/", the OpenAPI schema, and 503 while the registry's PostgreSQL is cut."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from litestar.testing import TestClient
from psycopg.conninfo import conninfo_to_dict
from release_helpers import DIGEST, bearer, error_of, make_tokens, usage_rows, write_usage
from tcp_proxy import ProxyThread

from control_plane.service.app import create_app
from sluice.domain import Tenant
from sluice.settings import Settings, load_settings
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.registry.postgres import PostgresRegistry
from sluice.stores.tenants.store import SqliteTenantStore

API = "/admin/v1"


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


@pytest.fixture
def rm(tokens: dict[Role, str]) -> dict[str, str]:
    """The release manager's headers."""
    return bearer(tokens[Role.RELEASE_MANAGER])


def ok(resp: Any, status: int = 200) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body: dict[str, Any] = resp.json()
    return body


def add_version(client: TestClient[Any], headers: dict[str, str], version: str, model: str = "tiny") -> Any:
    body = {"version": version, "artifact_uri": f"s3://m/{version}", "weights_digest": DIGEST}
    return client.post(f"{API}/models/{model}/versions", json=body, headers=headers)


def set_state(client: TestClient[Any], headers: dict[str, str], version: str, state: str) -> Any:
    return client.post(f"{API}/models/tiny/versions/{version}/state", json={"state": state}, headers=headers)


def stable_v1_canary_v2(client: TestClient[Any], headers: dict[str, str]) -> None:
    """tiny: v1 serving at 100%, v2 warming (its replicas loading)."""
    ok(client.post(f"{API}/models", json={"name": "tiny"}, headers=headers), 201)
    for version in ("v1", "v2"):
        ok(add_version(client, headers, version), 201)
    for version, state in (("v1", "warming"), ("v1", "serving"), ("v2", "warming")):
        ok(set_state(client, headers, version, state))
    ok(client.put(f"{API}/models/tiny/route", json={"weights_bp": {"v1": 10_000}}, headers=headers))


WRITE = Role.RELEASE_MANAGER
ROUTES = [
    ("GET", "/models/tiny", Role.VIEWER),
    ("GET", "/models/tiny/versions", Role.VIEWER),
    ("GET", "/models/tiny/route", Role.VIEWER),
    ("GET", "/models/tiny/rollout", Role.VIEWER),
    ("GET", "/audit", Role.VIEWER),
    ("POST", "/models", WRITE),
    ("POST", "/models/tiny/versions", WRITE),
    ("POST", "/models/tiny/versions/v1/state", WRITE),
    ("PUT", "/models/tiny/route", WRITE),
    ("POST", "/models/tiny/rollout", WRITE),
    ("POST", "/models/tiny/rollout/advance", WRITE),
    ("POST", "/models/tiny/rollout/pause", WRITE),
    ("POST", "/models/tiny/rollout/resume", WRITE),
    ("POST", "/models/tiny/rollout/rollback", WRITE),
]


@pytest.mark.parametrize(("method", "path", "needed"), ROUTES)
def test_each_release_route_needs_its_role(
    client: TestClient[Any], tokens: dict[Role, str], method: str, path: str, needed: Role
) -> None:
    ranks = list(Role)
    for role in Role:
        resp = client.request(method, API + path, headers=bearer(tokens[role]), json={})
        if ranks.index(role) < ranks.index(needed):
            assert resp.status_code == 403, (role, resp.text)
            assert error_of(resp)["code"] == "insufficient_role"
        else:  # the model does not exist, or the body is empty: refused, but not for the role
            assert resp.status_code not in (401, 403) and resp.status_code < 500, (role, resp.text)
    assert client.request(method, API + path, json={}).status_code == 401


def test_tenant_keys_are_refused_on_release_routes(settings: Settings, tokens: dict[Role, str]) -> None:
    async def tenant_key() -> str:
        store = SqliteTenantStore(settings.sqlite_path)
        await store.open()
        try:
            return await store.create(Tenant("acme", "Acme"))
        finally:
            await store.close()

    key = asyncio.run(tenant_key())
    with TestClient(create_app(settings)) as client:
        for method, path, _role in ROUTES:
            resp = client.request(method, API + path, headers=bearer(key), json={})
            assert resp.status_code == 401 and error_of(resp)["code"] == "invalid_admin_token", path


def test_models_versions_and_routes(
    client: TestClient[Any], rm: dict[str, str], tokens: dict[Role, str]
) -> None:
    created = ok(client.post(f"{API}/models", json={"name": "tiny", "description": "dev"}, headers=rm), 201)
    assert created["generation"] == 1 and created["model"]["name"] == "tiny"
    again = client.post(f"{API}/models", json={"name": "tiny"}, headers=rm)
    assert again.status_code == 409 and error_of(again)["code"] == "already_exists"

    added = ok(add_version(client, rm, "v1"), 201)
    assert added["generation"] == 2 and added["version"]["state"] == "staged"
    assert add_version(client, rm, "v1").status_code == 409
    missing = add_version(client, rm, "v1", model="nope")
    assert missing.status_code == 404 and "no model 'nope'" in error_of(missing)["message"]
    bad = client.post(
        f"{API}/models/tiny/versions",
        json={"version": "v2", "artifact_uri": "s3://m/v2", "weights_digest": "md5:1"},
        headers=rm,
    )
    assert bad.status_code == 400 and "weights_digest" in error_of(bad)["message"]
    unknown_field = client.post(f"{API}/models/tiny/versions", json={"version": "v2", "x": 1}, headers=rm)
    assert unknown_field.status_code == 400

    illegal = set_state(client, rm, "v1", "serving")
    assert illegal.status_code == 400 and "staged -> serving is not allowed" in error_of(illegal)["message"]
    assert set_state(client, rm, "v1", "warming").json()["generation"] == 3
    assert set_state(client, rm, "v1", "serving").json()["version"]["state"] == "serving"
    refused = client.put(f"{API}/models/tiny/route", json={"weights_bp": {"v1": 9_000}}, headers=rm)
    assert refused.status_code == 400 and "sum to 10000" in error_of(refused)["message"]
    routed = ok(client.put(f"{API}/models/tiny/route", json={"weights_bp": {"v1": 10_000}}, headers=rm))
    assert routed == {"generation": 5, "model": "tiny", "route": [{"version": "v1", "weight_bp": 10_000}]}

    viewer = bearer(tokens[Role.VIEWER])
    shown = ok(client.get(f"{API}/models/tiny", headers=viewer))
    assert shown["generation"] == 5 and shown["model"]["description"] == "dev"
    assert [v["version"] for v in shown["model"]["versions"]] == ["v1"]
    assert ok(client.get(f"{API}/models/tiny/versions", headers=viewer))["versions"][0]["state"] == "serving"
    assert ok(client.get(f"{API}/models/tiny/route", headers=viewer))["route"] == routed["route"]
    assert client.get(f"{API}/models/nope", headers=viewer).status_code == 404
    assert client.get(f"{API}/models/nope/route", headers=viewer).status_code == 404

    audit = client.get(f"{API}/audit", params={"model": "tiny", "limit": 2}, headers=viewer).json()
    assert [(a["generation"], a["action"], a["actor"]) for a in audit] == [
        (5, "route.set", "release-manager"),
        (4, "version.state", "release-manager"),
    ]
    assert client.get(f"{API}/audit", params={"limit": 0}, headers=viewer).status_code == 400


def test_a_rollout_cycle_one_generation_per_move(client: TestClient[Any], rm: dict[str, str]) -> None:
    stable_v1_canary_v2(client, rm)
    base = f"{API}/models/tiny/rollout"
    assert ok(client.get(base, headers=rm))["rollout"] is None

    started = ok(
        client.post(base, json={"version": "v2", "steps_bp": [100, 1_000, 5_000, 10_000]}, headers=rm), 201
    )
    g = started["generation"]
    assert started["rollout"]["state"] == "running" and started["rollout"]["canary_pct"] == 1.0
    assert started["rollout"]["steps_pct"] == [1.0, 10.0, 50.0, 100.0]
    assert started["route"] == [{"version": "v1", "weight_bp": 9_900}, {"version": "v2", "weight_bp": 100}]
    busy = client.post(base, json={"version": "v2", "steps_bp": [10_000]}, headers=rm)
    assert busy.status_code == 409 and "already has a running rollout" in error_of(busy)["message"]
    owned = client.put(f"{API}/models/tiny/route", json={"weights_bp": {"v1": 10_000}}, headers=rm)
    assert owned.status_code == 400 and "rollout" in error_of(owned)["message"]

    advanced = ok(client.post(f"{base}/advance", json={"reason": "1% looks fine"}, headers=rm))
    assert advanced["generation"] == g + 1 and advanced["rollout"]["canary_pct"] == 10.0
    paused = ok(client.post(f"{base}/pause", headers=rm))  # no body at all
    assert paused["generation"] == g + 2 and paused["rollout"]["state"] == "paused"
    refused = client.post(f"{base}/advance", headers=rm)
    assert refused.status_code == 400 and "resume it first" in error_of(refused)["message"]
    assert ok(client.post(f"{base}/resume", headers=rm))["generation"] == g + 3

    back = ok(client.post(f"{base}/rollback", json={"reason": "latency"}, headers=rm))
    assert back["generation"] == g + 4  # one write: route, both versions' states, the rollout
    assert back["rollout"]["state"] == "rolled_back" and back["rollout"]["reason"] == "latency"
    assert back["route"] == [{"version": "v1", "weight_bp": 10_000}]
    versions = {
        v["version"]: v["state"]
        for v in client.get(f"{API}/models/tiny/versions", headers=rm).json()["versions"]
    }
    assert versions == {"v1": "serving", "v2": "draining"}

    audit = client.get(f"{API}/audit", params={"model": "tiny", "limit": 5}, headers=rm).json()
    assert [(a["generation"], a["action"], a["actor"], a["subject"]) for a in audit] == [
        (g + 4, "rollout.rollback", "release-manager", "rollout"),
        (g + 3, "rollout.resume", "release-manager", "rollout"),
        (g + 2, "rollout.pause", "release-manager", "rollout"),
        (g + 1, "rollout.advance", "release-manager", "rollout"),
        (g, "rollout.start", "release-manager", "rollout"),
    ]
    assert audit[0]["after"]["versions"] == {"v2": "draining"} and audit[0]["after"]["route"] == {
        "v1": 10_000
    }
    assert audit[3]["after"]["rollout"]["reason"] == "1% looks fine"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"version": "v2", "steps_bp": [100, 50, 10_000]}, "increase"),
        ({"version": "v2", "steps_bp": [100, 5_000]}, "last step"),
        ({"version": "v9", "steps_bp": [10_000]}, "no version"),
        ({"version": "v2", "steps_bp": [10_000], "guard": {"min_requests": 0}}, "min_requests"),
        ({"version": "v2", "steps_bp": [10_000], "guard": {"nonsense": 1}}, "nonsense"),
    ],
)
def test_a_bad_start_is_refused_with_the_registrys_words(
    client: TestClient[Any], rm: dict[str, str], body: dict[str, Any], words: str
) -> None:
    stable_v1_canary_v2(client, rm)
    resp = client.post(f"{API}/models/tiny/rollout", json=body, headers=rm)
    assert resp.status_code in (400, 404), resp.text
    assert words in error_of(resp)["message"]
    assert client.get(f"{API}/models/tiny/rollout", headers=rm).json()["rollout"] is None


def test_status_compares_the_versions_on_live_traffic(
    client: TestClient[Any], rm: dict[str, str], settings: Settings
) -> None:
    stable_v1_canary_v2(client, rm)
    guard = {"min_requests": 1000, "interval_s": 60}
    ok(
        client.post(
            f"{API}/models/tiny/rollout",
            json={"version": "v2", "steps_bp": [1_000, 10_000], "guard": guard},
            headers=rm,
        ),
        201,
    )
    rows = usage_rows("tiny", "v1", num_ok=18, num_failed=2, ttft_ms=100, itl_p95_ms=20)
    rows += usage_rows("tiny", "v2", num_ok=3, num_failed=1, ttft_ms=250, itl_p95_ms=30)
    write_usage(settings, rows)

    status = ok(client.get(f"{API}/models/tiny/rollout", headers=rm))
    assert status["rollout"]["guard"]["min_requests"] == 1000 and status["traffic_unavailable"] is None
    assert status["traffic_since"] == status["rollout"]["step_started_at"]
    stable, canary = status["traffic"]
    assert (stable["version"], stable["role"], stable["num_requests"], stable["num_errors"]) == (
        "v1",
        "stable",
        20,
        2,
    )
    assert (canary["version"], canary["role"], canary["num_requests"], canary["error_rate"]) == (
        "v2",
        "canary",
        4,
        0.25,
    )
    assert (stable["ttft_p95_ms"], canary["ttft_p95_ms"], canary["itl_p95_ms"]) == (100, 250, 30)
    assert (canary["prompt_tokens"], canary["output_tokens"]) == (40, 20)


def test_model_names_holding_a_slash_are_addressed_encoded(
    client: TestClient[Any], rm: dict[str, str]
) -> None:
    name = "meta-llama/Llama-3.1-8B"
    ok(client.post(f"{API}/models", json={"name": name}, headers=rm), 201)
    path = f"{API}/models/meta-llama%2FLlama-3.1-8B"
    ok(
        client.post(
            f"{path}/versions",
            json={"version": "v1", "artifact_uri": "s3://m/v1", "weights_digest": DIGEST},
            headers=rm,
        ),
        201,
    )
    assert ok(client.get(path, headers=rm))["model"]["name"] == name
    assert ok(client.get(f"{path}/rollout", headers=rm))["model"] == name
    assert client.get(f"{API}/models/meta-llama/Llama-3.1-8B", headers=rm).status_code == 404  # unencoded


def test_the_openapi_schema_documents_the_release_api(client: TestClient[Any]) -> None:
    paths = client.get("/schema/openapi.json").json()["paths"]
    expected = {
        "/admin/v1/models": {"get", "post"},
        "/admin/v1/models/{model}": {"get"},
        "/admin/v1/models/{model}/versions": {"get", "post"},
        "/admin/v1/models/{model}/versions/{version}/state": {"post"},
        "/admin/v1/models/{model}/route": {"get", "put"},
        "/admin/v1/models/{model}/rollout": {"get", "post"},
        "/admin/v1/models/{model}/rollout/advance": {"post"},
        "/admin/v1/models/{model}/rollout/pause": {"post"},
        "/admin/v1/models/{model}/rollout/resume": {"post"},
        "/admin/v1/models/{model}/rollout/rollback": {"post"},
        "/admin/v1/audit": {"get"},
    }
    for path, methods in expected.items():
        assert methods <= set(paths[path]), path
        for method in methods:
            operation = paths[path][method]
            assert operation["security"] == [{"AdminToken": []}] and "401" in operation["responses"], path
            assert operation.get("description") or operation.get("summary"), (method, path)
    assert "StartRolloutBody" in str(paths["/admin/v1/models/{model}/rollout"]["post"]["requestBody"])
    assert {"400", "409"} <= set(paths["/admin/v1/models/{model}/rollout"]["post"]["responses"])


def test_503_while_the_registry_is_unreachable(
    settings: Settings, tokens: dict[Role, str], pg_schema_url: str
) -> None:
    """Tokens on SQLite, the registry on a PostgreSQL behind a proxy that is cut: 503 with Retry-After
    (not 500), and answers again once it is restored."""
    info = conninfo_to_dict(pg_schema_url)
    proxy = ProxyThread(str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))
    try:
        parts = urlsplit(pg_schema_url)
        url = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
        registry = PostgresRegistry(url, pool_max_size=2, pool_acquire_timeout_s=1.0)
        rm = bearer(tokens[Role.RELEASE_MANAGER])
        with TestClient(create_app(settings, registry=registry)) as client:
            ok(client.post(f"{API}/models", json={"name": "tiny"}, headers=rm), 201)
            proxy.cut()
            for method, path in (("GET", "/models/tiny"), ("POST", "/models/tiny/rollout/pause")):
                resp = client.request(method, API + path, headers=rm)
                assert resp.status_code == 503, resp.text
                assert error_of(resp)["code"] == "registry_unavailable" and resp.headers["Retry-After"]
            proxy.restore()
            deadline = time.monotonic() + 20
            while client.get(f"{API}/models/tiny", headers=rm).status_code != 200:
                assert time.monotonic() < deadline, "the registry did not come back"
                time.sleep(0.2)
    finally:
        proxy.close()
