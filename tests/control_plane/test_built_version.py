"""A built version served end to end, from S3 to the openai client: the dev checkpoint uploaded to moto's
S3 server (tests/s3_server.py: moto, an S3 implementation on 127.0.0.1, not AWS) as a build's source,
``sluice build-engine --target cpu`` uploading the artifact and staging the version in the control plane
(a real process), ``sluice replicas start MODEL VERSION`` pulling the artifact into the node's weight
cache and starting a real tritonserver from it (its cold start printed by phase), the version routed,
and a gateway routing by the registry, which reads the version's tokenizer from S3 (only the tokenizer's
files, into its own cache), serving it through the official openai client; a version whose artifact was
never uploaded is not routed, and the gateway's /readyz says why. Two replicas started at once share
the download (each file fetched once between them); a third one on the same node downloads nothing: the
cache has every file (the weight store's own count, as the start reports it).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from control_plane_process import RunningControlPlane, running_control_plane
from s3_server import MotoS3, moto_s3  # noqa: F401  (a fixture, found by name)

from control_plane.cli.main import main
from sluice.settings import get_settings
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.weight_store import WeightStore

# NOTE: the gateway harness lives beside the gateway's tests; pytest puts that folder on sys.path only
# when it collects them, so a run of this folder alone adds it here.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from harness import MODEL, start_gateway, wait_until

NUM_CHECKPOINT_FILES = 5  # the dev checkpoint: config, generation config, weights, tokenizer, its config


# The control plane's machine: its admin URL, state folder (its weight cache under it) and log.
Node = RunningControlPlane


@pytest.fixture
def node(
    clean_env: Path,
    moto_s3: MotoS3,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Node]:
    """The control plane as a process over a registry holding the model (no version yet), its weight
    store on moto; the CLI in this process reaches both (the build caches what it fetches elsewhere)."""
    clean_env.mkdir(parents=True)

    async def seed() -> None:
        registry = SqliteRegistry(clean_env / "sluice.db")
        await registry.open()
        try:
            await registry.create_model(MODEL, actor="test")
        finally:
            await registry.close()

    asyncio.run(seed())
    monkeypatch.setenv("SLUICE_S3_ENDPOINT_URL", moto_s3.endpoint_url)  # the CLI's build, in this process
    monkeypatch.setenv("SLUICE_WEIGHT_CACHE_DIR", str(tmp_path / "build-cache"))
    with running_control_plane(clean_env, **moto_s3.env()) as running:
        yield running


def sluice(capsys: pytest.CaptureFixture[str], node: Node, *argv: str, code: int = 0) -> str:
    """Run ``sluice *argv`` against the node's control plane; its output (and exit ``code``)."""
    get_settings.cache_clear()
    exited = main([*argv, "--admin-url", node.url, "--token", DEV_ADMIN_TOKEN])
    out, err = capsys.readouterr()
    assert exited == code, (argv, out, err, node.log_path.read_text()[-3000:])
    return out + err


def start_replicas(capsys: pytest.CaptureFixture[str], node: Node, count: int) -> list[dict[str, Any]]:
    """``sluice replicas start MODEL 1 --count N``: the started replicas' rows, once ready."""
    out = sluice(capsys, node, "replicas", "start", MODEL, "1", "--count", str(count), "--json")
    replicas: list[dict[str, Any]] = json.loads(out)["replicas"]
    for replica in replicas:
        assert replica["state"] == "ready" and replica["local"] is True, replica
        cold = replica["cold_start"]
        assert cold["phase"] == "ready", replica
        assert all(cold[phase] > 0 for phase in ("download_s", "load_s", "first_token_s")), cold
        # Its files were checked against the manifest as they arrived, which records the version's digest.
        assert cold["verify_s"] >= 0 and cold["verified_by"] == "manifest", cold
    return replicas


