"""``python -m sluice.weight_store``: upload, manifest and fetch from the settings, against moto's S3
server, as an operator runs them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from s3_server import MotoS3
from weight_store_clients import RangedGetLog

from sluice.weight_store import WeightStore
from sluice.weight_store.__main__ import main


@pytest.fixture
def operator_env(moto_s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLUICE_S3_ENDPOINT_URL", moto_s3.endpoint_url)
    monkeypatch.setenv("SLUICE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SLUICE_WEIGHT_STORE_PART_SIZE_BYTES", str(64 * 1024))
    return tmp_path / "state" / "weight-cache"


def test_upload_manifest_and_fetch_from_the_command_line(
    operator_env: Path, s3_bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "model.bin").write_bytes(b"w" * 200_000)
    (src / "tokenizer.json").write_text("{}")
    uri = f"s3://{s3_bucket}/ckpt/1"

    assert main(["--quiet", "upload", str(src), uri, "--metadata", '{"by": "cli"}']) == 0
    digest = capsys.readouterr().out.strip()
    assert digest.startswith("sha256:")

    assert main(["manifest", uri]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["artifact_digest"] == digest and manifest["metadata"] == {"by": "cli"}

    assert main(["--quiet", "fetch", uri, "--include", "tokenizer*"]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert folder == operator_env / "artifacts" / digest.removeprefix("sha256:")
    assert sorted(p.name for p in folder.iterdir()) == ["tokenizer.json"]


def test_errors_exit_1_with_a_one_line_reason(
    operator_env: Path, s3_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, says in (
        (["manifest", f"s3://{s3_bucket}/nothing/here"], "no manifest there"),
        (["fetch", "s3://Bad/x"], "not a valid S3 bucket name"),
        (["upload", "/no/such/folder", f"s3://{s3_bucket}/x"], "no folder at"),
        (["upload", ".", f"s3://{s3_bucket}/x", "--metadata", "[1]"], "must be a JSON object"),
        (["upload", ".", f"s3://{s3_bucket}/x", "--metadata", "{"], "is not JSON"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code in (1, 2)
        assert says in capsys.readouterr().err


def test_two_processes_fetching_one_artifact_share_the_work_and_one_copy(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """Two replicas starting on one node: two processes, one cache, each object downloaded once."""
    src = tmp_path / "ckpt"
    src.mkdir()
    for i in range(4):
        (src / f"shard-{i}.bin").write_bytes(os.urandom(300_000))
    env = {
        **os.environ,
        **moto_s3.env(),
        "SLUICE_STATE_DIR": str(tmp_path / "state"),
        "SLUICE_WEIGHT_STORE_PART_SIZE_BYTES": str(64 * 1024),
    }
    uri = f"s3://{s3_bucket}/ckpt/1"
    command = [sys.executable, "-m", "sluice.weight_store", "--quiet"]
    subprocess.run([*command, "upload", str(src), uri], env=env, check=True, capture_output=True, timeout=60)

    fetches = [
        subprocess.Popen([*command, "fetch", uri], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in fetches]
    assert [p.returncode for p in fetches] == [0, 0], outputs
    folders = {Path(out.decode().strip()) for out, _ in outputs}
    assert len(folders) == 1
    (folder,) = folders
    assert sorted(p.read_bytes() for p in folder.iterdir()) == sorted(p.read_bytes() for p in src.iterdir())
    # Each process logs how many files it downloaded ("downloaded N of 4 files" or "nothing downloaded").
    downloaded = [re.search(r"downloaded (\d+) of 4 files", err.decode()) for _, err in outputs]
    assert sum(int(m.group(1)) for m in downloaded if m) == 4
    objects = [p for p in (tmp_path / "state" / "weight-cache" / "objects").rglob("*") if p.is_file()]
    assert len(objects) == 4
    assert not any((tmp_path / "state" / "weight-cache" / "partial").glob("*.part"))


def test_a_fetch_killed_midway_resumes_without_fetching_recorded_parts_again(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """A real kill (SIGKILL of the fetching process after 7 ranged GETs), then a fetch in this process."""
    part_bytes = 64 * 1024
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(10 * part_bytes + 5))  # 11 parts
    (src / "b.bin").write_bytes(os.urandom(4 * part_bytes))  # 4 parts
    cache = tmp_path / "cache"
    uri = f"s3://{s3_bucket}/ckpt/1"
    store = WeightStore(moto_s3.client(), cache, part_size_bytes=part_bytes, quiet=True)
    store.upload_dir(src, uri)

    child = Path(__file__).with_name("killed_fetch.py")
    argv = [sys.executable, str(child), moto_s3.endpoint_url, uri, str(cache), str(part_bytes), "7"]
    killed = subprocess.run(argv, env={**os.environ, **moto_s3.env()}, capture_output=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]

    # What the killed fetch left: finished parts in each resume record, and any file it published.
    recorded: set[tuple[str, int]] = set()
    manifest = store.read_manifest(uri)
    for entry in manifest.files:
        record = cache / "partial" / f"{entry.sha256}.parts"
        if record.exists():
            lines = record.read_text().split("\n")[1:-1]
            recorded |= {(entry.path, int(line)) for line in lines}
        elif (cache / "objects" / entry.sha256[:2] / entry.sha256).exists():
            recorded |= {(entry.path, i) for i in range(-(-entry.size_bytes // part_bytes))}
    assert 0 < len(recorded) <= 7

    log = RangedGetLog(store.client)
    assert sorted(p.read_bytes() for p in store.fetch(uri).iterdir()) == sorted(
        p.read_bytes() for p in src.iterdir()
    )
    fetched = {
        (key.removeprefix("ckpt/1/"), int(rng.split("=")[1].split("-")[0]) // part_bytes)
        for key, rng in log.ranged
    }
    assert not fetched & recorded  # no recorded part fetched again
    assert len(log.ranged) == 15 - len(recorded)
