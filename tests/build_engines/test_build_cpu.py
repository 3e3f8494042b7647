"""``sluice build-engine --target cpu`` end to end: the dev checkpoint in moto's S3 -> the artifact and its
manifest under s3://BUCKET/engines/MODEL/VERSION -> the version staged in the control plane's registry
(a real process) with the checkpoint's weights digest; the replica-side render of the fetched artifact;
a re-run that does nothing; and the inputs refused with a clear message and exit code."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
import pytest
from build_service import ControlPlane

from build_engines.repository import render_for_replica
from control_plane.cli.main import main
from sluice.settings import get_settings
from sluice.weight_store import ManifestNotFoundError, WeightStore
from sluice.weights_digest import weights_digest


def sluice(capsys: pytest.CaptureFixture[str], cp: ControlPlane, *argv: str) -> tuple[int, str, str]:
    get_settings.cache_clear()
    code = main([*argv, "--admin-url", cp.url, "--token", cp.token])
    out, err = capsys.readouterr()
    return code, out, err


def new_model(capsys: pytest.CaptureFixture[str], cp: ControlPlane) -> str:
    model = f"tiny-{uuid.uuid4().hex[:8]}"
    assert sluice(capsys, cp, "models", "create", model)[0] == 0
    return model


def versions(cp: ControlPlane, model: str) -> dict[str, dict[str, object]]:
    answer = httpx.get(
        f"{cp.url}/admin/v1/models/{model}/versions", headers={"Authorization": f"Bearer {cp.token}"}
    )
    answer.raise_for_status()
    return {v["version"]: v for v in answer.json()["versions"]}


def test_cpu_build_uploads_the_artifact_and_stages_the_version_then_a_rerun_does_nothing(
    capsys: pytest.CaptureFixture[str],
    control_plane: ControlPlane,
    source_uri: str,
    dev_checkpoint: Path,
    tmp_path: Path,
) -> None:
    model = new_model(capsys, control_plane)
    argv = ("build-engine", "--source", source_uri, "--model", model, "--version", "2", "--target", "cpu")
    code, out, err = sluice(capsys, control_plane, *argv)
    assert code == 0 and err == "", (out, err)
    progress = [line for line in out.splitlines() if re.match(r"\[\d/5\] ", line)]
    assert [line.split(":")[0] for line in progress] == [
        "[1/5] fetch",
        "[2/5] check",
        "[3/5] render",
        "[4/5] upload",
        "[5/5] register",
    ]
    digest = weights_digest(dev_checkpoint)
    bucket = source_uri.split("/")[2]
    dest = f"s3://{bucket}/engines/{model}/2"
    assert f"Built {model}@2 (cpu): {dest}" in out

    store = WeightStore.from_settings(get_settings(), quiet=True)
    manifest = store.read_manifest(dest)
    source = store.read_manifest(source_uri)
    assert sorted(e.path for e in manifest.files) == sorted(p.name for p in dev_checkpoint.iterdir())
    meta = manifest.metadata
    assert meta["target"] == "cpu" and meta["weights_digest"] == digest
    assert meta["source_digest"] == source.artifact_digest and meta["source_uri"] == source_uri
    assert meta["build_config"] == {"target": "cpu", "dtype": "auto"}
    assert set(meta["tool_versions"]) == {"sluice"}

    version = versions(control_plane, model)["2"]
    assert version["state"] == "staged" and version["weights_digest"] == digest
    assert version["artifact_uri"] == dest
    build_config = version["build_config"]
    assert isinstance(build_config, dict)
    assert build_config["target"] == "cpu" and build_config["source_digest"] == source.artifact_digest

    # What a replica does at start: fetch the artifact, render its repository from it.
    artifact = store.fetch(dest)
    model_dir = render_for_replica(
        artifact, tmp_path / "repo", model, "2", build_config, expected_digest=digest
    )
    config = (model_dir / "config.pbtxt").read_text()
    assert f'string_value: "{digest}"' in config and "versions: [ 2 ]" in config
    assert (model_dir / "2" / "model.py").is_file()

    code, out, err = sluice(capsys, control_plane, *argv)
    assert code == 0 and err == "", (out, err)
    assert "Nothing to build" in out and "Nothing to register" in out and "[4/5] upload" not in out
    assert store.read_manifest(dest) == manifest

    # The same version with other inputs never replaces the artifact.
    code, out, err = sluice(capsys, control_plane, *argv, "--dtype", "float32")
    assert code == 1 and "already holds an artifact built from other inputs (requested differ)" in err


def test_a_rerun_after_an_upload_whose_registration_failed_registers_it(
    capsys: pytest.CaptureFixture[str], control_plane: ControlPlane, source_uri: str
) -> None:
    model = new_model(capsys, control_plane)
    argv = ("build-engine", "--source", source_uri, "--model", model, "--version", "7", "--target", "cpu")
    assert sluice(capsys, control_plane, *argv)[0] == 0
    # Same inputs, another version number at the same artifact place: uploaded, never registered.
    dest = f"s3://{source_uri.split('/')[2]}/engines/{model}/7"
    rerun = ("build-engine", "--source", source_uri, "--model", model, "--version", "8", "--target", "cpu")
    code, out, err = sluice(capsys, control_plane, *rerun, "--dest", dest)
    assert code == 0 and err == "", (out, err)
    assert "Nothing to build" in out and "Registered" in out
    assert versions(control_plane, model)["8"]["artifact_uri"] == dest


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--target", "tpu"), 2, "argument --target: invalid choice: 'tpu'"),
        (("--target", "cpu", "--source", "http://x/y"), 2, "--source: a weight store location reads s3://"),
        (("--target", "cpu", "--source", "s3://bucket"), 2, "names a bucket but no prefix"),
        (("--target", "cpu", "--version", "v2"), 2, "version must be a positive integer"),
        (("--target", "cpu", "--tp", "2"), 2, "--tp: for the trtllm targets only"),
        (("--target", "trtllm-llmapi", "--quantization", "fp8"), 2, "is for the trtllm target"),
        (("--target", "trtllm", "--max-input-len", "9000", "--max-seq-len", "8192"), 2, "must not exceed"),
    ],
)
def test_bad_inputs_are_refused_before_anything(
    capsys: pytest.CaptureFixture[str],
    control_plane: ControlPlane,
    build_env: Path,
    args: tuple[str, ...],
    code: int,
    message: str,
) -> None:
    base = {"--source": "s3://weights/checkpoints/x", "--model": "m", "--version": "1"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = [part for pair in base.items() for part in pair]
    got, out, err = sluice(capsys, control_plane, "build-engine", *argv)
    assert (got, out) == (code, ""), err
    assert message in err and "Traceback" not in err


def test_a_missing_source_or_an_unknown_model_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], control_plane: ControlPlane, source_uri: str
) -> None:
    model = new_model(capsys, control_plane)
    missing = source_uri.replace("sluice-tiny", "nothing-here")
    code, _, err = sluice(
        capsys,
        control_plane,
        "build-engine",
        "--source",
        missing,
        "--model",
        model,
        "--version",
        "1",
        "--target",
        "cpu",
    )
    assert code == 1 and "manifest" in err and "nothing-here" in err, err
    argv = ("--source", source_uri, "--model", "no-such-model", "--version", "1", "--target", "cpu")
    code, _, err = sluice(capsys, control_plane, "build-engine", *argv)
    assert code == 2 and "`sluice models create no-such-model` first" in err, err


def test_a_version_already_registered_is_refused_before_building(
    capsys: pytest.CaptureFixture[str], control_plane: ControlPlane, source_uri: str
) -> None:
    model = new_model(capsys, control_plane)
    digest = "sha256:" + "ab" * 32
    added = sluice(
        capsys,
        control_plane,
        "versions",
        "add",
        model,
        "5",
        "--artifact-uri",
        "s3://x/y",
        "--weights-digest",
        digest,
    )
    assert added[0] == 0, added
    argv = ("--source", source_uri, "--model", model, "--version", "5", "--target", "cpu")
    code, out, err = sluice(capsys, control_plane, "build-engine", *argv)
    assert code == 1 and f"{model}@5 is already in the registry" in err, (out, err)
    assert "fetch" not in out
    store = WeightStore.from_settings(get_settings(), quiet=True)
    with pytest.raises(ManifestNotFoundError):
        store.read_manifest(f"s3://{source_uri.split('/')[2]}/engines/{model}/5")
