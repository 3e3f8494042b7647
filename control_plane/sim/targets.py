"""Each scenario's targets (issue 4) and the verdict on one run's summary: met or not met, check by check.

| scenario | targets |
|---|---|
| steady | interactive TTFT p95 < 500 ms, ITL p95 < 40 ms, shed rate <= 0.1 % |
| doubling | warm-pool run: no interactive request finished past its deadline; every refusal had a |
| | Retry-After; TTFT p95 < 500 ms over arrivals from the doubling + the autoscaler's reaction time |
| noisy-tenant | under WFQ, other tenants' TTFT p95 from the burst on rises < 5 % over the run without it |
| batch-fill | utilisation > 70 %, interactive TTFT p95 < 500 ms, ITL p95 < 40 ms |

A check whose figure is missing (no interactive request finished, say) is not met: a target is only met
when it was measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TTFT_P95_TARGET_MS = 500.0
ITL_P95_TARGET_MS = 40.0
MAX_SHED_RATE = 0.001  # the replica search also requires (almost) nothing refused or dropped
MAX_OTHERS_TTFT_RISE = 0.05  # noisy-tenant, under WFQ
MIN_BATCH_FILL_UTILISATION = 0.70


@dataclass(frozen=True)
class Check:
    """One target: what it requires (``target``, readable), the figure measured (``value``, and as the
    terminal shows it, ``measured``) and whether it holds."""

    target: str
    value: float | int | bool | None
    met: bool
    measured: str

    def as_json(self) -> dict[str, Any]:
        return {"target": self.target, "value": self.value, "measured": self.measured, "met": self.met}


def _shown(value: float | int | bool | None, unit: str) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if unit == "%":
        return f"{value:.2%}"
    return f"{value:,.1f} ms" if unit == "ms" else f"{value:,}"


def _below(target: str, value: float | None, limit: float, unit: str) -> Check:
    return Check(target, value, value is not None and value < limit, _shown(value, unit))


def _latency_checks(summary: dict[str, Any]) -> list[Check]:
    return [
        _below(f"TTFT p95 < {TTFT_P95_TARGET_MS:g} ms", summary["ttft_p95_ms"], TTFT_P95_TARGET_MS, "ms"),
        _below(f"ITL p95 < {ITL_P95_TARGET_MS:g} ms", summary["itl_p95_ms"], ITL_P95_TARGET_MS, "ms"),
    ]


def steady_checks(summary: dict[str, Any]) -> list[Check]:
    """The steady targets over one run's ``report.summarize`` output (also what the replica search asks)."""
    shed = summary["shed_rate"]
    return [
        *_latency_checks(summary),
        Check(f"shed rate <= {MAX_SHED_RATE:.1%}", shed, shed <= MAX_SHED_RATE, _shown(shed, "%")),
    ]


def meets_targets(summary: dict[str, Any]) -> bool:
    return all(check.met for check in steady_checks(summary))


DOUBLING_JUDGED_RUN = "warm-pool"


def _doubling_checks(summary: dict[str, Any]) -> list[Check]:
    run = summary[DOUBLING_JUDGED_RUN]
    late = run["interactive_served_past_deadline"]
    retry_after = run["every_refusal_has_retry_after"]
    after = run["ttft_p95_ms_after_doubling"]
    from_s = summary["ttft_judged_from_s"] - summary["doubling_at_s"]
    return [
        Check("interactive finished past deadline = 0", late, late == 0, _shown(late, "")),
        Check("every refusal has a Retry-After", retry_after, bool(retry_after), _shown(retry_after, "")),
        _below(
            f"TTFT p95 from {from_s:g} s after the doubling < {TTFT_P95_TARGET_MS:g} ms",
            after,
            TTFT_P95_TARGET_MS,
            "ms",
        ),
    ]


def _noisy_tenant_checks(summary: dict[str, Any]) -> list[Check]:
    rise = summary["others_ttft_p95_rise"]["wfq"]
    target = f"others' TTFT p95 rise under WFQ < {MAX_OTHERS_TTFT_RISE:.0%}"
    return [_below(target, rise, MAX_OTHERS_TTFT_RISE, "%")]


def _batch_fill_checks(summary: dict[str, Any]) -> list[Check]:
    utilisation = summary["utilisation"]
    return [
        Check(
            f"utilisation > {MIN_BATCH_FILL_UTILISATION:.0%}",
            utilisation,
            utilisation > MIN_BATCH_FILL_UTILISATION,
            _shown(utilisation, "%"),
        ),
        *_latency_checks(summary),
    ]


_CHECKS = {
    "steady": steady_checks,
    "doubling": _doubling_checks,
    "noisy-tenant": _noisy_tenant_checks,
    "batch-fill": _batch_fill_checks,
}


def judge(scenario: str, summary: dict[str, Any]) -> list[Check]:
    """The scenario's checks over its summary (as ``scenarios.run_scenario`` builds it).
    Raises ``ValueError`` for a scenario without targets."""
    if scenario not in _CHECKS:
        raise ValueError(f"no targets for scenario {scenario!r}; known: {', '.join(_CHECKS)}")
    return _CHECKS[scenario](summary)


def verdict_json(checks: list[Check]) -> dict[str, Any]:
    """``{"met": all met, "checks": [...]}``: what the summary JSON carries under ``targets``."""
    return {"met": all(c.met for c in checks), "checks": [c.as_json() for c in checks]}
