"""Audit: no file, batch, input copy, part or result file of one tenant reaches another, whatever id is
crafted (path characters, ``..``, url-encoded slashes, very long ids, another tenant's real id), through
listing and its ``after=`` cursor too; and an error never tells a caller that another tenant's id exists
(its answer is the answer to an id nobody has, word for word but the id)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ACME_KEY, GLOBEX_KEY, MODEL, RunningGateway, start_gateway

from gateway.batches.results import result_file_id
from sluice.stores.files.base import check_key
from sluice.stores.files.catalog import FileCatalog, UnknownFileError
from sluice.stores.files.local import LocalObjectStore

ACME = {"Authorization": f"Bearer {ACME_KEY}"}
GLOBEX = {"Authorization": f"Bearer {GLOBEX_KEY}"}
NOBODYS_FILE = "file-" + "0" * 24
NOBODYS_BATCH = "batch_" + "0" * 32


@pytest.fixture(scope="module")
def gateway(dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start_gateway(
        tmp_path_factory.mktemp("audit_isolation"),
        dev_checkpoint,
        batch_lease_s=3.0,
        batch_poll_interval_s=0.2,
        batch_flush_interval_s=0.2,
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def globex_batch(gateway: RunningGateway) -> dict[str, Any]:
    """A finished batch of globex's (its input file kept): the ids an attacker on acme's key would aim at."""
    line = {"custom_id": "secret-1", "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": "Hello", "max_tokens": 4}}  # fmt: skip
    with gateway.http() as http:
        upload = http.post("/v1/files", headers=GLOBEX, data={"purpose": "batch"},
                           files={"file": ("in.jsonl", io.BytesIO(json.dumps(line).encode()))})  # fmt: skip
        assert upload.status_code == 200, upload.text
        file_id = upload.json()["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
        batch = http.post("/v1/batches", headers=GLOBEX, json=body).json()
        deadline = time.monotonic() + 60
        while batch["status"] not in {"completed", "failed", "cancelled", "expired"}:
            assert time.monotonic() < deadline, batch
            time.sleep(0.1)
            batch = http.get(f"/v1/batches/{batch['id']}", headers=GLOBEX).json()
    assert batch["status"] == "completed" and batch["output_file_id"], batch
    return {"file_id": file_id, **batch}


def same_but_the_id(theirs: httpx.Response, nobodys: httpx.Response, their_id: str, nobodys_id: str) -> None:
    """``theirs`` (another tenant's real id) reads exactly as ``nobodys`` (an id no tenant has)."""
    assert theirs.status_code == nobodys.status_code, (theirs.text, nobodys.text)
    assert theirs.text.replace(their_id, "<id>") == nobodys.text.replace(nobodys_id, "<id>")


def test_another_tenants_real_ids_read_as_ids_nobody_has(
    gateway: RunningGateway, globex_batch: dict[str, Any]
) -> None:
    with gateway.http() as http:
        for their_file in (globex_batch["file_id"], globex_batch["output_file_id"]):
            for suffix in ("", "/content"):
                theirs = http.get(f"/v1/files/{their_file}{suffix}", headers=ACME)
                nobodys = http.get(f"/v1/files/{NOBODYS_FILE}{suffix}", headers=ACME)
                assert theirs.status_code == 404
                same_but_the_id(theirs, nobodys, their_file, NOBODYS_FILE)
            theirs = http.delete(f"/v1/files/{their_file}", headers=ACME)
            same_but_the_id(theirs, http.delete(f"/v1/files/{NOBODYS_FILE}", headers=ACME), their_file,
                            NOBODYS_FILE)  # fmt: skip
        their_batch = globex_batch["id"]
        for method, path in (("GET", "/v1/batches/{}"), ("POST", "/v1/batches/{}/cancel")):
            theirs = http.request(method, path.format(their_batch), headers=ACME)
            nobodys = http.request(method, path.format(NOBODYS_BATCH), headers=ACME)
            assert theirs.status_code == 404
            same_but_the_id(theirs, nobodys, their_batch, NOBODYS_BATCH)
        # A batch on acme's key cannot name globex's file as its input either.
        create = {"endpoint": "/v1/completions", "completion_window": "24h"}
        theirs = http.post(
            "/v1/batches", headers=ACME, json={**create, "input_file_id": globex_batch["file_id"]}
        )
        nobodys = http.post("/v1/batches", headers=ACME, json={**create, "input_file_id": NOBODYS_FILE})
        assert theirs.status_code == 404
        same_but_the_id(theirs, nobodys, globex_batch["file_id"], NOBODYS_FILE)
    # Globex still has all of it: nothing above touched it.
    with gateway.http() as http:
        assert (
            http.get(f"/v1/files/{globex_batch['output_file_id']}/content", headers=GLOBEX).status_code == 200
        )
        assert http.get(f"/v1/batches/{globex_batch['id']}", headers=GLOBEX).json()["status"] == "completed"


def test_the_list_cursor_of_another_tenants_id_leaks_nothing(
    gateway: RunningGateway, globex_batch: dict[str, Any]
) -> None:
    with gateway.http() as http:
        for path, their_id, nobodys_id in (
            ("/v1/files", globex_batch["file_id"], NOBODYS_FILE),
            ("/v1/batches", globex_batch["id"], NOBODYS_BATCH),
        ):
            theirs = http.get(path, headers=ACME, params={"after": their_id})
            nobodys = http.get(path, headers=ACME, params={"after": nobodys_id})
            assert 400 <= theirs.status_code < 500
            same_but_the_id(theirs, nobodys, their_id, nobodys_id)
            listed = json.dumps(http.get(path, headers=ACME, params={"limit": 100}).json())
            assert their_id not in listed and "globex" not in listed


@pytest.mark.parametrize(
    "crafted",
    [
        "..%2F..%2Fglobex%2F{file}",
        "..%2Fglobex%2F{file}",
        "%2E%2E%2Fglobex%2F{file}",
        "{file}.json",
        "{file}%2F..%2F..%2Fglobex%2F{file}",
        "..%5C..%5Cglobex%5C{file}",
        "file-{hex}%00",
        "x" * 5000,
        "file-" + "a" * 2000,
    ],
)
def test_crafted_file_ids_reach_nothing(
    gateway: RunningGateway, globex_batch: dict[str, Any], crafted: str
) -> None:
    their_file = globex_batch["file_id"]
    path_id = crafted.format(file=their_file, hex=their_file.removeprefix("file-"))
    with gateway.http() as http:
        for method, suffix in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
            resp = http.request(method, f"/v1/files/{path_id}{suffix}", headers=ACME)
            assert resp.status_code in (400, 404), (path_id, resp.status_code, resp.text)
            assert len(resp.content) < 2000  # a very long id is not echoed back whole
            assert '"object"' not in resp.text  # an error, never a file object
        assert http.get(f"/v1/files/{their_file}", headers=GLOBEX).status_code == 200  # not deleted


@pytest.mark.parametrize(
    "crafted",
    ["..%2F{batch}", "{batch}%2F..%2F..", "{batch}'--", "{batch}%00", "%25", "b" * 5000],
)
def test_crafted_batch_ids_reach_nothing(
    gateway: RunningGateway, globex_batch: dict[str, Any], crafted: str
) -> None:
    path_id = crafted.format(batch=globex_batch["id"])
    with gateway.http() as http:
        for method, suffix in (("GET", ""), ("POST", "/cancel")):
            resp = http.request(method, f"/v1/batches/{path_id}{suffix}", headers=ACME)
            assert resp.status_code in (400, 404), (path_id, resp.status_code, resp.text)
            assert len(resp.content) < 2000
        listed = http.get("/v1/batches", headers=ACME, params={"after": path_id.replace("%", "")})
        assert listed.status_code in (400, 404)
        assert http.get(f"/v1/batches/{globex_batch['id']}", headers=GLOBEX).json()["status"] == "completed"


def test_the_result_file_ids_are_the_batch_tenants_alone(
    gateway: RunningGateway, globex_batch: dict[str, Any]
) -> None:
    """A result file's id is computed from the batch id (``result_file_id``), so anyone who knows a batch
    id knows its result files' ids: the tenant's folder is what keeps them its own."""
    output_id = result_file_id(globex_batch["id"], "output")
    assert output_id == globex_batch["output_file_id"]
    with gateway.http() as http:
        assert http.get(f"/v1/files/{output_id}/content", headers=ACME).status_code == 404
        assert http.get(f"/v1/files/{output_id}/content", headers=GLOBEX).status_code == 200


@pytest.mark.anyio
async def test_the_catalog_keys_every_read_by_the_callers_tenant(tmp_path: Path) -> None:
    """Under the API: whatever the id, the catalog reads only ``files/<caller>/file-<hex>`` keys, and the
    store refuses a key that climbs out of its folder before any I/O."""
    catalog = FileCatalog(LocalObjectStore(tmp_path))
    theirs = await catalog.create("globex", "in.jsonl", "batch", b'{"a": 1}\n')
    for crafted in (
        theirs.file_id + "/../../globex/" + theirs.file_id,
        f"../globex/{theirs.file_id}",
        f"{theirs.file_id}.json",
        theirs.file_id.upper(),
        theirs.file_id + "\n",
    ):
        with pytest.raises(UnknownFileError):
            await catalog.get("acme", crafted)
        with pytest.raises(UnknownFileError):
            await catalog.content("acme", crafted)
    with pytest.raises(UnknownFileError):
        await catalog.get("acme", theirs.file_id)
    with pytest.raises(ValueError):
        await catalog.get("../globex", theirs.file_id)  # a tenant id is checked too
    for key in (f"files/acme/../globex/{theirs.file_id}", "/etc/passwd", "files//x", "a" * 600):
        with pytest.raises(ValueError):
            check_key(key)
    assert [f.file_id for f in await catalog.list("acme")] == []
    assert (await catalog.content("globex", theirs.file_id)) == b'{"a": 1}\n'


def test_tenants_files_on_disk_are_the_gateways_user_alone(
    gateway: RunningGateway, globex_batch: dict[str, Any]
) -> None:
    """The embedded store's objects (uploads, input copies, parts, result files) are written through a
    temporary file of mode 0600 renamed into place: another local user reads no tenant's text."""
    objects = [p for p in (gateway.state_dir / "files").rglob("*") if p.is_file()]
    assert any(globex_batch["output_file_id"] in p.name for p in objects)
    for path in objects:
        assert path.stat().st_mode & 0o077 == 0, f"{path} is {oct(path.stat().st_mode)}"
