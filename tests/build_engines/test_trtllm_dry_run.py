"""The TensorRT-LLM targets on a machine without a GPU: ``--dry-run`` prints the exact commands and the
rendered configurations (every placeholder filled, the backend's parameter values), and a real run
stops before doing anything, saying why. The source is the dev checkpoint in moto's S3."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from build_engines.repository import TRTLLM_DIR, render_llmapi, render_trtllm
from build_engines.trtllm_release import TRTLLM_VERSION
from control_plane.cli.main import main
from replicas.render import fill_template
from sluice.settings import get_settings
from sluice.weight_store import ManifestNotFoundError, WeightStore

EXAMPLES = "/opt/trtllm/examples"
UNREACHABLE_ADMIN = "http://127.0.0.1:9"  # a real run that called the registry would fail on it


def build(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    get_settings.cache_clear()
    code = main(["build-engine", *argv, "--trtllm-examples", EXAMPLES, "--admin-url", UNREACHABLE_ADMIN])
    out, err = capsys.readouterr()
    return code, out, err


def commands(out: str) -> list[list[str]]:
    return [
        shlex.split(line.split("$ ", 1)[1]) for line in out.splitlines() if line.lstrip().startswith("$ ")
    ]


def rendered(out: str) -> dict[str, str]:
    """The ``--- path ---`` sections the plan prints after its steps."""
    parts = re.split(r"^--- (\S+) ---$", out, flags=re.M)
    return {parts[i]: parts[i + 1].split("\nDry run:")[0] for i in range(1, len(parts), 2)}


def parameters(pbtxt: str) -> dict[str, str]:
    return dict(re.findall(r'key: "([^"]+)" value: \{ string_value: "([^"]*)" \}', pbtxt))


def test_trtllm_dry_run_prints_the_engine_build_commands_and_a_filled_config(
    capsys: pytest.CaptureFixture[str], source_uri: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    code, out, err = build(
        capsys,
        *("--source", source_uri, "--model", "tiny", "--version", "3", "--target", "trtllm"),
        *("--tp", "2", "--max-batch-size", "32", "--max-num-tokens", "4096"),
        *("--max-input-len", "1024", "--max-seq-len", "2048", "--work-dir", str(work), "--dry-run"),
    )
    assert code == 0 and err == "", (out, err)
    assert out.startswith("[1/8] fetch: ")
    steps = re.findall(r"^  (\d)\. (\w+):", out, flags=re.M)
    assert [name for _, name in steps] == [
        "fetch",
        "check",
        "convert",
        "build",
        "stage",
        "render",
        "upload",
        "register",
    ]
    assert [int(n) for n, _ in steps] == list(range(1, 9))
    convert, build_cmd = commands(out)
    source_dir = convert[convert.index("--model_dir") + 1]
    assert convert == [
        sys.executable,
        f"{EXAMPLES}/models/core/llama/convert_checkpoint.py",
        *("--model_dir", source_dir, "--output_dir", f"{work}/trtllm_checkpoint"),
        # auto: the dev checkpoint is float32, made float16 as convert_checkpoint.py's own auto does
        *("--dtype", "float16", "--tp_size", "2", "--pp_size", "1"),
    ]
    assert build_cmd == [
        "trtllm-build",
        *("--checkpoint_dir", f"{work}/trtllm_checkpoint", "--output_dir", f"{work}/artifact/engine"),
        *("--gemm_plugin", "auto", "--kv_cache_type", "paged", "--use_paged_context_fmha", "enable"),
        *("--max_batch_size", "32", "--max_num_tokens", "4096", "--max_input_len", "1024"),
        *("--max_seq_len", "2048", "--workers", "2"),
    ]
    files = rendered(out)
    assert list(files) == ["tiny/config.pbtxt"]
    config = files["tiny/config.pbtxt"]
    assert "${" not in config
    assert 'backend: "tensorrtllm"' in config and "max_batch_size: 32" in config
    assert "decoupled: true" in config and "versions: [ 3 ]" in config
    assert "default_queue_policy: { max_queue_size: 0 }" in config
    params = parameters(config)
    assert params["gpt_model_path"] == f"{work}/artifact/engine"
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert params["enable_kv_cache_reuse"] == "false" and params["enable_chunked_context"] == "true"
    assert params["exclude_input_in_output"] == "true" and params["cancellation_check_period_ms"] == "100"
    assert params["weights_digest"].startswith("(the built engine")  # unknown until trtllm-build ran
    assert "Dry run: nothing was built, uploaded or registered." in out
    # Nothing was uploaded.
    with pytest.raises(ManifestNotFoundError):
        store = WeightStore.from_settings(get_settings(), quiet=True)
        store.read_manifest(source_uri.replace("checkpoints/sluice-tiny", "engines/tiny/3"))


def test_trtllm_fp8_dry_run_quantizes_with_modelopt_instead_of_converting(
    capsys: pytest.CaptureFixture[str], source_uri: str, tmp_path: Path
) -> None:
    calib = tmp_path / "cnn_dailymail"  # a local copy: quantize.py must not reach the hub
    code, out, err = build(
        capsys,
        *("--source", source_uri, "--model", "tiny", "--version", "4", "--target", "trtllm"),
        *("--quantization", "fp8", "--calib-dataset", str(calib)),
        *("--work-dir", str(tmp_path / "w"), "--dry-run"),
    )
    assert code == 0 and err == "", (out, err)
    quantize, build_cmd = commands(out)
    assert quantize[:2] == [sys.executable, f"{EXAMPLES}/quantization/quantize.py"]
    flags = dict(zip(quantize[2::2], quantize[3::2], strict=True))
    assert flags == {
        "--model_dir": flags["--model_dir"],
        "--dtype": "float16",  # the checkpoint is float32: FP8 calibrates from half precision
        "--qformat": "fp8",
        "--kv_cache_dtype": "fp8",
        "--calib_dataset": str(calib),
        "--calib_size": "512",
        "--tp_size": "1",
        "--pp_size": "1",
        "--output_dir": f"{tmp_path / 'w'}/trtllm_checkpoint",
    }
    assert build_cmd[0] == "trtllm-build" and build_cmd[build_cmd.index("--max_batch_size") + 1] == "64"
    assert '"quantization": "fp8"' in out  # the build config the registry will carry


def test_llmapi_dry_run_renders_model_yaml_and_config_without_an_engine_build(
    capsys: pytest.CaptureFixture[str], source_uri: str, tmp_path: Path
) -> None:
    code, out, err = build(
        capsys,
        *("--source", source_uri, "--model", "tiny", "--version", "5", "--target", "trtllm-llmapi"),
        *("--dtype", "bfloat16", "--max-seq-len", "2048", "--max-input-len", "1536", "--dry-run"),
    )
    assert code == 0 and err == "", (out, err)
    assert commands(out) == []  # no engine build: the PyTorch backend loads the checkpoint itself
    files = rendered(out)
    assert list(files) == ["tiny/config.pbtxt", "tiny/5/model.yaml"]
    assert all("${" not in text for text in files.values())
    config, model_yaml = files["tiny/config.pbtxt"], files["tiny/5/model.yaml"]
    assert 'backend: "python"' in config and "versions: [ 5 ]" in config
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", parameters(config)["weights_digest"])
    fields = dict(re.findall(r"^\s*(\w+): (.+)$", model_yaml, flags=re.M))
    assert fields["model"].startswith('"/') and fields["backend"] == '"pytorch"'
    assert fields["dtype"] == '"bfloat16"' and fields["tensor_parallel_size"] == "1"
    assert (fields["max_seq_len"], fields["max_input_len"], fields["max_num_tokens"]) == (
        "2048",
        "1536",
        "8192",
    )
    assert fields["free_gpu_memory_fraction"] == "0.9" and fields["enable_block_reuse"] == "false"
    assert fields["decoupled"] == "True"


@pytest.mark.parametrize("target", ["trtllm", "trtllm-llmapi"])
def test_without_a_gpu_the_trtllm_targets_stop_before_doing_anything(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    source_uri: str,
    tmp_path: Path,
    target: str,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi on it, whatever this machine has
    code, out, err = build(
        capsys, "--source", source_uri, "--model", "tiny", "--version", "6", "--target", target
    )
    assert code == 2 and out == ""
    assert (
        f"the {target} target needs an NVIDIA GPU and TensorRT-LLM {TRTLLM_VERSION}: no GPU: "
        "nvidia-smi is not on PATH" in err
    )
    assert "Nothing was done" in err and "Traceback" not in err
    cache = get_settings().weight_cache_dir
    assert not cache.exists() or not any(cache.rglob("*.safetensors"))  # not even fetched


def test_with_a_gpu_but_no_tensorrt_llm_the_build_stops_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, source_uri: str, tmp_path: Path
) -> None:
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("tensorrt_llm is installed here")
    fake_smi = tmp_path / "nvidia-smi"  # a fake nvidia-smi that lists one GPU
    fake_smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n")
    fake_smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{'/usr/bin:/bin'}")
    code, _, err = build(
        capsys, "--source", source_uri, "--model", "tiny", "--version", "6", "--target", "trtllm"
    )
    assert code == 2 and "tensorrt_llm is not importable" in err


def test_every_template_refuses_a_missing_or_unknown_placeholder() -> None:
    template = (TRTLLM_DIR / "tensorrt_llm" / "config.pbtxt.template").read_text()
    values = dict.fromkeys(re.findall(r"\$\{(\w+)\}", template), "1")
    fill_template(template, values)  # every placeholder given: renders
    with pytest.raises(ValueError, match="placeholders without a value: engine_dir"):
        fill_template(template, {k: v for k, v in values.items() if k != "engine_dir"})
    with pytest.raises(ValueError, match="keys not in the template: gpt_model_pth"):
        fill_template(template, {**values, "gpt_model_pth": "/x"})
    out = render_trtllm(
        model_name="m",
        triton_version=1,
        engine_dir="/e",
        weights_digest_value="sha256:" + "0" * 64,
        max_batch_size=8,
    )
    assert "${" not in out["m/config.pbtxt"]


def test_the_rendered_configs_parse_as_tritons_model_config_and_yaml() -> None:
    """Text checks miss a misspelt field: Triton's own ModelConfig schema (protobuf text format) and a
    YAML parser read every rendered file."""
    digest = "sha256:" + "0" * 64
    trtllm = render_trtllm(
        model_name="m", triton_version=2, engine_dir="/e", weights_digest_value=digest, max_batch_size=8
    )
    config = text_format.Parse(trtllm["m/config.pbtxt"], model_config_pb2.ModelConfig())
    assert (config.backend, config.max_batch_size, config.model_transaction_policy.decoupled) == (
        "tensorrtllm",
        8,
        True,
    )
    assert list(config.version_policy.specific.versions) == [2]
    assert config.parameters["gpt_model_path"].string_value == "/e"
    assert config.parameters["weights_digest"].string_value == digest
    build_config = {
        "dtype": "bfloat16",
        "tp_size": 2,
        "max_batch_size": 8,
        "max_num_tokens": 4096,
        "max_seq_len": 2048,
        "max_input_len": 1024,
    }
    llmapi = render_llmapi(
        model_name="m",
        triton_version=2,
        checkpoint_dir="/ckpt",
        weights_digest_value=digest,
        build_config=build_config,
    )
    config = text_format.Parse(llmapi["m/config.pbtxt"], model_config_pb2.ModelConfig())
    assert config.backend == "python" and config.parameters["weights_digest"].string_value == digest
    assert yaml.safe_load(llmapi["m/2/model.yaml"]) == {
        "model": "/ckpt",
        "backend": "pytorch",
        "dtype": "bfloat16",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "max_batch_size": 8,
        "max_num_tokens": 4096,
        "max_seq_len": 2048,
        "max_input_len": 1024,
        "enable_chunked_prefill": True,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": False},
        "triton_config": {"max_batch_size": 0, "decoupled": True},
    }


def test_fp8_without_a_local_calibration_set_is_refused(
    capsys: pytest.CaptureFixture[str], source_uri: str
) -> None:
    code, out, err = build(
        capsys,
        *("--source", source_uri, "--model", "tiny", "--version", "4", "--target", "trtllm"),
        *("--quantization", "fp8", "--dry-run"),
    )
    assert code == 2 and out == ""
    assert "--quantization fp8 needs --calib-dataset" in err and "cnn_dailymail from the hub" in err


def test_a_float32_trtllm_engine_is_refused(capsys: pytest.CaptureFixture[str], source_uri: str) -> None:
    code, _, err = build(
        capsys,
        *("--source", source_uri, "--model", "tiny", "--version", "4", "--target", "trtllm"),
        *("--dtype", "float32", "--dry-run"),
    )
    assert code == 2 and "--dtype for trtllm must be one of auto, float16, bfloat16" in err


@pytest.mark.parametrize("offline", [False, True])
def test_a_local_checkpoint_dry_run_contacts_no_store_and_no_registry(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    dev_checkpoint: Path,
    tmp_path: Path,
    offline: bool,
) -> None:
    # Every store and registry address unreachable: a call to either would fail the run.
    monkeypatch.setenv("SLUICE_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    code, out, err = build(
        capsys,
        *("--source", str(dev_checkpoint), "--dest", "s3://engines/tiny/7", "--model", "tiny"),
        *("--version", "7", "--target", "trtllm", "--tp", "2", "--pp", "2", "--dry-run"),
        *(("--offline",) if offline else ()),
    )
    assert code == 0 and err == "", (out, err)
    assert f"read the local checkpoint {dev_checkpoint.resolve()}" in out
    convert, build_cmd = commands(out)
    assert convert[convert.index("--tp_size") + 1] == "2" and convert[convert.index("--pp_size") + 1] == "2"
    assert build_cmd[build_cmd.index("--workers") + 1] == "4"  # one per rank
    assert "no weight store or registry was contacted" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--source", "s3://weights/checkpoints/x", "--dry-run", "--offline"), "--offline previews"),
        (("--source", "/nonexistent/ckpt", "--dest", "s3://engines/x/1", "--offline"), "--offline previews"),
        (("--source", "/nonexistent/ckpt", "--dry-run"), "give --dest"),
        (("--source", "/nonexistent/ckpt", "--dest", "s3://engines/x/1"), "local --source is for --dry-run"),
        (("--source", "/nonexistent/ckpt", "--dest", "s3://engines/x/1", "--dry-run"), "no such folder"),
    ],
)
def test_offline_and_local_sources_are_refused_clearly_where_they_cannot_work(
    capsys: pytest.CaptureFixture[str], build_env: Path, argv: tuple[str, ...], message: str
) -> None:
    code, out, err = build(capsys, *argv, "--model", "tiny", "--version", "8", "--target", "cpu")
    assert code in (1, 2) and out == "" and message in err and "Traceback" not in err, err
