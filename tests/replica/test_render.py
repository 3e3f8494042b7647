"""The model repository renderer (replicas/render.py), without a server: it imports nothing of the
CPU engine, so its engine defaults and checks are compared here against ``EngineConfig``'s."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format
from replica_converters import parameters_from_config
from tritonclient.grpc import model_config_pb2

from cpu_engine.config import DTYPE_SETTINGS as ENGINE_DTYPE_SETTINGS
from cpu_engine.config import EngineConfig
from replicas.render import (
    DTYPE_SETTINGS,
    SOURCE_DIR,
    CpuEngineModelSettings,
    fill_template,
    main,
    render_model_repository,
)
from sluice.settings import ITL_TARGET_MS, get_settings
from sluice.weights_digest import weights_digest
from sluice.wire import INPUT_NAMES, OUTPUT_NAMES


def _checkpoint(root: Path) -> Path:
    """A stand-in checkpoint folder: the renderer only digests its files."""
    (root / "ckpt").mkdir(exist_ok=True)
    (root / "ckpt" / "model.safetensors").write_bytes(b"weights")
    return root / "ckpt"


def test_fill_template_refuses_unknown_and_missing_keys() -> None:
    assert fill_template('a: "${x}" b: ${y}', {"x": "1", "y": 2}) == 'a: "1" b: 2'
    with pytest.raises(ValueError, match="keys not in the template: z"):
        fill_template("${x}", {"x": 1, "z": 2})
    with pytest.raises(ValueError, match="placeholders without a value: y"):
        fill_template("${x} ${y}", {"x": 1})
    with pytest.raises(ValueError, match="must not contain quotes"):
        fill_template('"${x}"', {"x": 'a"b'})


def test_rendered_repository_is_a_valid_triton_config(tmp_path: Path) -> None:
    settings = CpuEngineModelSettings(
        checkpoint_dir=_checkpoint(tmp_path), num_kv_blocks=99, target_step_ms=30, dtype="float32"
    )
    model_dir = render_model_repository(tmp_path / "repo", settings)
    assert model_dir == tmp_path / "repo" / "sluice-tiny"
    # Every file of the version folder travels: model.py imports the modules beside it.
    sources = {p.name for p in (SOURCE_DIR / "1").iterdir() if p.name[0] not in "._"}
    assert {"model.py", "replica_converters.py", "send_schedule.py"} <= sources
    assert {p.name for p in (model_dir / "1").iterdir()} == sources
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.name == "sluice-tiny" and config.backend == "python"
    assert config.model_transaction_policy.decoupled and config.max_batch_size == 64
    assert [i.name for i in config.input] == list(INPUT_NAMES)
    assert [o.name for o in config.output] == list(OUTPUT_NAMES)
    assert {i.name for i in config.input if not i.optional} == {
        "input_ids", "input_lengths", "request_output_len"
    }  # fmt: skip
    parsed = parameters_from_config(
        json_format.MessageToDict(config, preserving_proto_field_name=True)["parameters"]
    )
    assert parsed.checkpoint_dir == (tmp_path / "ckpt").resolve()
    assert parsed.engine.num_kv_blocks == 99 and parsed.engine.target_step_ms == 30.0
    assert parsed.engine.dtype == "float32"
    assert parsed.engine.prefill_step_stretch == EngineConfig.prefill_step_stretch
    # The checkpoint's digest travels in the config, for health checks to read back; version 1 by default.
    assert parsed.weights_digest == weights_digest(tmp_path / "ckpt")
    assert list(config.version_policy.specific.versions) == [1]
    assert CpuEngineModelSettings(checkpoint_dir=tmp_path).dtype == "auto"  # the default
    # Rendering again replaces the folder whole.
    (model_dir / "stale.txt").write_text("x")
    render_model_repository(tmp_path / "repo", settings)
    assert not (model_dir / "stale.txt").exists()


def test_a_version_renders_as_its_folder_and_policy_with_a_given_digest(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    settings = CpuEngineModelSettings(
        checkpoint_dir=tmp_path / "absent", model_version=3, weights_digest=digest
    )
    model_dir = render_model_repository(tmp_path / "repo", settings)
    assert (model_dir / "3" / "model.py").is_file() and not (model_dir / "1").exists()
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert list(config.version_policy.specific.versions) == [3]
    assert config.parameters["weights_digest"].string_value == digest
    with pytest.raises(FileNotFoundError):  # no digest given, no checkpoint to compute it from
        render_model_repository(
            tmp_path / "repo2", CpuEngineModelSettings(checkpoint_dir=tmp_path / "absent")
        )


def test_settings_are_checked_at_render_time(tmp_path: Path) -> None:
    for version in (0, -1, True, "2"):
        with pytest.raises(ValueError, match="model_version must be a positive integer"):
            CpuEngineModelSettings(checkpoint_dir=tmp_path, model_version=version)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="weights digest"):
        CpuEngineModelSettings(checkpoint_dir=tmp_path, weights_digest="sha256:short")
    with pytest.raises(ValueError, match="model name"):
        CpuEngineModelSettings(checkpoint_dir=tmp_path, model_name="bad name")
    with pytest.raises(ValueError, match="num_kv_blocks"):
        CpuEngineModelSettings(checkpoint_dir=tmp_path, num_kv_blocks=0)
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16; got 'fp16'"):
        CpuEngineModelSettings(checkpoint_dir=tmp_path, dtype="fp16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefill_step_stretch must be >= 1"):
        CpuEngineModelSettings(checkpoint_dir=tmp_path, prefill_step_stretch=0.9)


# The knobs the renderer restates from EngineConfig (it must not import the engine). Not target_step_ms:
# a rendered replica bounds its steps by half the inter-token target (below); the engine alone does not.
ENGINE_KNOBS = (
    "num_kv_blocks", "block_size_tokens", "step_token_budget", "max_num_running", "dtype",
    "kv_cache_dtype", "prefill_step_stretch",
)  # fmt: skip


def test_a_rendered_replica_keeps_the_itl_target_by_default(tmp_path: Path) -> None:
    """The step bound and the send budget are the ITL target's two halves, unless overridden."""
    defaults = CpuEngineModelSettings(checkpoint_dir=tmp_path)
    assert defaults.target_step_ms == defaults.send_budget_ms == ITL_TARGET_MS / 2
    assert defaults.max_responses_per_s > 0
    with pytest.raises(ValueError, match="send_budget_ms"):
        CpuEngineModelSettings(checkpoint_dir=tmp_path, send_budget_ms=-1.0)
    with pytest.raises(ValueError, match="max_responses_per_s"):
        CpuEngineModelSettings(checkpoint_dir=tmp_path, max_responses_per_s=0.0)


