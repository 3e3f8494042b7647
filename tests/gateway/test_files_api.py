"""OpenAI's Files API through a gateway, with the official ``openai`` client: upload (``files.create``),
retrieve, list (purpose filter, pages), download (``files.content``), delete; another tenant's id is 404;
a wrong purpose, an empty file, a name not ending ``.jsonl``, a non-UTF-8 file and a file over
``file_max_bytes`` are refused with 4xx (a file over the JSON body limit but within its own is accepted);
a store that cannot answer is 503 with Retry-After; and the same round trip with files in S3 (moto).

The gateways run the scripted fake engine: files reach no engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from expired_files import expire_now, stored_keys
from fakes import ScriptedFakeEngine
from harness import ACME_KEY, GLOBEX_KEY, RunningGateway, start_gateway
from s3_server import MotoS3, moto_s3  # noqa: F401  (pytest finds fixtures by name)

FILE_MAX_BYTES = 8192
MAX_BODY_BYTES = 1024  # JSON bodies: far under a file's limit
LINES = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n{"oops\n'


def start(state_dir: Path, checkpoint: Path, **overrides: object) -> RunningGateway:
    return start_gateway(
        state_dir,
        checkpoint,
        engine=ScriptedFakeEngine(token_id=5, interval_s=0.001),
        file_max_bytes=FILE_MAX_BYTES,
        max_body_bytes=MAX_BODY_BYTES,
        **overrides,
    )


@pytest.fixture(scope="module")
def gateway(dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start(tmp_path_factory.mktemp("gateway_files"), dev_checkpoint)
    yield running
    running.stop()


def error_of(exc: openai.APIStatusError) -> dict[str, object]:
    body = exc.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, object] = body["error"]
    return error


def test_upload_retrieve_list_download_and_delete(gateway: RunningGateway) -> None:
    client = gateway.client()
    created = client.files.create(file=("requests.jsonl", LINES), purpose="batch")
    assert created.id.startswith("file-") and created.object == "file"
    assert (created.bytes, created.filename, created.purpose, created.status) == (
        len(LINES),
        "requests.jsonl",
        "batch",
        "processed",
    )
    assert client.files.retrieve(created.id) == created
    assert client.files.content(created.id).read() == LINES  # malformed lines are the batch's business
    assert client.files.content(created.id).text == LINES.decode()
    assert created.id in [f.id for f in client.files.list()]
    deleted = client.files.delete(created.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "file", True)
    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError) as caught:
            call(created.id)
        assert error_of(caught.value)["code"] == "file_not_found"


def test_a_file_over_the_json_body_limit_but_within_its_own_is_accepted(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(b'{"x": 1}\n' * (FILE_MAX_BYTES // 9))  # ~8 KiB, 8x max_body_bytes
    created = gateway.client().files.create(file=path, purpose="batch")
    assert created.filename == "big.jsonl" and created.bytes == path.stat().st_size
    assert gateway.client().files.content(created.id).read() == path.read_bytes()


def test_another_tenant_gets_404_for_every_operation(gateway: RunningGateway) -> None:
    mine = gateway.client(ACME_KEY).files.create(file=("mine.jsonl", LINES), purpose="batch")
    theirs = gateway.client(GLOBEX_KEY)
    for call in (theirs.files.retrieve, theirs.files.content, theirs.files.delete):
        with pytest.raises(openai.NotFoundError):
            call(mine.id)
    assert mine.id not in [f.id for f in theirs.files.list()]
    assert gateway.client(ACME_KEY).files.retrieve(mine.id) == mine


def test_list_filters_by_purpose_and_pages_newest_first(dev_checkpoint: Path, tmp_path: Path) -> None:
    running = start(tmp_path, dev_checkpoint)  # its own store: the module's holds other tests' files
    try:
        client = running.client()
        ids = [client.files.create(file=(f"{i}.jsonl", LINES), purpose="batch").id for i in range(3)]
        first = client.files.list(limit=2)
        assert [f.id for f in first.data] == [ids[2], ids[1]] and first.has_more
        assert [f.id for f in client.files.list(limit=2)] == ids[::-1]  # the client follows `after`
        assert [f.id for f in client.files.list(order="asc")] == ids
        assert [f.id for f in client.files.list(purpose="batch_output")] == []
        with pytest.raises(openai.BadRequestError) as caught:
            client.files.list(limit=0)
        assert error_of(caught.value)["param"] == "limit"
    finally:
        running.stop()


@pytest.mark.parametrize(
    ("file", "purpose", "param", "message"),
    [
        (("a.jsonl", LINES), "fine-tune", "purpose", "'fine-tune' is not one of ['batch']"),
        (("a.jsonl", LINES), "batch_output", "purpose", "is not one of ['batch']"),
        (("a.jsonl", b""), "batch", "file", "empty"),
        (("a.txt", LINES), "batch", "file", "Must be .jsonl"),
        (LINES, "batch", "file", "Must be .jsonl"),  # bytes alone: the client names it "upload"
        (("a.jsonl", b'{"a": "\xff\xfe"}\n'), "batch", "file", "not UTF-8"),
        (("a.jsonl", b"x" * (FILE_MAX_BYTES + 1)), "batch", "file", f"maximum is {FILE_MAX_BYTES} bytes"),
    ],
)
def test_a_refused_upload_is_400_naming_the_field(
    gateway: RunningGateway, file: object, purpose: str, param: str, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client().files.create(file=file, purpose=purpose)  # type: ignore[arg-type]
    error = error_of(caught.value)
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert message in str(error["message"])


def test_expires_after_sets_expires_at(gateway: RunningGateway) -> None:
    client = gateway.client()
    created = client.files.create(
        file=("a.jsonl", LINES), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert created.expires_at == created.created_at + 3600
    assert client.files.retrieve(created.id).expires_at == created.expires_at
    assert [f.expires_at for f in client.files.list() if f.id == created.id] == [created.expires_at]
    longest = client.files.create(
        file=("b.jsonl", LINES), purpose="batch", expires_after={"anchor": "created_at", "seconds": 2592000}
    )
    assert longest.expires_at == longest.created_at + 2592000
    assert client.files.create(file=("c.jsonl", LINES), purpose="batch").expires_at is None


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"},
         "expires_after[anchor]", "'last_active_at' is not one of ['created_at']"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"},
         "expires_after[seconds]", "between 3600 (1 hour) and 2592000 (30 days), got 3599"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"},
         "expires_after[seconds]", "got 2592001"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "an hour"},
         "expires_after[seconds]", "must be an integer"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "-3600"},
         "expires_after[seconds]", "got -3600"),
        ({"expires_after[anchor]": "created_at"}, "expires_after[seconds]", "is required"),
        ({"expires_after[seconds]": "3600"}, "expires_after[anchor]", "is required"),
    ],
)  # fmt: skip
def test_a_bad_expires_after_is_400_naming_the_field(
    gateway: RunningGateway, fields: dict[str, str], param: str, message: str
) -> None:
    with gateway.http() as http:  # the form as the official client sends it (multipart fields)
        resp = http.post(
            "/v1/files",
            headers={"Authorization": f"Bearer {ACME_KEY}"},
            data={"purpose": "batch", **fields},
            files={"file": ("a.jsonl", LINES)},
        )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert message in error["message"]


def test_the_official_client_gets_the_same_400(gateway: RunningGateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client().files.create(
            file=("a.jsonl", LINES), purpose="batch", expires_after={"anchor": "created_at", "seconds": 60}
        )
    assert error_of(caught.value)["param"] == "expires_after[seconds]"


def test_an_expired_file_is_gone_for_every_read_before_the_sweep_deletes_it(gateway: RunningGateway) -> None:
    client = gateway.client()
    expiring = client.files.create(
        file=("a.jsonl", LINES), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    expire_now(gateway.state_dir, expiring.id)
    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError) as caught:
            call(expiring.id)
        assert error_of(caught.value)["code"] == "file_not_found"
    assert expiring.id not in [f.id for f in client.files.list()]
    with pytest.raises(openai.NotFoundError) as caught:
        client.batches.create(input_file_id=expiring.id, endpoint="/v1/completions", completion_window="24h")
    assert (error_of(caught.value)["code"], error_of(caught.value)["param"]) == (
        "file_not_found",
        "input_file_id",
    )
    assert f"files/acme/{expiring.id}.json" in stored_keys(gateway.state_dir)  # the sweep's to delete


def test_a_body_far_over_the_file_limit_is_413_unread(gateway: RunningGateway) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        gateway.client().files.create(file=("a.jsonl", b"x" * (200 * 1024)), purpose="batch")
    assert caught.value.status_code == 413
    error = error_of(caught.value)
    assert error["code"] == "file_too_large" and f"maximum is {FILE_MAX_BYTES} bytes" in str(error["message"])


def test_malformed_requests_are_4xx_in_openais_shape(gateway: RunningGateway) -> None:
    auth = {"Authorization": f"Bearer {ACME_KEY}"}
    with gateway.http() as http:
        for method, path, kwargs in [
            ("GET", "/v1/files/file-" + "0" * 24, {}),
            ("GET", "/v1/files/../../etc/passwd", {}),
            ("GET", "/v1/files/%2e%2e%2fglobex/content", {}),
            ("DELETE", "/v1/files/not-a-file-id", {}),
            ("POST", "/v1/files", {"json": {"purpose": "batch"}}),
            ("POST", "/v1/files", {"data": {"purpose": "batch"}}),  # no file part
            ("POST", "/v1/files", {"data": {"purpose": "batch", "file": "not a file part"}}),
            ("GET", "/v1/files?order=sideways", {}),
            ("GET", "/v1/files?after=file-" + "0" * 24, {}),
        ]:
            resp = http.request(method, path, headers=auth, **kwargs)  # type: ignore[arg-type]
            assert 400 <= resp.status_code < 500, (method, path, resp.status_code, resp.text)
            assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
        assert http.get("/v1/files").status_code == 401


def test_a_store_that_cannot_answer_is_503_with_retry_after(gateway: RunningGateway) -> None:
    files_dir = gateway.state_dir / "files"
    files_dir.rename(gateway.state_dir / "files-away")
    files_dir.write_bytes(b"a file where the store's folder should be")
    try:
        with pytest.raises(openai.InternalServerError) as caught:
            gateway.client().files.create(file=("a.jsonl", LINES), purpose="batch")
        assert caught.value.status_code == 503
        assert error_of(caught.value)["code"] == "file_store_unavailable"
        assert caught.value.response.headers["Retry-After"] == "5"
        with pytest.raises(openai.InternalServerError):
            gateway.client().files.list()
    finally:
        files_dir.unlink()
        (gateway.state_dir / "files-away").rename(files_dir)


def test_files_in_s3(dev_checkpoint: Path, tmp_path: Path, moto_s3: MotoS3) -> None:  # noqa: F811
    bucket = moto_s3.create_bucket()
    running = start(
        tmp_path, dev_checkpoint, files_url=f"s3://{bucket}/sluice", s3_endpoint_url=moto_s3.endpoint_url
    )
    try:
        client = running.client()
        created = client.files.create(file=("in.jsonl", LINES), purpose="batch")
        assert client.files.content(created.id).read() == LINES
        keys = [o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
        assert sorted(keys) == [
            f"sluice/files/acme/{created.id}",
            f"sluice/files/acme/{created.id}.json",
        ]
        with pytest.raises(openai.NotFoundError):
            running.client(GLOBEX_KEY).files.retrieve(created.id)
        client.files.delete(created.id)
        assert "Contents" not in moto_s3.client().list_objects_v2(Bucket=bucket)
        assert not (tmp_path / "files").exists()
    finally:
        running.stop()


def test_the_schema_declares_the_files_routes(gateway: RunningGateway) -> None:
    with httpx.Client(base_url=gateway.base_url) as http:
        schema = http.get("/schema/openapi.json").json()
    upload = schema["paths"]["/v1/files"]["post"]
    assert "multipart/form-data" in upload["requestBody"]["content"]
    assert {"400", "401", "413", "503"} <= set(upload["responses"])
    assert {"get", "delete"} <= set(schema["paths"]["/v1/files/{file_id}"])
    assert "/v1/files/{file_id}/content" in schema["paths"]