def test_a_built_version_is_pulled_started_routed_and_served(
    capsys: pytest.CaptureFixture[str],
    node: Node,
    moto_s3: MotoS3,  # noqa: F811
    dev_checkpoint: Path,
    tmp_path: Path,
) -> None:
    bucket = moto_s3.create_bucket()
    source = f"s3://{bucket}/checkpoints/{MODEL}"
    WeightStore(moto_s3.client(), tmp_path / "uploader-cache", quiet=True).upload_dir(dev_checkpoint, source)
    out = sluice(capsys, node, "build-engine", "--source", source, "--model", MODEL, "--version", "1",
                 "--target", "cpu")  # fmt: skip
    artifact = f"s3://{bucket}/engines/{MODEL}/1"
    assert f"Built {MODEL}@1 (cpu): {artifact}" in out
    (version,) = json.loads(sluice(capsys, node, "versions", "list", MODEL, "--json"))["versions"]
    assert (version["state"], version["artifact_uri"]) == ("staged", artifact)

    # The first two replicas of the version on this node, started at once: between them every file is
    # downloaded into the node's cache exactly once (they share the work).
    first = start_replicas(capsys, node, count=2)
    colds = [replica["cold_start"] for replica in first]
    assert {cold["artifact_uri"] for cold in colds} == {artifact}
    assert sum(cold["num_downloaded_files"] for cold in colds) == NUM_CHECKPOINT_FILES
    checkpoint_bytes = sum(f.stat().st_size for f in dev_checkpoint.iterdir())
    assert sum(cold["num_downloaded_bytes"] for cold in colds) == checkpoint_bytes
    cache = node.state_dir / "weight-cache"
    assert sum(1 for p in cache.rglob("model.safetensors")) >= 1
    log = node.log_path.read_text()
    for replica in first:
        assert re.search(rf"replica {replica['replica_id']} ready .*cold start: download [0-9.]+ s \(", log)

    sluice(capsys, node, "versions", "set-state", MODEL, "1", "warming")
    sluice(capsys, node, "versions", "set-state", MODEL, "1", "serving")
    # Version 2 names an artifact that was never uploaded: in the route at 0%, never routed.
    missing = f"s3://{bucket}/engines/{MODEL}/2"
    sluice(capsys, node, "versions", "add", MODEL, "2", "--artifact-uri", missing,
           "--weights-digest", version["weights_digest"])  # fmt: skip
    sluice(capsys, node, "routes", "set", MODEL, "1=100", "2=0")

    # A gateway on another node (its own weight cache): it fetches the tokenizer's files, not the weights.
    gateway_cache = tmp_path / "gateway-cache"
    gateway = start_gateway(
        node.state_dir, dev_checkpoint, engine_client="triton", routing="registry",
        registry_poll_interval_s=0.5, s3_endpoint_url=moto_s3.endpoint_url, weight_cache_dir=gateway_cache,
    )  # fmt: skip
    try:
        wait_until(lambda: gateway.gw.router.pools.num_in_rotation == 2, 20.0, "the replicas in rotation")
        stream = gateway.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = list(stream)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[0].system_fingerprint == f"{MODEL}:1"
        ready = httpx.get(f"{gateway.base_url}/readyz").json()
        assert ready["status"] == "ready" and list(ready["unroutable_versions"]) == [f"{MODEL} 2"], ready
        assert f"tokenizer of {missing} unreadable" in ready["unroutable_versions"][f"{MODEL} 2"], ready
        (view,) = [p.parent for p in gateway_cache.rglob("tokenizer.json")]
        assert not (view / "model.safetensors").exists()
        cached_bytes = sum(p.stat().st_size for p in gateway_cache.rglob("*") if p.is_file())
        assert cached_bytes < 1_000_000  # the tokenizer's files (links counted twice), not 28 MB of weights
    finally:
        gateway.stop()

    # A third replica on the same node: the cache holds every file, nothing is downloaded.
    out = sluice(capsys, node, "replicas", "start", MODEL, "1")
    second = re.search(r"Cold start of (\S+): download [0-9.]+ s \(0\.0 MB in 0 files\), verify .* load", out)
    assert second is not None, out
    (listed,) = [
        r
        for r in json.loads(sluice(capsys, node, "replicas", "list", "--json"))["replicas"]
        if r["replica_id"] == second.group(1)
    ]
    assert listed["cold_start"]["num_downloaded_bytes"] == 0 and listed["state"] == "ready"

    # An artifact whose manifest records no weights digest is hashed once fetched: other weights than
    # the version's fail the replica before any tritonserver starts, saying why.
    sluice(capsys, node, "versions", "add", MODEL, "3", "--artifact-uri", source,
           "--weights-digest", "sha256:" + "0" * 64)  # fmt: skip
    out = sluice(capsys, node, "replicas", "start", MODEL, "3", code=1)
    assert f"{source} (fetched to " in out and f"but {MODEL} version 3 is sha256:000" in out, out
    # docs/operations.md, "Cold start": the figures (``pytest -s`` prints them).
    print("\n".join(line for line in node.log_path.read_text().splitlines() if "cold start:" in line))
