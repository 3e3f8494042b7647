"""``sluice tenants ...`` run in-process (``main([...])``) against a fresh SQLite file, and once against
a real PostgreSQL database created for the test: what an operator sees, the exit codes, and that the
store really changed (keys checked through the store the gateway uses)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg import PostgresUnreachable, created_database

from control_plane.cli.main import main
from sluice.domain import Tenant
from sluice.settings import get_settings
from sluice.stores.openers import open_tenant_store
from sluice.stores.tenants.base import TenantStoreUnavailable, hash_key
from sluice.stores.tenants.store import SqliteTenantStore

ADMIN_URL = os.environ.get("TEST_POSTGRES_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(autouse=True)
def state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No SLUICE_* variable from the caller's shell; state under tmp_path; no dev tenants unless a test
    turns them on; get_settings() reads afresh."""
    for name in list(os.environ):
        if name.upper().startswith("SLUICE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLUICE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SLUICE_DEV_TENANTS", "false")
    get_settings.cache_clear()
    yield tmp_path / "state"
    get_settings.cache_clear()


def sluice(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run one command; (exit code, stdout, stderr)."""
    get_settings.cache_clear()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def resolve(api_key: str) -> Tenant | None:
    """What a gateway opening the same store would see for this key."""

    async def run() -> Tenant | None:
        store = await open_tenant_store(get_settings())
        try:
            return await store.resolve(api_key)
        finally:
            await store.close()

    get_settings.cache_clear()
    return asyncio.run(run())


def key_in(out: str) -> str:
    (key,) = [word for word in out.split() if word.startswith("sk-")]
    return key


def table(out: str) -> list[list[str]]:
    """The table's lines split into cells (cells here hold no spaces)."""
    lines = [line.split() for line in out.splitlines() if line.strip()]
    start = next(i for i, cells in enumerate(lines) if cells[:2] == ["ID", "NAME"])
    return lines[start:]


def test_create_list_set_and_rotate_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = sluice(
        capsys, "tenants", "create", "initech", "--name", "Initech", "--models", "sluice-tiny"
    )
    assert (code, err) == (0, "")
    first_key = key_in(out)
    assert "shown only now" in out and hash_key(first_key) not in out
    assert table(out)[:2] == [
        ["ID", "NAME", "WEIGHT", "TOKENS/MIN", "CONCURRENT", "MODELS", "CLASSES", "SAFETY", "KEYS"],
        ["initech", "Initech", "1", "100000", "16", "sluice-tiny", "batch,interactive", "default", "1"],
    ]
    assert resolve(first_key) == Tenant(
        "initech",
        "Initech",
        frozenset({"sluice-tiny"}),
        tokens_per_minute=100_000,
        max_concurrent_requests=16,
    )
    sluice(capsys, "tenants", "create", "hooli", "--name", "Hooli", "--tokens-per-minute", "unlimited")

    code, out, _ = sluice(capsys, "tenants", "list")
    assert code == 0
    assert table(out)[1:] == [
        ["hooli", "Hooli", "1", "unlimited", "16", "all", "batch,interactive", "default", "1"],
        ["initech", "Initech", "1", "100000", "16", "sluice-tiny", "batch,interactive", "default", "1"],
    ]

    code, out, _ = sluice(
        capsys,
        "tenants",
        "set",
        "initech",
        "--weight",
        "2.5",
        "--max-concurrent",
        "unlimited",
        "--classes",
        "batch",
        "--safety-policy",
        "strict",
    )
    assert code == 0 and "SLUICE_TENANT_CACHE_TTL_S" in out
    code, out, _ = sluice(capsys, "tenants", "list", "--json")
    assert code == 0
    assert json.loads(out)[1] == {
        "tenant_id": "initech",
        "name": "Initech",
        "weight": 2.5,
        "tokens_per_minute": 100000,  # not given to set: unchanged
        "max_concurrent_requests": None,
        "allowed_models": ["sluice-tiny"],
        "allowed_classes": ["batch"],
        "safety_policy": "strict",
        "num_active_keys": 1,
    }

    code, out, _ = sluice(capsys, "tenants", "rotate-key", "initech")
    new_key = key_in(out)
    assert code == 0 and "Revoked 1 previous key" in out and "SLUICE_TENANT_CACHE_TTL_S" in out
    assert resolve(first_key) is None
    assert resolve(new_key) is not None and resolve(new_key).weight == 2.5  # type: ignore[union-attr]

    code, out, _ = sluice(capsys, "tenants", "rotate-key", "initech", "--keep-old", "--json")
    report = json.loads(out)
    assert code == 0 and report["num_revoked_keys"] == 0 and report["num_active_keys"] == 2
    assert resolve(new_key) is not None and resolve(report["api_key"]) is not None


def test_create_json_has_the_defaults_and_the_key_but_never_its_hash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = sluice(capsys, "tenants", "create", "hooli", "--name", "Hooli Inc", "--json")
    report = json.loads(out)
    assert code == 0
    assert report["tenant"] == {
        "tenant_id": "hooli",
        "name": "Hooli Inc",
        "weight": 1.0,
        "tokens_per_minute": 100000,
        "max_concurrent_requests": 16,
        "allowed_models": [],
        "allowed_classes": ["batch", "interactive"],
        "safety_policy": "default",
        "num_active_keys": 1,
    }
    assert resolve(report["api_key"]) is not None
    assert hash_key(report["api_key"]) not in out and "shown only now" in report["note"]
    code, out, _ = sluice(capsys, "tenants", "set", "hooli", "--models", "a,b", "--json")
    assert code == 0 and json.loads(out)["allowed_models"] == ["a", "b"]
    code, out, _ = sluice(capsys, "tenants", "set", "hooli", "--models", "all", "--classes", "all", "--json")
    assert json.loads(out)["allowed_models"] == [] and json.loads(out)["allowed_classes"] == [
        "batch",
        "interactive",
    ]


def test_list_shows_the_dev_tenants_or_says_there_are_none(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = sluice(capsys, "tenants", "list")
    assert code == 0 and "No tenants yet" in out
    assert json.loads(sluice(capsys, "tenants", "list", "--json")[1]) == []
    monkeypatch.setenv("SLUICE_DEV_TENANTS", "true")
    code, out, _ = sluice(capsys, "tenants", "list")
    assert table(out)[1:] == [
        ["acme", "Acme", "1", "1000000", "64", "all", "batch,interactive", "default", "1"],
        ["globex", "Globex", "1", "1000000", "64", "all", "batch,interactive", "default", "1"],
    ]


@pytest.mark.parametrize(
    ("argv", "exit_code", "fragment"),
    [
        (["tenants", "set", "nope", "--weight", "2"], 1, "no tenant 'nope'"),
        (["tenants", "rotate-key", "nope"], 1, "no tenant 'nope'"),
        (["tenants", "create", "initech", "--name", "Again"], 1, "tenant 'initech' already exists"),
        (["tenants", "set", "initech"], 2, "give at least one of --name"),
        (["tenants", "set", "initech", "--weight", "0"], 2, "weight must be > 0 and <= 1000"),
        (["tenants", "set", "initech", "--weight", "heavy"], 2, "argument --weight: expected a number"),
        (["tenants", "create", "x", "--name", "X", "--weight", "1001"], 2, "weight must be > 0 and <= 1000"),
        (
            ["tenants", "create", "x", "--name", "X", "--tokens-per-minute", "0"],
            2,
            "must be >= 1 or 'unlimited'",
        ),
        (
            ["tenants", "create", "x", "--name", "X", "--max-concurrent", "many"],
            2,
            "a whole number or 'unlimited'",
        ),
        (["tenants", "create", "x", "--name", "X", "--classes", "realtime"], 2, "unknown class 'realtime'"),
        (["tenants", "create", "x", "--name", "X", "--models", ","], 2, "model names separated by commas"),
        (
            ["tenants", "set", "initech", "--safety-policy", "lax"],
            2,
            "unknown safety policy 'lax'; known: none, default, pii, strict",
        ),
        (["tenants", "create", "x"], 2, "the following arguments are required: --name"),
        (["tenants", "create", "Not-Valid", "--name", "X"], 2, "tenant_id must match"),
        (["tenants", "create", "x", "--name", " "], 2, "name must be a non-empty string"),
        (["tenants", "frobnicate"], 2, "invalid choice: 'frobnicate'"),
        (["tenants"], 2, "required: COMMAND"),
        ([], 2, "required: COMMAND"),
    ],
)
def test_errors_are_one_line_on_stderr_with_an_exit_code(
    capsys: pytest.CaptureFixture[str], argv: list[str], exit_code: int, fragment: str
) -> None:
    assert sluice(capsys, "tenants", "create", "initech", "--name", "Initech")[0] == 0
    code, out, err = sluice(capsys, *argv)
    assert code == exit_code
    assert out == "" and fragment in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_safety_policies_from_the_config_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "safety.json"
    config.write_text(json.dumps({"policies": {"pii-only": {"input": ["pii"], "output": ["pii"]}}}))
    monkeypatch.setenv("SLUICE_SAFETY_CONFIG_PATH", str(config))
    code, out, _ = sluice(capsys, "tenants", "create", "hooli", "--name", "H", "--safety-policy", "pii-only")
    assert code == 0 and resolve(key_in(out)).safety_policy == "pii-only"  # type: ignore[union-attr]
    config.write_text("{broken")
    code, _, err = sluice(capsys, "tenants", "set", "hooli", "--safety-policy", "none")
    assert code == 2 and "is not valid JSON" in err


def test_bad_settings_are_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_TENANT_CACHE_TTL", "5")
    code, out, err = sluice(capsys, "tenants", "list")
    assert (code, out) == (2, "") and "SLUICE_TENANT_CACHE_TTL" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("how", ["state dir is a file", "not a database"])
def test_a_store_that_cannot_be_opened_exits_1_naming_where(
    capsys: pytest.CaptureFixture[str], state_dir: Path, how: str
) -> None:
    """The CLI catches the store's own error only; each way of failing must arrive as that."""
    if how == "state dir is a file":
        state_dir.write_text("")  # its database cannot be made
    else:
        state_dir.mkdir()
        (state_dir / "sluice.db").write_bytes(b"not an SQLite file " * 512)
    code, out, err = sluice(capsys, "tenants", "list")
    assert (code, out) == (1, "") and "Traceback" not in err
    assert f"cannot open the tenant store at SQLite {state_dir}" in err
    assert len(err.strip().splitlines()) == 1


def test_a_store_lost_in_the_middle_of_a_command_exits_1_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened, then unavailable while the command runs (the server went away): one line, no traceback."""

    async def unavailable(self: SqliteTenantStore) -> list[Tenant]:
        raise TenantStoreUnavailable("the database went away")

    monkeypatch.setattr(SqliteTenantStore, "list", unavailable)
    code, out, err = sluice(capsys, "tenants", "list")
    assert (code, out) == (1, "") and "Traceback" not in err
    assert err.strip() == "sluice: error: the tenant store stopped answering: the database went away"


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = sluice(capsys, "tenants", "create", "--help")
    assert code == 0 and "--tokens-per-minute" in out and "(default: 100000)" in out


@pytest.fixture
def pg_database_url() -> Iterator[str]:
    """A PostgreSQL database made for this test and dropped after it; skips if the server is not there."""
    try:
        with created_database("sluice_test_cli") as url:
            yield url
    except PostgresUnreachable as exc:
        pytest.skip(str(exc))


def test_the_same_commands_against_postgresql(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pg_database_url: str, state_dir: Path
) -> None:
    monkeypatch.setenv("SLUICE_DATABASE_URL", pg_database_url)
    code, out, _ = sluice(capsys, "tenants", "create", "initech", "--name", "Initech", "--weight", "3")
    first_key = key_in(out)
    assert code == 0 and resolve(first_key) is not None
    assert sluice(capsys, "tenants", "set", "initech", "--tokens-per-minute", "500")[0] == 0
    code, out, _ = sluice(capsys, "tenants", "rotate-key", "initech")
    new_key = key_in(out)
    assert resolve(first_key) is None and resolve(new_key) is not None
    listed = json.loads(sluice(capsys, "tenants", "list", "--json")[1])
    assert [(t["tenant_id"], t["weight"], t["tokens_per_minute"], t["num_active_keys"]) for t in listed] == [
        ("initech", 3.0, 500, 1)
    ]
    assert not state_dir.exists()  # nothing went to SQLite
