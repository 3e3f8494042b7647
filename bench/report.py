"""Shared by the benchmarks: percentiles, the CPU they ran on, and writing a result section into
docs/benchmarks.md."""

from __future__ import annotations

import platform
import re
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from cpu_engine.cpu_features import REPORTED_FLAGS, read_cpu_flags

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


def cpu_description() -> str:
    """The CPU a benchmark ran on, for beside its table (``describe_cpu`` of lscpu's fields; the processor
    name alone without lscpu)."""
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    return describe_cpu(dict(line.split(":", 1) for line in info.splitlines() if ":" in line))


def describe_cpu(lscpu_fields: Mapping[str, str]) -> str:
    """Model, number of CPUs and AVX-512 class, e.g. "AMD EPYC family 25, 2 cores, AVX-512 BF16". An AMD
    name without a model number (a VM's "AMD EPYC") gets its CPU family, which tells the generations these
    machines come in apart (23: Zen 1, 25: Zen 3 and Zen 4); bench.e2e_side_by_side and bench.goodput
    name their sections by this, so a Zen 1 run does not overwrite a Zen 3 one."""
    fields = {key.strip(): value.strip() for key, value in lscpu_fields.items()}
    flags = fields.get("Flags", "").split()
    avx = "AVX-512 BF16" if "avx512_bf16" in flags else ("AVX-512" if "avx512f" in flags else "no AVX-512")
    name, family = fields.get("Model name", "?"), fields.get("CPU family", "")
    if name.startswith("AMD") and family and not re.search(r"\d", name):
        name = f"{name} family {family}"
    return f"{name}, {fields.get('CPU(s)', '?')} cores, {avx}"


def slug(text: str) -> str:
    """``text`` as lowercase words joined by hyphens: for section and file names."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def load_average() -> str:
    """The machine's load averages, for beside a figure: other work on the same cores shows in them."""
    with open("/proc/loadavg") as f:
        one, five, fifteen = f.read().split()[:3]
    return f"load average {one} / {five} / {fifteen} (1 / 5 / 15 min)"


def cpu_flags() -> str:
    """The CPU flags the engine's kernels and its dtype choice depend on, as sluice_engine_info labels
    them (e.g. "avx2 fma avx512f avx512bw avx512_bf16"; "unknown" where /proc/cpuinfo cannot be read)."""
    flags = read_cpu_flags()
    return "unknown" if flags is None else " ".join(f for f in REPORTED_FLAGS if f in flags) or "none"


def write_measured(name: str, command: str, lines: list[str], docs: Path = DOCS) -> None:
    """Replace section ``name`` with the command that measured it, today's date and ``lines``."""
    body = [f"```\n{command}\n```", "", f"Measured {time.strftime('%Y-%m-%d')}:", "", *lines]
    write_section(name, "\n".join(body), docs)
