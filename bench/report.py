"""Shared by the benchmarks: percentiles, and writing a result section into docs/benchmarks.md."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def write_section(name: str, body: str, docs: Path = DOCS) -> None:
    """Replace (or append) the section between ``<!-- BEGIN name -->`` and ``<!-- END name -->``."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = (
        pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    )
    docs.write_text(text)
