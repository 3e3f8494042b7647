"""What ``sluice sim`` prints at the end: the summary table, the targets table, and the same as JSON.

One row per fleet run of the scenario (noisy-tenant has three: ``wfq-baseline``, ``wfq-noisy``,
``fcfs-noisy``; doubling three: ``fixed``, ``cold-only``, ``warm-pool``; the others one). The ``targets``
cell is ``met`` or ``not met`` on the run the scenario's targets judge (noisy-tenant: ``wfq-noisy``,
measured against ``wfq-baseline``; doubling: ``warm-pool``) and ``-`` on runs that are only there to
compare with. An autoscaled run's replicas read ``start→most routed``; its utilisation and cost count
the replicas paid for (warm and starting ones too). The figures are ``report.summarize``'s; the verdict
is ``targets.judge``'s as ``scenarios.run_scenario`` stored it under ``summary["targets"]``.
"""

from __future__ import annotations

from typing import Any

from control_plane.table import render_table

# The scenario's run its targets judge, when it runs several (``None``: the summary's own figures).
JUDGED_RUN = {"noisy-tenant": "wfq-noisy", "doubling": "warm-pool"}
SCENARIO_RUNS = {
    "noisy-tenant": ("wfq-baseline", "wfq-noisy", "fcfs-noisy"),
    "doubling": ("fixed", "cold-only", "warm-pool"),
}
FIGURES = (
    "replicas",
    "replicas_routed_max",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "itl_p50_ms",
    "itl_p95_ms",
    "utilisation",
    "shed_rate",
    "cost_per_m_output_tokens_usd",
)
HEADERS = (
    "scenario",
    "replicas",
    "TTFT p50 ms",
    "TTFT p95 ms",
    "ITL p50 ms",
    "ITL p95 ms",
    "utilisation",
    "shed",
    "$/M out tokens",
    "targets",
)


def _runs(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, that run's figures), in the order the scenario ran them."""
    labels = SCENARIO_RUNS.get(summary["scenario"])
    if labels is not None:
        return [(label, summary[label]) for label in labels]
    return [("", summary)]


def summary_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's figures, one dict per run: ``scenario``, ``run`` ("" for a scenario's only run), the
    ``FIGURES`` (numbers; ``None`` where nothing was measured), and ``targets``: "met", "not met", or
    ``None`` for a run that is not judged."""
    scenario = summary["scenario"]
    judged = JUDGED_RUN.get(scenario, "")
    verdict = "met" if summary["targets"]["met"] else "not met"
    return [
        {
            "scenario": scenario,
            "run": label,
            **{key: figures.get(key) for key in FIGURES},
            "targets": verdict if label == judged else None,
        }
        for label, figures in _runs(summary)
    ]


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def _replicas(start: int, most_routed: int | None) -> str:
    return str(start) if most_routed is None else f"{start}→{most_routed}"


def _row_cells(row: dict[str, Any]) -> list[str]:
    cost = row["cost_per_m_output_tokens_usd"]
    return [
        f"{row['scenario']} {row['run']}".strip(),
        _replicas(row["replicas"], row["replicas_routed_max"]),
        _ms(row["ttft_p50_ms"]),
        _ms(row["ttft_p95_ms"]),
        _ms(row["itl_p50_ms"]),
        _ms(row["itl_p95_ms"]),
        _percent(row["utilisation"]),
        _percent(row["shed_rate"]),
        "-" if cost is None else f"${cost:,.2f}",
        row["targets"] or "-",
    ]


def render(summary: dict[str, Any]) -> str:
    """The summary table, a blank line, then each target with what was measured and met / not met."""
    table = render_table(HEADERS, [_row_cells(row) for row in summary_rows(summary)])
    checks = summary["targets"]["checks"]
    judged = JUDGED_RUN.get(summary["scenario"])
    against = {"noisy-tenant": " against wfq-baseline"}.get(summary["scenario"], "")
    title = f"targets ({judged}{against})" if judged else "targets"
    targets = render_table(
        (title, "measured", "met"),
        [[c["target"], c["measured"], "met" if c["met"] else "not met"] for c in checks],
    )
    return f"{table}\n\n{targets}"


def as_json(summary: dict[str, Any], files: list[str]) -> dict[str, Any]:
    """What ``--json`` prints: the table's rows, the targets, the files written, and the whole summary
    (as in ``<scenario>.json`` without its ``definitions``)."""
    return {
        "rows": summary_rows(summary),
        "targets": summary["targets"],
        "files": files,
        "summary": {k: v for k, v in summary.items() if k != "definitions"},
    }