def test_the_cli_splits_the_itl_target_and_takes_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = _checkpoint(tmp_path)

    def parameters(*flags: str) -> dict[str, str]:
        out = tmp_path / "repo"
        assert main(["--out", str(out), "--checkpoint-dir", str(checkpoint), "--safety-classifier", "",
                            *flags]) == 0  # fmt: skip
        config = (out / "sluice-tiny" / "config.pbtxt").read_text()
        found = re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', config)
        return dict(found)

    monkeypatch.setenv("SLUICE_ITL_TARGET_MS", "60")
    get_settings.cache_clear()
    try:
        assert parameters()["target_step_ms"] == "30.0" and parameters()["send_budget_ms"] == "30.0"
        monkeypatch.delenv("SLUICE_ITL_TARGET_MS")
        get_settings.cache_clear()
        split = parameters("--itl-target-ms", "50")
        assert (split["target_step_ms"], split["send_budget_ms"]) == ("25.0", "25.0")
        off = parameters("--target-step-ms", "none", "--send-budget-ms", "0", "--max-responses-per-s", "500")
        found = (off["target_step_ms"], off["send_budget_ms"], off["max_responses_per_s"])
        assert found == ("", "0.0", "500.0")
    finally:
        get_settings.cache_clear()


def test_the_renderers_engine_defaults_are_the_engines() -> None:
    rendered = {f.name: f.default for f in dataclasses.fields(CpuEngineModelSettings)}
    engine = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    assert {k: rendered[k] for k in ENGINE_KNOBS} == {k: engine[k] for k in ENGINE_KNOBS}
    assert DTYPE_SETTINGS == ENGINE_DTYPE_SETTINGS


