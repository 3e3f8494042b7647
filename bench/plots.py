"""The benchmark report's figures (docs/img/*.png), drawn with matplotlib's Agg backend (no display).

Each plot is drawn from plain numbers that the benchmark also saves as JSON beside the PNG
(``save_json``), so a figure can be redrawn, or checked, without rerunning the benchmark. One function
per figure; none of them measures anything.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.report import pct

# One colour per target, the same in every figure.
COLOURS = {"sluice": "tab:blue", "sluice-default": "tab:cyan", "vllm": "tab:orange", "engine": "tab:gray"}
_DPI = 110


def save_json(png: Path, data: Mapping[str, Any]) -> Path:
    """``data`` as ``png`` with the suffix .json: the numbers the figure is drawn from."""
    path = png.with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path


def cancel_histogram(freed_ms: Sequence[float], path: Path, title: str) -> Path:
    """Histogram of cancel-to-free latencies, with the median and p95 marked."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    if freed_ms:
        ax.hist(freed_ms, bins=min(30, max(5, len(freed_ms) // 2)), color="tab:blue", alpha=0.8)
        for q, style in ((50, "-"), (95, "--")):
            value = pct(list(freed_ms), q)
            ax.axvline(value, color="black", linestyle=style, label=f"p{q} {value:.1f} ms")
        ax.legend()
    ax.set_xlabel("client closes stream → replica frees request and KV (ms)")
    ax.set_ylabel("streams")
    ax.set_title(f"Cancel-to-free latency: {title}", fontsize=10)
    return _save(fig, path)


def load_sweep(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """TTFT, inter-token latency (p50 solid, p95 dashed) and output tokens/s against concurrent streams,
    one line per target. ``rows``: one per run, with target, concurrency, ttft_p50_ms, ttft_p95_ms,
    itl_p50_ms, itl_p95_ms, tokens_per_s; each point is the median of a target's runs at a load."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.9))
    panels = (
        ("TTFT (ms)", ("ttft_p50_ms", "ttft_p95_ms")),
        ("inter-token latency (ms)", ("itl_p50_ms", "itl_p95_ms")),
        ("output tokens/s", ("tokens_per_s",)),
    )
    order = list(COLOURS)
    targets = sorted({str(r["target"]) for r in rows}, key=lambda t: order.index(t) if t in order else 9)
    for ax, (label, fields) in zip(axes, panels, strict=True):
        for target in targets:
            mine = [r for r in rows if r["target"] == target]
            loads = sorted({int(r["concurrency"]) for r in mine})
            for field, style in zip(fields, ("-", "--"), strict=False):
                ys = [statistics.median(float(r[field]) for r in mine if r["concurrency"] == c)
                      for c in loads]  # fmt: skip
                suffix = "" if len(fields) == 1 else f" {field.split('_')[1]}"
                ax.plot(loads, ys, style, marker="o", color=COLOURS.get(target), label=f"{target}{suffix}")
        ax.set_xscale("log", base=2)
        all_loads = sorted({int(r["concurrency"]) for r in rows})
        ax.set_xticks(all_loads, [str(c) for c in all_loads])
        ax.set_yscale("log")
        ax.set_xlabel("concurrent streams")
        ax.set_title(label, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def noisy_tenant(phases: Mapping[str, Mapping[str, Any]], path: Path, ttft_bound_ms: float) -> Path:
    """Fairness under a noisy tenant. Left: the quiet tenant's TTFT of each request over its phase,
    unloaded and during the flood, against the target. Right: output tokens/s of each tenant in each
    phase. ``phases``: unloaded and flooded, each with ``ttft_at_s``, ``ttft_ms`` and ``tokens_per_s``
    (tenant → tokens/s)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.9), gridspec_kw={"width_ratios": [2, 1]})
    for (label, phase), colour in zip(phases.items(), ("tab:green", "tab:red"), strict=False):
        left.scatter(phase["ttft_at_s"], phase["ttft_ms"], s=6, color=colour, label=f"quiet tenant, {label}")
    left.axhline(ttft_bound_ms, color="black", linestyle="--", label=f"target p95 < {ttft_bound_ms:.0f} ms")
    left.set_yscale("log")
    left.set_xlabel("seconds into the phase")
    left.set_ylabel("time to first token (ms)")
    left.legend(fontsize=8)
    left.grid(True, which="both", alpha=0.3)
    tenants = sorted({t for phase in phases.values() for t in phase["tokens_per_s"]})
    width = 0.8 / max(1, len(phases))
    for i, ((label, phase), colour) in enumerate(zip(phases.items(), ("tab:green", "tab:red"), strict=False)):
        xs = [j + i * width for j in range(len(tenants))]
        right.bar(xs, [phase["tokens_per_s"].get(t, 0.0) for t in tenants], width, color=colour, label=label)
    right.set_xticks([j + width * (len(phases) - 1) / 2 for j in range(len(tenants))], tenants)
    right.set_ylabel("output tokens/s")
    right.legend(fontsize=8)
    fig.suptitle("Fairness under a noisy tenant", fontsize=10)
    return _save(fig, path)
