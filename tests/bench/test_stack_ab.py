"""bench.stack_ab's variants: a repository each, and settings of the stack for one variant alone."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.cpu_split import CLIENT, CpuSplit
from bench.e2e_bench import Summary
from bench.stack_ab import RunFigures, Variant, parse_env, with_env


def test_a_setting_goes_to_the_variant_it_names_only() -> None:
    repo = Path("/repo")
    variants = [Variant("default", repo), Variant("wide", repo)]
    settings = [
        parse_env("wide:SLUICE_ITL_HEADROOM_FRACTION=0.15"),
        parse_env("wide:SLUICE_X=a=b"),
        parse_env("wide:OMP_NUM_THREADS=2"),
    ]
    default, wide = with_env(variants, settings)
    assert default.env == {}
    assert wide.env == {"SLUICE_ITL_HEADROOM_FRACTION": "0.15", "SLUICE_X": "a=b", "OMP_NUM_THREADS": "2"}
    assert variants[1].env == {}  # the parsed variants are left as they were


@pytest.mark.parametrize("text", ["SLUICE_X=1", "wide:X=1", "wide:SLUICE_X", ":SLUICE_X=1", "wide:PATH=/x"])
def test_a_setting_that_names_no_variant_or_no_sluice_key_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_env(text)


def test_a_setting_for_a_variant_not_run_is_an_error() -> None:
    with pytest.raises(SystemExit, match="no variant is named 'wdie'"):
        with_env([Variant("wide", Path("/repo"))], [parse_env("wdie:SLUICE_X=1")])


def test_a_runs_figures_carry_the_serving_paths_cpu_per_token_apart_from_the_engines() -> None:
    backend = "Python backend: sluice-tiny"
    cpu = CpuSplit(
        10.0,
        {
            "gateway": 1.0,
            "tritonserver": 0.5,
            f"{backend}, other threads": 0.5,
            f"{backend}, engine thread": 4.0,
            "Python backend: sluice-guard": 0.1,  # the classifier's model: not the engine's send path
            CLIENT: 1.0,
        },
        output_tokens=20_000,
        num_chunks=5_000,
    )
    summary = Summary("x", 32, 128, 10.0, 20_000, [1.0, 2.0], [3.0], num_chunks=5_000)
    figures = RunFigures.of(summary, cpu)
    assert figures.tokens_per_s == 2_000 and figures.tokens_per_chunk == 4.0
    assert figures.serving_path_us == pytest.approx(100.0)  # (1.0 + 0.5 + 0.5) s over 20,000 tokens
    assert figures.engine_us == pytest.approx(200.0)
    assert figures.all_us == pytest.approx(355.0)
    assert "serving path 100 µs, engine threads 200, all 355" in figures.line()
