"""The rules under deploy/prometheus as Prometheus itself reads them: ``promtool check rules`` and
``check config``, and ``promtool test rules`` over deploy/prometheus/rules-test.yml (synthetic series:
the cost per million output tokens, a fast TTFT burn that pages and a slow one that does not, queue age,
shed rate, replica health). Skipped, saying why, when Prometheus's Debian package cannot be fetched."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_binary import prometheus_bin_dir

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> Path:
    found = prometheus_bin_dir()
    if isinstance(found, str):
        pytest.skip(found)
    return found / "promtool"


def _run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_rules_and_the_scrape_config(promtool: Path) -> None:
    rules = _run(promtool, "check", "rules", "recording-rules.yml", "alert-rules.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = _run(promtool, "check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_the_rules_compute_cost_and_fire_the_alerts_they_should(promtool: Path) -> None:
    tested = _run(promtool, "test", "rules", "rules-test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_promtool_refuses_a_broken_rule(promtool: Path, tmp_path: Path) -> None:
    """The check is real: an alert whose expression does not parse is refused."""
    broken = (
        (PROMETHEUS / "alert-rules.yml")
        .read_text()
        .replace("sluice:shed:ratio_rate5m > 0.05", "sluice:shed >")
    )
    (tmp_path / "alert-rules.yml").write_text(broken)
    checked = subprocess.run(
        [str(promtool), "check", "rules", str(tmp_path / "alert-rules.yml")], capture_output=True, text=True
    )
    assert checked.returncode != 0 and "SluiceShedRateHigh" in checked.stdout + checked.stderr
