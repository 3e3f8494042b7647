"""``sluice replicas`` against a running control plane (``python -m control_plane.service``, a fresh
SQLite state, the dev admin token): start a local replica and wait until it is ready and verified, list
it (table and JSON), drain and stop it (no process left); register and remove one started elsewhere; and
the exit codes: 1 for what the service refuses or an unreachable service, 2 for usage."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_plane_process import running_control_plane
from proc_table import processes_mentioning

from control_plane.cli.main import main
from replicas.launcher import TritonServer
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.weights_digest import weights_digest

MODEL = "sluice-tiny"


@pytest.fixture
def service(clean_env: Path, dev_checkpoint: Path) -> Iterator[str]:
    """The control plane as a process, with ``sluice-tiny`` version 1 (the dev checkpoint) registered;
    its URL."""

    async def register() -> None:
        registry = SqliteRegistry(clean_env / "sluice.db")
        await registry.open()
        try:
            await registry.create_model(MODEL, actor="test")
            digest = weights_digest(dev_checkpoint)
            await registry.add_version(
                MODEL, "1", artifact_uri=dev_checkpoint.as_uri(), weights_digest=digest, build_config={},
                actor="test",
            )  # fmt: skip
        finally:
            await registry.close()

    clean_env.mkdir(parents=True)
    asyncio.run(register())
    with running_control_plane(clean_env) as running:
        yield running.url
    assert processes_mentioning(str(clean_env / "replicas")) == [], "its replicas stop with the service"


def sluice(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str, str]:
    code = main(["replicas", *argv, "--admin-url", url, "--token", DEV_ADMIN_TOKEN])
    out, err = capsys.readouterr()
    return code, out, err


def test_start_list_drain_stop(
    service: str, clean_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = sluice(capsys, service, "list")
    assert code == 0 and "No replicas registered" in out

    code, out, err = sluice(capsys, service, "start", MODEL, "1", "--json")
    assert code == 0, err
    (started,) = json.loads(out)["replicas"]
    replica_id = started["replica_id"]
    assert started["state"] == "ready" and started["local"] is True and started["health_detail"] == ""
    assert started["metrics_url"].startswith("http://127.0.0.1:")  # its own Triton's metrics
    folder = clean_env / "replicas" / replica_id
    assert processes_mentioning(str(folder))

    monkeypatch.setenv("COLUMNS", "80")  # the metrics URL does not fit
    code, out, _ = sluice(capsys, service, "list")
    header, row = out.splitlines()
    assert header.split()[:6] == ["REPLICA", "MODEL", "VERSION", "STATE", "ENDPOINT", "LOCAL"]
    assert row.split()[:4] == [replica_id, MODEL, "1", "ready"] and "yes" in row.split()
    monkeypatch.setenv("COLUMNS", "400")  # it fits
    header, row = sluice(capsys, service, "list")[1].splitlines()
    assert header.split()[4:7] == ["ENDPOINT", "METRICS", "LOCAL"]
    assert row.split()[4:6] == [started["endpoint"], started["metrics_url"]]

    code, out, _ = sluice(capsys, service, "drain", replica_id)
    assert code == 0 and f"Replica {replica_id} is draining" in out
    code, out, _ = sluice(capsys, service, "list", "--model", MODEL, "--json")
    assert [r["state"] for r in json.loads(out)["replicas"]] == ["draining"]

    code, out, err = sluice(capsys, service, "stop", replica_id, "--timeout-s", "5")
    assert code == 0, err
    assert f"Replica {replica_id} stopped after" in out and "removed from the registry" in out
    assert processes_mentioning(str(folder)) == []
    assert json.loads(sluice(capsys, service, "list", "--json")[1]) == {"replicas": []}


def test_an_external_replica_and_the_exit_codes(
    service: str, replica: TritonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = sluice(
        capsys, service, "register", "ext-1", MODEL, "1", "--endpoint", replica.grpc_url,
        "--metrics-url", replica.metrics_url,
    )  # fmt: skip
    assert code == 0, err
    assert "ext-1" in out and " ready " in out
    (listed,) = json.loads(sluice(capsys, service, "list", "--json")[1])["replicas"]
    assert (listed["replica_id"], listed["metrics_url"]) == ("ext-1", replica.metrics_url)
    code, _, err = sluice(capsys, service, "stop", "ext-1")
    assert code == 1 and "409 replica_conflict" in err and "not started by this control plane" in err
    assert sluice(capsys, service, "remove", "ext-1")[0] == 0

    code, _, err = sluice(capsys, service, "start", MODEL, "v1")
    assert code == 1 and "positive integers" in err  # the service refuses it (400)
    code, _, err = sluice(capsys, service, "drain", "nope")
    assert code == 1 and "404 not_found" in err
    code, _, err = sluice(capsys, service, "start", MODEL, "1", "--count", "0")
    assert code == 2 and "count of 1 to 8" in err
    code, _, err = sluice(capsys, "http://127.0.0.1:1", "list")
    assert code == 1 and "unreachable" in err
    code = main(["replicas", "start", MODEL, "1", "--admin-url", service, "--token", "sladm-" + "x" * 32])
    assert code == 1 and "401 invalid_admin_token" in capsys.readouterr().err
    assert json.loads(sluice(capsys, service, "list", "--json")[1]) == {"replicas": []}