@pytest.mark.parametrize(
    "knobs",
    [
        {"num_kv_blocks": 0}, {"block_size_tokens": -16}, {"step_token_budget": 0},
        {"max_num_running": 0}, {"dtype": "fp16"}, {"kv_cache_dtype": "fp8"}, {"prefill_step_stretch": 0.99},
        {"prefill_step_stretch": float("nan")},
    ],
)  # fmt: skip
def test_the_renderer_refuses_what_the_engine_refuses_in_its_words(tmp_path: Path, knobs: dict) -> None:
    with pytest.raises(ValueError) as engine_error:
        EngineConfig(**knobs)
    with pytest.raises(ValueError) as render_error:
        CpuEngineModelSettings(checkpoint_dir=tmp_path, **knobs)
    assert str(render_error.value) == str(engine_error.value)


def test_the_renderer_accepts_the_engines_smallest_values(tmp_path: Path) -> None:
    smallest = {"num_kv_blocks": 1, "block_size_tokens": 1, "step_token_budget": 1, "max_num_running": 1}
    edges = {"prefill_step_stretch": None, "dtype": "bfloat16", **smallest}
    EngineConfig(**edges)  # type: ignore[arg-type]
    CpuEngineModelSettings(checkpoint_dir=tmp_path, **edges)  # type: ignore[arg-type]
    assert (
        CpuEngineModelSettings(checkpoint_dir=tmp_path, prefill_step_stretch=1.0).prefill_step_stretch == 1.0
    )


@pytest.mark.parametrize(
    ("knob", "flag", "rendered", "parsed"),
    [
        (
            "prefill_step_stretch",
            [],
            str(EngineConfig.prefill_step_stretch),
            EngineConfig.prefill_step_stretch,
        ),
        ("prefill_step_stretch", ["3"], "3.0", 3.0),
        ("prefill_step_stretch", ["none"], "", None),
        ("prefill_num_threads", [], "auto", len(os.sched_getaffinity(0))),
        ("prefill_num_threads", ["2"], "2", 2),
        ("prefill_num_threads", ["none"], "", None),
        ("kv_cache_dtype", [], "auto", "auto"),
        ("kv_cache_dtype", ["float32"], "float32", "float32"),
    ],
)
def test_an_optional_engine_knob_renders_and_parses_back(
    tmp_path: Path, knob: str, flag: list[str], rendered: str, parsed: float | None
) -> None:
    args = [f"--{knob.replace('_', '-')}", *flag] if flag else []
    checkpoint = str(_checkpoint(tmp_path))
    main(["--out", str(tmp_path), "--checkpoint-dir", checkpoint, "--safety-classifier", "", *args])
    text = (tmp_path / "sluice-tiny" / "config.pbtxt").read_text()
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.parameters[knob].string_value == rendered
    raw = json_format.MessageToDict(config, preserving_proto_field_name=True)["parameters"]
    assert getattr(parameters_from_config(raw).engine, knob) == parsed


def test_a_bad_prefill_num_threads_is_refused_at_render_time(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prefill_num_threads must be 'auto', None or in"):
        CpuEngineModelSettings(checkpoint_dir=tmp_path, prefill_num_threads=0)


def test_the_render_command_takes_its_dtype_from_sluice_engine_dtype(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def rendered_dtype(*extra: str) -> str:
        get_settings.cache_clear()
        checkpoint = str(_checkpoint(tmp_path))
        main(["--out", str(tmp_path), "--checkpoint-dir", checkpoint, "--safety-classifier", "", *extra])
        text = (tmp_path / "sluice-tiny" / "config.pbtxt").read_text()
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        return config.parameters["dtype"].string_value

    monkeypatch.delenv("SLUICE_ENGINE_DTYPE", raising=False)
    try:
        assert rendered_dtype() == "auto"
        monkeypatch.setenv("SLUICE_ENGINE_DTYPE", "float32")
        assert rendered_dtype() == "float32"
        assert rendered_dtype("--dtype", "bfloat16") == "bfloat16"  # the command line wins
        monkeypatch.setenv("SLUICE_ENGINE_DTYPE", "fp16")
        with pytest.raises(SystemExit):
            rendered_dtype()
        assert "SLUICE_ENGINE_DTYPE='fp16'" in capsys.readouterr().err
    finally:
        get_settings.cache_clear()
