"""The operator's usage and cost report: ``GET /admin/v1/usage`` and ``sluice usage`` against the control
plane running as a real process (``python -m control_plane.service``), once on SQLite and once on the real
PostgreSQL, with rows written straight into the ledger it reads, as gateways would. Prices, the tenant /
model / class filters, the default window, the table and ``--json``; 400 for bad input (never 500), 401
for a tenant API key, and 503 with Retry-After while the ledger's PostgreSQL is cut."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from control_plane_process import RunningControlPlane, running_control_plane
from litestar.testing import TestClient
from psycopg.conninfo import conninfo_to_dict
from release_helpers import bearer, error_of, make_tokens
from tcp_proxy import ProxyThread

from control_plane.cli.main import main
from control_plane.service.app import create_app
from sluice.domain import Outcome, RequestClass, UsageRecord
from sluice.settings import Settings, get_settings, load_settings
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.admin_tokens.store import SqliteAdminTokenStore
from sluice.stores.openers import open_ledger

# sluice-tiny priced, "unpriced" not (no "*"); batch tokens at the default discount, half off.
PRICES = '{"sluice-tiny": {"prompt_usd_per_m": 2, "output_usd_per_m": 6}}'
DEV_TENANT_KEY = "sk-acme-dev"  # a tenant's API key (dev tenants are on in the service)


@pytest.fixture(autouse=True)
def _clean(clean_env: Path) -> Path:
    return clean_env


@pytest.fixture(params=["sqlite", "postgres"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningControlPlane]:
    """The control plane as an operator starts it (dev admin token on, ``PRICES``), its stores on SQLite
    or on a fresh PostgreSQL schema, with ``ROWS`` in its ledger."""
    extra = {"SLUICE_PRICES": PRICES}
    if request.param == "postgres":
        extra["SLUICE_DATABASE_URL"] = request.getfixturevalue("pg_schema_url")
    with running_control_plane(tmp_path / "state", **extra) as running:
        write_rows(running.settings(), rows(datetime.now(UTC)))
        yield running


def rec(tenant_id: str, request_id: str, finished_at: datetime, **kw: Any) -> UsageRecord:
    fields: dict[str, Any] = dict(
        tenant_id=tenant_id,
        request_id=request_id,
        model="sluice-tiny",
        model_version="1",
        prompt_tokens=0,
        output_tokens=0,
        status=Outcome.FINISHED,
        started_at=finished_at - timedelta(seconds=1),
        finished_at=finished_at,
    )
    fields.update(kw)
    return UsageRecord(**fields)


def rows(now: datetime) -> list[UsageRecord]:
    """acme and globex in the last hour, and one acme row three days old (outside the default window)."""
    recent = now - timedelta(minutes=30)
    return [
        rec("acme", "r1", recent, prompt_tokens=100, output_tokens=10),
        rec("acme", "r2", recent, prompt_tokens=50, status=Outcome.FAILED),
        rec("acme", "r3", recent, prompt_tokens=1000, output_tokens=1000, request_class=RequestClass.BATCH),
        # globex reuses acme's request id: its own row, never counted in acme's lines.
        rec("globex", "r1", recent, prompt_tokens=1_000_000),
        rec("globex", "r4", recent, model="unpriced", prompt_tokens=10, output_tokens=10),
        rec("acme", "old", now - timedelta(days=3), prompt_tokens=500, status=Outcome.DEADLINE),
    ]


def write_rows(settings: Settings, records: list[UsageRecord]) -> None:
    async def run() -> None:
        ledger = await open_ledger(settings)
        try:
            for r in records:
                assert await ledger.record(r)
        finally:
            await ledger.close()

    asyncio.run(run())


def line(
    tenant: str, model: str, cls: str, n: int, errors: int, p: int, o: int, cost: float | None
) -> dict[str, Any]:
    return dict(tenant_id=tenant, model=model, request_class=cls, num_requests=n, num_errors=errors,
                prompt_tokens=p, output_tokens=o, total_tokens=p + o, cost_usd=cost)  # fmt: skip


# (150 * 2 + 10 * 6) / 1e6; (1000 * 2 + 1000 * 6) / 1e6, half off; 1e6 * 2 / 1e6.
ACME_INTERACTIVE = line("acme", "sluice-tiny", "interactive", 2, 1, 150, 10, 0.00036)
ACME_BATCH = line("acme", "sluice-tiny", "batch", 1, 0, 1000, 1000, 0.004)
GLOBEX_TINY = line("globex", "sluice-tiny", "interactive", 1, 0, 1_000_000, 0, 2.0)
GLOBEX_UNPRICED = line("globex", "unpriced", "interactive", 1, 0, 10, 10, None)


def get_report(service: RunningControlPlane, token: str = DEV_ADMIN_TOKEN, **params: str) -> httpx.Response:
    return httpx.get(f"{service.url}/admin/v1/usage", params=params, headers=bearer(token), timeout=30)


def ok(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def sluice(
    capsys: pytest.CaptureFixture[str], service: RunningControlPlane, *argv: str
) -> tuple[int, str, str]:
    get_settings.cache_clear()
    code = main(["usage", *argv, "--admin-url", service.url, "--token", DEV_ADMIN_TOKEN])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_prices_each_tenants_lines_over_the_last_day(service: RunningControlPlane) -> None:
    before = datetime.now(UTC)
    report = ok(get_report(service))
    assert report["data"] == [ACME_BATCH, ACME_INTERACTIVE, GLOBEX_TINY, GLOBEX_UNPRICED]
    # The default window: the last 24 h, so acme's three-day-old row is out.
    since, until = (datetime.fromisoformat(report[k]) for k in ("since", "until"))
    assert until - since == timedelta(hours=24) and before <= until <= datetime.now(UTC)
    # One model has no price: no total cost (it would read as the whole bill), the counts still add up.
    assert report["totals"] == dict(num_requests=5, num_errors=1, prompt_tokens=1_001_160,
                                    output_tokens=1020, total_tokens=1_002_180, cost_usd=None)  # fmt: skip
    priced = ok(get_report(service, model="sluice-tiny"))
    assert priced["data"] == [ACME_BATCH, ACME_INTERACTIVE, GLOBEX_TINY]
    assert priced["totals"]["cost_usd"] == 2.00436 and priced["model"] == "sluice-tiny"


def test_the_tenant_filter_keeps_other_tenants_rows_out(service: RunningControlPlane) -> None:
    acme = ok(get_report(service, tenant="acme"))
    assert acme["data"] == [ACME_BATCH, ACME_INTERACTIVE] and acme["tenant"] == "acme"
    assert acme["totals"]["prompt_tokens"] == 1150 and acme["totals"]["cost_usd"] == 0.00436
    globex = ok(get_report(service, tenant="globex", request_class="interactive"))
    assert globex["data"] == [GLOBEX_TINY, GLOBEX_UNPRICED]
    assert ok(get_report(service, tenant="initech"))["data"] == []
    # A wider window takes acme's old row (a deadline: an error), in its own line's sums.
    week = ok(get_report(service, tenant="acme", since="7d", request_class="interactive"))
    assert week["data"] == [line("acme", "sluice-tiny", "interactive", 3, 2, 650, 10, 0.00136)]


def test_cli_prints_a_table_with_totals_and_json_as_the_api(
    capsys: pytest.CaptureFixture[str], service: RunningControlPlane
) -> None:
    code, out, err = sluice(capsys, service, "--tenant", "acme")
    assert (code, err) == (0, "")
    lines = [row.split() for row in out.splitlines()]
    assert lines[0][:2] == ["Usage", "from"]
    assert lines[1:] == [
        ["TENANT", "MODEL", "CLASS", "REQUESTS", "PROMPT_TOKENS", "OUTPUT_TOKENS", "ERRORS", "COST_USD"],
        ["acme", "sluice-tiny", "batch", "1", "1000", "1000", "0", "0.004000"],
        ["acme", "sluice-tiny", "interactive", "2", "150", "10", "1", "0.000360"],
        ["TOTAL", "-", "-", "3", "1150", "1010", "1", "0.004360"],
    ]
    code, out, err = sluice(capsys, service, "--since", "7d", "--model", "unpriced", "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["data"] == [GLOBEX_UNPRICED] and report["object"] == "usage_report"
    assert report == ok(get_report(service, since=report["since"], until=report["until"], model="unpriced"))
    code, out, err = sluice(capsys, service, "--tenant", "initech")
    assert (code, err) == (0, "") and "No usage in this window." in out


def test_bad_input_is_a_400_naming_the_parameter_and_a_tenant_key_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with running_control_plane(tmp_path / "state") as service:
        for params, param, words in (
            ({"since": "yesterday"}, "since", "since must be an ISO 8601 time"),
            ({"until": "nan"}, "until", "until must be an ISO 8601 time"),
            ({"since": "1h", "until": "2h"}, "since", "since must be before until"),
            ({"since": "2026-11-01", "until": "2026-11-01"}, "since", "since must be before until"),
            ({"until": "9999-12-31T23:59:59-05:00"}, "until", "until must be an ISO 8601 time"),
            ({"request_class": "gold"}, "request_class", "request_class must be one of"),
        ):
            resp = get_report(service, **params)
            assert resp.status_code == 400, (params, resp.text)
            error = error_of(resp)
            assert error["param"] == param and error["message"].startswith(words), error
        for token in (DEV_TENANT_KEY, "sladm-not-a-token"):
            resp = get_report(service, token)
            assert resp.status_code == 401 and error_of(resp)["code"] == "invalid_admin_token", resp.text
        assert httpx.get(f"{service.url}/admin/v1/usage", timeout=30).status_code == 401
        schema = httpx.get(f"{service.url}/schema/openapi.json", timeout=30).json()
        operation = schema["paths"]["/admin/v1/usage"]["get"]
        assert operation["security"] == [{"AdminToken": []}]
        assert {"400", "401", "503"} <= set(operation["responses"])
        assert {p["name"] for p in operation["parameters"]} == {
            "since",
            "until",
            "tenant",
            "model",
            "request_class",
        }
        # The command refuses what the service would, before any call (exit 2).
        code, out, err = sluice(capsys, service, "--since", "2h", "--until", "3h")
        assert code == 2 and out == "" and "--since: since must be before until" in err
        code, _, err = sluice(capsys, service, "--class", "gold")
        assert code == 2 and "invalid choice" in err
        get_settings.cache_clear()
        code = main(["usage", "--admin-url", service.url, "--token", DEV_TENANT_KEY])
        assert code == 1 and "401 invalid_admin_token" in capsys.readouterr().err


def test_503_with_retry_after_while_the_ledger_is_unreachable(pg_schema_url: str) -> None:
    """Admin tokens on SQLite, the ledger (and registry) on a PostgreSQL behind a proxy that is cut: 503
    with Retry-After (not 500), and the report again once it is restored."""
    info = conninfo_to_dict(pg_schema_url)
    proxy = ProxyThread(str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))
    try:
        parts = urlsplit(pg_schema_url)
        url = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
        settings = load_settings(database_url=url)
        viewer = bearer(make_tokens(settings)[Role.VIEWER])
        tokens = SqliteAdminTokenStore(settings.sqlite_path)
        with TestClient(create_app(settings, token_store=tokens)) as client:
            assert client.get("/admin/v1/usage", headers=viewer).json()["data"] == []
            proxy.cut()
            resp = client.get("/admin/v1/usage", headers=viewer)
            assert resp.status_code == 503, resp.text
            assert error_of(resp)["code"] == "usage_ledger_unavailable" and resp.headers["Retry-After"] == "5"
            proxy.restore()
            deadline = time.monotonic() + 20
            while client.get("/admin/v1/usage", headers=viewer).status_code != 200:
                assert time.monotonic() < deadline, "the ledger did not come back"
                time.sleep(0.2)
    finally:
        proxy.close()
