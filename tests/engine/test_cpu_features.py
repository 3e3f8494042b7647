"""The dtype choice from CPU flags: pure, driven with fake flag sets (never this machine's), and the engine
built with "auto" here reporting what it chose."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest

from cpu_engine.client import InProcessEngineClient
from cpu_engine.config import EngineConfig
from cpu_engine.cpu_features import (
    DTypeChoice,
    choose_dtype,
    choose_kv_cache_dtype,
    detect_dtype,
    parse_cpuinfo_flags,
    read_cpu_flags,
)
from cpu_engine.engine import LLMEngine
from cpu_engine.engine_thread import EngineThread
from cpu_engine.sampling import SamplingParams
from gateway.engine_clients import open_engine_client

ZEN3 = {"sse2", "avx", "avx2", "fma"}  # no AVX-512: CI and many cloud VMs
ICELAKE = ZEN3 | {"avx512f", "avx512bw", "avx512vl"}  # AVX-512 without BF16
ZEN4 = ICELAKE | {"avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (ZEN4, "bfloat16"),
        (SAPPHIRE_RAPIDS, "bfloat16"),
        ({"amx_bf16"}, "bfloat16"),  # AMX-BF16 alone counts
        (ZEN3, "float32"),
        (ICELAKE, "float32"),  # AVX-512 without its BF16 extension is not enough
        (set(), "float32"),
    ],
)
def test_auto_picks_bf16_only_where_the_cpu_has_bf16_instructions(flags: set[str], expected: str) -> None:
    choice = choose_dtype("auto", flags, "avx512_bf16")
    assert choice.dtype == expected and choice.requested == "auto"


@pytest.mark.parametrize("explicit", ["float32", "bfloat16"])
@pytest.mark.parametrize("flags", [ZEN3, ZEN4, None])
def test_an_explicit_dtype_wins(explicit: str, flags: set[str] | None) -> None:
    for kernel in ("avx512_bf16", "portable"):
        choice = choose_dtype(explicit, flags, kernel)
        assert choice.dtype == explicit and choice.reason == "set explicitly"


def test_a_kernel_built_without_bf16_instructions_means_float32() -> None:
    # A CPU with AVX-512 BF16 but a kernel compiled elsewhere (or by an old compiler) runs the slow path.
    choice = choose_dtype("auto", ZEN4, "portable")
    assert choice.dtype == "float32" and "rebuild" in choice.reason


def test_a_kernel_multiplying_with_amx_tiles_is_native_bf16() -> None:
    assert choose_dtype("auto", SAPPHIRE_RAPIDS, "amx_bf16").dtype == "bfloat16"
    assert choose_dtype("auto", None, "amx_bf16").dtype == "bfloat16"
    assert choose_dtype("auto", SAPPHIRE_RAPIDS, "amx_bf16").metric_labels()["bf16_kernel"] == "amx_bf16"


def test_unknown_flags_fall_back_to_how_the_kernel_was_built() -> None:
    assert choose_dtype("auto", None, "avx512_bf16").dtype == "bfloat16"
    assert choose_dtype("auto", None, "portable").dtype == "float32"
    assert choose_dtype("auto", None, "portable").cpu_flags_label == "unknown"


@pytest.mark.parametrize("bad", ["fp16", "", "BFLOAT16", "float64"])
def test_an_unknown_dtype_is_refused_naming_the_allowed_ones(bad: str) -> None:
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16"):
        choose_dtype(bad, ZEN4, "avx512_bf16")
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16"):
        EngineConfig(dtype=bad)  # type: ignore[arg-type]


def test_the_reported_flags_are_the_relevant_ones_in_a_fixed_order() -> None:
    choice = choose_dtype("auto", SAPPHIRE_RAPIDS | {"sse4_2", "avx512vnni"}, "avx512_bf16")
    assert choice.cpu_flags == ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16")
    assert choice.metric_labels() == {
        "dtype": "bfloat16",
        "requested_dtype": "auto",
        "kv_cache_dtype": "bfloat16",
        "cpu_flags": "avx2 fma avx512f avx512bw avx512_bf16 amx_tile amx_bf16",
        "bf16_kernel": "avx512_bf16",
    }
    assert choose_dtype("auto", {"sse2"}, "portable").cpu_flags_label == "none"
    line = choose_dtype("auto", ZEN3, "portable").describe()
    assert line.startswith("engine dtype float32 (requested auto): the CPU has neither")
    assert "CPU flags: avx2 fma" in line and "bf16 kernel: portable" in line
    assert "KV cache bfloat16 (requested auto)" in line


@pytest.mark.parametrize(
    ("kv_requested", "requested", "expected"),
    [
        ("auto", "auto", "bfloat16"),  # whatever "auto" makes of the linear layers
        ("auto", "bfloat16", "bfloat16"),
        ("auto", "float32", "float32"),  # float32 by name: the reference numerics, cache included
        ("float32", "auto", "float32"),  # an explicit cache dtype wins either way
        ("float32", "bfloat16", "float32"),
        ("bfloat16", "float32", "bfloat16"),
    ],
)
def test_the_kv_cache_is_bf16_unless_float32_is_asked_for(
    kv_requested: str, requested: str, expected: str
) -> None:
    assert choose_kv_cache_dtype(kv_requested, requested) == expected
    for flags in (ZEN3, ZEN4, None):  # the CPU does not enter into it
        choice = choose_dtype(requested, flags, "portable", kv_requested)
        assert (choice.kv_cache_dtype, choice.kv_cache_requested) == (expected, kv_requested)
        assert choice.metric_labels()["kv_cache_dtype"] == expected


def test_without_bf16_instructions_auto_is_float32_layers_over_a_bf16_cache() -> None:
    choice = choose_dtype("auto", ZEN3, "portable")
    assert (choice.dtype, choice.kv_cache_dtype) == ("float32", "bfloat16")


@pytest.mark.parametrize("bad", ["fp16", "", "BFLOAT16"])
def test_an_unknown_kv_cache_dtype_is_refused_naming_the_setting(bad: str) -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32, bfloat16"):
        choose_dtype("auto", ZEN4, "avx512_bf16", bad)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32, bfloat16"):
        EngineConfig(kv_cache_dtype=bad)  # type: ignore[arg-type]


def test_cpuinfo_flags_are_parsed_from_x86_and_arm_text(tmp_path: Path) -> None:
    x86 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n"
    assert parse_cpuinfo_flags(x86) == {"fpu", "avx2", "avx512_bf16"}
    assert parse_cpuinfo_flags("processor\t: 0\nFeatures\t: fp asimd bf16\n") == {"fp", "asimd", "bf16"}
    assert parse_cpuinfo_flags("processor\t: 0\n") is None
    path = tmp_path / "cpuinfo"
    path.write_text(x86)
    assert read_cpu_flags(path) == {"fpu", "avx2", "avx512_bf16"}
    assert read_cpu_flags(tmp_path / "missing") is None


def test_an_engine_built_with_auto_runs_and_reports_its_choice(
    dev_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever this machine is: the engine resolves "auto" to one of the two dtypes, the same one
    detect_dtype gives, runs in it, and says so in its stats and its start-up log line."""
    engine = LLMEngine.from_checkpoint(dev_checkpoint, EngineConfig(num_kv_blocks=64))
    assert engine.config.dtype == "auto"
    choice = engine.dtype_choice
    assert isinstance(choice, DTypeChoice) and choice == detect_dtype("auto")
    assert engine.dtype in ("float32", "bfloat16") and engine.kv_cache.dtype == "bfloat16"
    assert engine.kv_cache.keys[0].dtype == np.uint16  # bf16 bits: half the bytes of float32
    with caplog.at_level(logging.INFO, logger="cpu_engine.engine_thread"):
        thread = EngineThread(engine, name="auto-engine")
    try:
        stream = thread.submit("a", [5, 6, 7], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        tokens: list[int] = []
        while True:
            delta = stream.take(timeout_s=10)
            assert delta is not None, "the engine produced nothing"
            tokens += delta.token_ids
            if delta.finished:
                break
        assert len(tokens) == 4
        stats = thread.stats()
        assert (stats.dtype, stats.cpu_flags) == (engine.dtype, choice.cpu_flags_label)
    finally:
        thread.close()
    assert f"auto-engine started: engine dtype {engine.dtype} (requested auto)" in caplog.text


@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_the_in_process_client_runs_the_engine_in_the_configured_dtype(
    dev_checkpoint: Path, dtype: str
) -> None:
    client = open_engine_client(
        "inprocess", model_name="m", checkpoint_dir=dev_checkpoint, engine_dtype=dtype
    )
    assert isinstance(client, InProcessEngineClient)

    async def started_dtype() -> str:
        await client.start()
        try:
            assert client.engine_thread is not None
            return client.engine_thread.stats().dtype
        finally:
            await client.close()

    expected = "float32" if dtype == "float32" else detect_dtype("auto").dtype
    assert asyncio.run(started_dtype()) == expected
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16"):
        open_engine_client("inprocess", model_name="m", checkpoint_dir=dev_checkpoint, engine_dtype="f16")
