"""Every Grafana dashboard and Prometheus rule under deploy/ queries what the services export (issue 15).

The catalogue of exported series is read from the services themselves: the gateway's and the control
plane's Prometheus registries (every metric, with its label names), the replicas' Triton families as a
declared list checked here against the replica code, a few series from outside Sluice (DCGM's GPU
utilisation, Prometheus's ``up``), and the recording rules' outputs. Each query is parsed with a real
PromQL parser (promql-parser) and walked (``promql_labels.Checker``): a misspelt metric or label, a group
by a label the series do not carry, or a join that can never match fails the test. So do a legend or an
alert annotation naming a label the query's result does not carry, and an alert without its runbook.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from promql_labels import Checker, Labels

from control_plane.autoscaler.metrics import AutoscalerMetrics
from control_plane.service.metrics import ControlPlaneMetrics
from cpu_engine.cpu_features import choose_dtype
from cpu_engine.stats import ENGINE_INFO_FAMILY, EngineStats
from gateway.metrics import GatewayMetrics
from replicas.health import HealthMetrics

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULE_FILES = (PROMETHEUS / "recording-rules.yml", PROMETHEUS / "alert-rules.yml")
OPERATIONS = ROOT / "docs" / "operations.md"
REPLICA_CODE = ROOT / "model_repository" / "cpu_engine" / "1"

# Prometheus adds these to every scraped series.
TARGET_LABELS = frozenset({"instance", "job"})
# The replicas' families (Triton's metrics port): TensorRT-LLM's two gauge families, which the CPU engine
# exports under the same names, and the CPU engine's own counters. Checked against the code below.
ENGINE_LABELS = frozenset({"model", "version"})
REPLICA_SERIES: dict[str, Labels] = {
    "nv_trt_llm_kv_cache_block_metrics": ENGINE_LABELS | {"kv_cache_block_type"},
    "nv_trt_llm_request_metrics": ENGINE_LABELS | {"request_type"},
    "sluice_engine_preemptions_total": ENGINE_LABELS,
    "sluice_engine_steps_total": ENGINE_LABELS,
    "sluice_engine_step_ms_total": ENGINE_LABELS,
    "sluice_engine_generated_tokens_total": ENGINE_LABELS,
    "sluice_prefix_cache_query_tokens_total": ENGINE_LABELS,
    "sluice_prefix_cache_hit_tokens_total": ENGINE_LABELS,
    ENGINE_INFO_FAMILY: ENGINE_LABELS
    | {"dtype", "requested_dtype", "kv_cache_dtype", "cpu_flags", "bf16_kernel"},
}
# Not Sluice's: NVIDIA's DCGM exporter (GPU nodes) and Prometheus's own scrape health.
EXTERNAL_SERIES: dict[str, Labels] = {
    "DCGM_FI_DEV_GPU_UTIL": frozenset({"gpu", "UUID", "device", "modelName", "Hostname"}),
    "up": frozenset(),
}
# The sample names a metric of each type exposes, and the labels they add.
_SAMPLES: dict[str, tuple[tuple[str, Labels], ...]] = {
    "counter": (("_total", frozenset()), ("_created", frozenset())),
    "gauge": (("", frozenset()),),
    "histogram": (
        ("_bucket", frozenset({"le"})),
        ("_count", frozenset()),
        ("_sum", frozenset()),
        ("_created", frozenset()),
    ),
}


def _registry_series(registry: CollectorRegistry) -> dict[str, Labels]:
    """Sample name -> label names of every metric in ``registry``. NOTE: prometheus_client lists a
    registry's collectors, and a metric's label names before it has a child, only in private fields."""
    series: dict[str, Labels] = {}
    for collector in registry._collector_to_names:
        if not hasattr(collector, "_labelnames"):  # a collector of our own (sluice.logs): what it collects
            for family in collector.collect():
                series |= {s.name: frozenset(s.labels) | TARGET_LABELS for s in family.samples}
            continue
        labels = frozenset(collector._labelnames) | TARGET_LABELS  # type: ignore[attr-defined]
        for suffix, extra in _SAMPLES[collector._type]:  # type: ignore[attr-defined]
            series[collector._name + suffix] = labels | extra  # type: ignore[attr-defined]
    return series


def service_series() -> dict[str, Labels]:
    """Everything the gateway, the control plane and the replicas export, with the external series."""
    control_plane = ControlPlaneMetrics(replica_hour_price_usd=1.0)
    HealthMetrics(control_plane.registry)
    AutoscalerMetrics(control_plane.registry)
    return {
        **_registry_series(GatewayMetrics().registry),
        **_registry_series(control_plane.registry),
        **{name: labels | TARGET_LABELS for name, labels in REPLICA_SERIES.items()},
        **{name: labels | TARGET_LABELS for name, labels in EXTERNAL_SERIES.items()},
    }


def _rules() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                yield path, rule


@pytest.fixture(scope="module")
def catalogue() -> dict[str, Labels]:
    """The services' series plus every recording rule's output (its inferred labels and static ones)."""
    series = service_series()
    for path, rule in _rules():
        if "record" in rule:
            checker = Checker(series)
            labels = checker.check(rule["expr"]) or frozenset()
            assert not checker.problems, f"{path.name} {rule['record']}: {checker.problems}"
            series[rule["record"]] = labels | set(rule.get("labels", {}))
    return series


def _load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboards", GRAFANA / "build_dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _dashboards() -> list[Path]:
    return sorted(GRAFANA.glob("*.json"))


_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_ANNOTATION_LABEL = re.compile(r"\$labels\.(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$")


def problems_of_query(catalogue: dict[str, Labels], expr: str, legend: str = "") -> list[str]:
    """What is wrong with one panel query and its legend (empty: nothing)."""
    checker = Checker(catalogue)
    labels = checker.check(expr) or frozenset()
    unknown = sorted(set(_LEGEND_LABEL.findall(legend)) - labels)
    if unknown and not checker.problems:
        checker.problems.append(
            f"legend {legend!r} names {unknown}, not labels of the result {sorted(labels)}"
        )
    return checker.problems


# ---------------------------------------------------------------------------------------------- tests


def test_the_dashboards_are_what_the_builder_writes() -> None:
    written = _load_builder().rendered()
    assert sorted(written) == _dashboards(), "run: .venv/bin/python deploy/grafana/build_dashboards.py"
    for path, text in written.items():
        assert path.read_text() == text, f"{path.name} is stale: run deploy/grafana/build_dashboards.py"
    titles = {json.loads(text)["uid"] for text in written.values()}
    assert titles == {"sluice-fleet", "sluice-model-version", "sluice-tenants", "sluice-rollout"}


@pytest.mark.parametrize("path", _dashboards(), ids=lambda p: p.name)
def test_every_dashboard_query_names_exported_metrics_and_labels(
    path: Path, catalogue: dict[str, Labels]
) -> None:
    dashboard = json.loads(path.read_text())
    problems = []
    for panel in dashboard["panels"]:
        assert panel["targets"], f"{panel['title']}: no query"
        for target in panel["targets"]:
            for problem in problems_of_query(catalogue, target["expr"], target.get("legendFormat", "")):
                problems.append(f"{panel['title']!r} {target['refId']}: {problem}")
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.match(variable["query"]["query"])
            assert match, f"variable {variable['name']}: not label_values(SELECTOR, LABEL)"
            checker = Checker(catalogue)
            labels = checker.check(match.group(1)) or frozenset()
            problems += [f"variable {variable['name']}: {p}" for p in checker.problems]
            if match.group(2) not in labels:
                problems.append(
                    f"variable {variable['name']}: {match.group(2)!r} is not a label of its metric"
                )
    assert not problems, "\n".join(problems)


def test_every_alert_names_exported_metrics_and_has_a_runbook(catalogue: dict[str, Labels]) -> None:
    anchors = {
        _slug(line.lstrip("#")) for line in OPERATIONS.read_text().splitlines() if line.startswith("#")
    }
    alerts = [rule for path, rule in _rules() if "alert" in rule]
    assert len(alerts) >= 8
    for rule in alerts:
        checker = Checker(catalogue)
        labels = checker.check(rule["expr"]) or frozenset()
        assert not checker.problems, f"{rule['alert']}: {checker.problems}"
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook"} <= annotations.keys(), rule["alert"]
        runbook = annotations["runbook"]
        assert runbook.startswith("docs/operations.md#") and runbook.split("#", 1)[1] in anchors, runbook
        named = set(_ANNOTATION_LABEL.findall(annotations["summary"] + annotations["description"]))
        assert named <= labels, f"{rule['alert']} annotations name {sorted(named - labels)}, not on {labels}"
        assert rule["labels"]["severity"] in ("page", "ticket")
        assert "DCGM" not in rule["expr"], "GPU utilisation is a diagnostic panel, never an alert"


def test_slo_alerts_burn_on_two_windows_each_and_every_issue_signal_is_on_a_dashboard() -> None:
    alerts = {rule["alert"]: rule["expr"] for _, rule in _rules() if "alert" in rule}
    windows = {name: re.findall(r"ratio_rate(\w+)", expr) for name, expr in alerts.items() if "Burn" in name}
    assert windows == {
        "SluiceTTFTBudgetBurnFast": ["1h", "5m"], "SluiceTTFTBudgetBurnSlow": ["6h", "30m"],
        "SluiceInterTokenBudgetBurnFast": ["1h", "5m"], "SluiceInterTokenBudgetBurnSlow": ["6h", "30m"],
    }  # fmt: skip
    queries = " ".join(path.read_text() for path in _dashboards())
    for signal in (
        "sluice_gateway_time_to_first_token_seconds", "sluice_gateway_inter_token_seconds",
        "sluice_gateway_queue_depth", "sluice_gateway_queue_age_seconds", "sluice_gateway_admitted_total",
        "sluice_gateway_refused_total", "sluice_gateway_cancellations_total",
        "sluice_gateway_cancel_to_free_seconds", "sluice_engine_preemptions_total",
        "sluice_gateway_replica_kv_used_ratio", "sluice_gateway_output_tokens_total",
        "sluice:cost_per_million_output_tokens_usd", "DCGM_FI_DEV_GPU_UTIL",
    ):  # fmt: skip
        assert signal in queries, f"no dashboard shows {signal}"


def test_the_declared_replica_series_are_what_the_replica_code_exports() -> None:
    sys.path.insert(0, str(REPLICA_CODE))  # as Triton's Python backend loads the model's modules
    try:
        import replica_converters
    finally:
        sys.path.remove(str(REPLICA_CODE))
    stats = EngineStats(
        num_blocks_max=8, num_blocks_used=2, num_blocks_free=6, tokens_per_block=16, num_running=1,
        num_waiting=0, num_scheduled=1, num_context=0, running_cap=4, num_preemptions_total=0,
        num_steps_total=0, num_generated_tokens_total=0, num_prefix_query_tokens_total=0,
        num_prefix_hit_tokens_total=0,
    )  # fmt: skip
    families = {(family, label) for family, label, _ in replica_converters.gauge_values(stats)}
    assert families == {
        ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type"),
        ("nv_trt_llm_request_metrics", "request_type"),
    }
    for family, label in families:
        assert REPLICA_SERIES[family] == ENGINE_LABELS | {label}
    assert set(replica_converters.COUNTER_FAMILIES) == {n for n, labels in REPLICA_SERIES.items()
                                                          if labels == ENGINE_LABELS}  # fmt: skip
    info_labels = choose_dtype("float32", [], "none").metric_labels()
    assert REPLICA_SERIES[ENGINE_INFO_FAMILY] == ENGINE_LABELS | set(info_labels)
    # The model's exporter labels every family with its model and version.
    exporter = (REPLICA_CODE / "model.py").read_text()
    assert 'labels = {"model": model_name, "version": model_version}' in exporter


BAD_QUERIES = [
    # (query, legend, what the problem says)
    ("rate(sluice_gateway_admited_total[5m])", "", "'sluice_gateway_admited_total' is not exported"),
    ('sluice_gateway_queue_depth{modle="m"}', "", "label 'modle' is not on these series"),
    ("sum by (tenant) (rate(sluice_gateway_output_tokens_total[5m]))", "", "label 'tenant' is not on"),
    ("histogram_quantile(0.95, sum by (model) (rate(sluice_gateway_inter_token_seconds_bucket[5m])))", "",
     "label 'le' is not on"),
    ("sum by (model) (sluice_gateway_queue_depth) / sum by (model, version) (sluice_gateway_queue_depth)",
     "", "one to one: no pair matches"),
    ("sum by (model) (rate(sluice_gateway_output_tokens_total[5m]))", "{{version}}", "legend '{{version}}'"),
    ("sluice:cost_per_million_output_tokens_usd{version=\"1\"}", "", "label 'version' is not on"),
    ("sum by (model) (rate(sluice_gateway_output_tokens_total[5m))", "", "does not parse"),
]  # fmt: skip


@pytest.mark.parametrize(("expr", "legend", "problem"), BAD_QUERIES)
def test_a_misspelt_metric_or_label_is_caught(
    catalogue: dict[str, Labels], expr: str, legend: str, problem: str
) -> None:
    problems = problems_of_query(catalogue, expr, legend)
    assert problems and problem in problems[0], problems


def test_sound_queries_pass(catalogue: dict[str, Labels]) -> None:
    """The counterpart of the bad ones: the checker does not complain about what is right."""
    for expr, legend in [
        ("sum by (model) (rate(sluice_gateway_output_tokens_total[$__rate_interval]))", "{{model}}"),
        ('sluice_gateway_queue_depth{model="$model", pool="general"}', "{{instance}} {{request_class}}"),
        (
            "sluice:billable_replicas * on () group_left () max(sluice_control_plane_replica_hour_price_usd)",
            "",
        ),
    ]:
        assert problems_of_query(catalogue, expr, legend) == []


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
