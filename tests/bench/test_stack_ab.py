"""bench.stack_ab's variants: a repository each, and settings of the stack for one variant alone."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.stack_ab import Variant, parse_env, with_env


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
