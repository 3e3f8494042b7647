"""``sluice.artifacts``: an artifact URI as a local folder, for the local replicas and the gateways. Local
folders as they are; ``s3://`` artifacts from moto's S3 server on 127.0.0.1 (tests/s3_server.py), all of
them or only the tokenizer's files, a second time from the cache; what cannot be had, with the reason.
And the gateway's ``read_tokenizer`` over it (a manifest recording other weights is refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3_server import MotoS3, moto_s3, s3_bucket  # noqa: F401  (fixtures, found by name)

from gateway.routing.router import read_tokenizer
from sluice.artifacts import (
    ArtifactUnavailable,
    artifact_folder,
    artifact_manifest,
    is_tokenizer_file,
    local_artifact_dir,
)
from sluice.weight_store import WeightStore
from sluice.weights_digest import weights_digest


def never() -> WeightStore:
    raise AssertionError("a local folder needs no weight store")


@pytest.fixture
def store(moto_s3: MotoS3, tmp_path: Path) -> WeightStore:  # noqa: F811
    return WeightStore(moto_s3.client(), tmp_path / "cache", part_size_bytes=1 << 20, quiet=True)


@pytest.fixture
def uploaded(store: WeightStore, s3_bucket: str, dev_checkpoint: Path) -> str:  # noqa: F811
    uri = f"s3://{s3_bucket}/engines/sluice-tiny/1"
    store.upload_dir(dev_checkpoint, uri, {"weights_digest": weights_digest(dev_checkpoint)})
    return uri


def test_local_folders_are_used_as_they_are(dev_checkpoint: Path) -> None:
    assert local_artifact_dir(dev_checkpoint.as_uri()) == dev_checkpoint
    assert local_artifact_dir("file://localhost/models/a%20b") == Path("/models/a b")
    assert local_artifact_dir("/models/tiny") == Path("/models/tiny")
    for remote in ("s3://bucket/engines/m/1", "file://otherhost/models/tiny", "models/tiny", "https://x/y"):
        assert local_artifact_dir(remote) is None, remote
    local = artifact_folder(dev_checkpoint.as_uri(), never)
    assert (local.folder, local.fetched, local.num_downloaded_bytes) == (dev_checkpoint, None, 0)
    assert artifact_manifest(str(dev_checkpoint), never) is None


def test_an_s3_artifact_is_fetched_once_then_read_from_the_cache(
    store: WeightStore, uploaded: str, dev_checkpoint: Path
) -> None:
    first = artifact_folder(uploaded, lambda: store)
    assert weights_digest(first.folder) == weights_digest(dev_checkpoint)
    assert first.num_downloaded_files == 5 and first.num_downloaded_bytes > 28_000_000
    again = artifact_folder(uploaded, lambda: store)
    assert again.folder == first.folder and (again.num_downloaded_files, again.num_downloaded_bytes) == (0, 0)
    manifest = artifact_manifest(uploaded, lambda: store)
    assert manifest is not None and manifest.metadata["weights_digest"] == weights_digest(dev_checkpoint)


def test_only_the_tokenizer_files_when_asked(
    moto_s3: MotoS3,  # noqa: F811
    uploaded: str,
    dev_checkpoint: Path,
    tmp_path: Path,
) -> None:
    gateway_store = WeightStore(moto_s3.client(), tmp_path / "gateway-cache", quiet=True)
    tokenizer = artifact_folder(uploaded, lambda: gateway_store, include=is_tokenizer_file)
    names = sorted(p.name for p in tokenizer.folder.iterdir())
    assert names == ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    assert tokenizer.num_downloaded_bytes < 1_000_000  # not the 28 MB of weights
    assert not is_tokenizer_file("model.safetensors") and not is_tokenizer_file("sub/tokenizer.json")
    codec = read_tokenizer(uploaded, weights_digest(dev_checkpoint), lambda: gateway_store)
    assert codec.vocab_size > 0


def test_a_manifest_recording_other_weights_is_refused_by_the_gateway(
    store: WeightStore, uploaded: str
) -> None:
    with pytest.raises(ValueError, match="records weights sha256:"):
        read_tokenizer(uploaded, "sha256:" + "0" * 64, lambda: store)


def test_what_cannot_be_had_says_which_and_why(store: WeightStore, s3_bucket: str) -> None:  # noqa: F811
    missing = f"s3://{s3_bucket}/engines/nothing/1"
    with pytest.raises(ArtifactUnavailable, match=f"artifact {missing} not fetched: .*manifest"):
        artifact_folder(missing, lambda: store)
    with pytest.raises(ArtifactUnavailable, match=f"artifact {missing} unreadable"):
        artifact_manifest(missing, lambda: store)
    for uri in ("https://example.com/weights", "gs://bucket/weights", "relative/folder"):
        with pytest.raises(ArtifactUnavailable, match="neither a local folder"):
            artifact_folder(uri, never)
    with pytest.raises(ArtifactUnavailable, match="not a valid S3 bucket"):
        artifact_folder("s3://No_Such/bucket", lambda: store)
