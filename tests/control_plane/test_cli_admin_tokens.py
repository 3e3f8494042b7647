"""``sluice admin-tokens ...`` run in-process (``main([...])``) against a fresh SQLite file, and once
against a real PostgreSQL database: what an operator sees, the exit codes, and that the tokens made here
are what the control plane service accepts (the bootstrap path)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from control_plane.cli.main import main
from control_plane.service.app import create_app
from sluice.settings import get_settings
from sluice.stores.admin_tokens.base import AdminPrincipal, hash_token
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.openers import open_admin_token_store


@pytest.fixture(autouse=True)
def state_dir(clean_env: Path) -> Path:
    return clean_env


def sluice(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run one command; (exit code, stdout, stderr)."""
    get_settings.cache_clear()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def resolve(token: str) -> AdminPrincipal | None:
    """What the control plane service opening the same store would see for this token."""

    async def run() -> AdminPrincipal | None:
        store = await open_admin_token_store(get_settings())
        try:
            return await store.resolve(token, record_use=False)
        finally:
            await store.close()

    get_settings.cache_clear()
    return asyncio.run(run())


def token_in(out: str) -> str:
    (token,) = re.findall(r"sladm-[A-Za-z0-9_-]{32}", out)
    return token


def table(out: str) -> list[list[str]]:
    """The table's lines split into cells ("LAST USED" is one header cell)."""
    lines = [line.replace("LAST USED", "LAST_USED").split() for line in out.splitlines() if line.strip()]
    return lines[next(i for i, cells in enumerate(lines) if cells[:2] == ["NAME", "ROLE"]) :]


def test_create_list_and_revoke(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = sluice(capsys, "admin-tokens", "create", "alice", "--role", "platform-admin")
    assert (code, err) == (0, "")
    token = token_in(out)
    assert "shown only now" in out and hash_token(token) not in out
    assert resolve(token) == AdminPrincipal("alice", Role.PLATFORM_ADMIN)
    assert sluice(capsys, "admin-tokens", "create", "bob", "--role", "viewer")[0] == 0

    code, out, err = sluice(capsys, "admin-tokens", "list")
    assert (code, err) == (0, "")
    assert token not in out
    rows = table(out)
    assert rows[0] == ["NAME", "ROLE", "PREFIX", "STATUS", "CREATED", "LAST_USED", "REVOKED"]
    assert [r[:4] for r in rows[1:]] == [["alice", "platform-admin", token[:12], "active"], rows[2][:4]]
    assert rows[2][:2] == ["bob", "viewer"] and rows[1][5:] == ["never", "-"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rows[1][4])

    code, out, err = sluice(capsys, "admin-tokens", "revoke", "alice")
    assert (code, err) == (0, "") and "Revoked admin token 'alice'" in out
    assert resolve(token) is None
    rows = table(sluice(capsys, "admin-tokens", "list")[1])
    assert rows[1][:4] == ["alice", "platform-admin", token[:12], "revoked"] and rows[1][6] != "-"


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = sluice(capsys, "admin-tokens", "list", "--json")
    assert (code, json.loads(out)) == (0, [])
    code, out, _ = sluice(capsys, "admin-tokens", "create", "ci-bot", "--role", "release-manager", "--json")
    created = json.loads(out)
    assert code == 0 and set(created) == {"name", "role", "token", "token_prefix", "note"}
    assert (created["name"], created["role"]) == ("ci-bot", "release-manager")
    assert resolve(created["token"]) == AdminPrincipal("ci-bot", Role.RELEASE_MANAGER)
    (listed,) = json.loads(sluice(capsys, "admin-tokens", "list", "--json")[1])
    assert listed["active"] is True and listed["token_prefix"] == created["token"][:12]
    assert listed["last_used_at"] is None and listed["revoked_at"] is None and "token" not in listed
    revoked: dict[str, Any] = json.loads(sluice(capsys, "admin-tokens", "revoke", "ci-bot", "--json")[1])
    assert revoked["active"] is False and revoked["revoked_at"] is not None


def test_an_empty_list_says_how_to_start(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = sluice(capsys, "admin-tokens", "list")
    assert code == 0 and "sluice admin-tokens create NAME --role platform-admin" in out


@pytest.mark.parametrize(
    ("argv", "code", "fragment"),
    [
        (["create", "alice", "--role", "god"], 2, "invalid choice: 'god'"),
        (["create", "alice"], 2, "--role"),
        (["create", "Alice Smith", "--role", "viewer"], 2, "token name must be"),
        (["revoke"], 2, "NAME"),
        (["rotate", "alice"], 2, "invalid choice"),
    ],
)
def test_usage_errors_exit_2_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], code: int, fragment: str
) -> None:
    got, out, err = sluice(capsys, "admin-tokens", *argv)
    assert got == code and out == ""
    assert fragment in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_refusals_exit_1_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert sluice(capsys, "admin-tokens", "create", "alice", "--role", "viewer")[0] == 0
    code, _, err = sluice(capsys, "admin-tokens", "create", "alice", "--role", "viewer")
    assert code == 1 and "an active admin token is named 'alice' already" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = sluice(capsys, "admin-tokens", "revoke", "nobody")
    assert code == 1 and "no active admin token is named 'nobody'" in err
    assert len(err.strip().splitlines()) == 1


def test_an_unreachable_store_exits_1_naming_where(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SLUICE_STATE_DIR", str(tmp_path / "a-file"))  # its database cannot be made
    code, out, err = sluice(capsys, "admin-tokens", "list")
    assert code == 1 and out == "" and "Traceback" not in err
    assert "cannot reach the admin token store at SQLite" in err and len(err.strip().splitlines()) == 1


def test_a_settings_error_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_CONTROL_PLANE_PORT", "8080")  # the gateway's
    code, _, err = sluice(capsys, "admin-tokens", "list")
    assert code == 2 and "must differ from gateway_port" in err


def test_the_first_platform_admin_made_here_runs_the_admin_api_on_postgres(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pg_schema_url: str
) -> None:
    """The bootstrap path: no admin exists, the CLI makes one, the service takes it (and no other)."""
    monkeypatch.setenv("SLUICE_DATABASE_URL", pg_schema_url)
    code, out, _ = sluice(capsys, "admin-tokens", "create", "root", "--role", "platform-admin")
    assert code == 0
    token = token_in(out)
    get_settings.cache_clear()
    with TestClient(create_app(get_settings())) as client:
        headers = {"Authorization": f"Bearer {token}"}
        assert client.get("/admin/v1/whoami", headers=headers).json()["name"] == "root"
        made = client.post("/admin/v1/tokens", json={"name": "viewer-1", "role": "viewer"}, headers=headers)
        assert made.status_code == 201
    rows = table(sluice(capsys, "admin-tokens", "list")[1])
    assert [(r[0], r[3]) for r in rows[1:]] == [("root", "active"), ("viewer-1", "active")]
    assert rows[1][5] != "never"  # the service recorded its use
    assert sluice(capsys, "admin-tokens", "revoke", "root")[0] == 0
    get_settings.cache_clear()
    with TestClient(create_app(get_settings())) as client:
        assert client.get("/admin/v1/whoami", headers=headers).status_code == 401
