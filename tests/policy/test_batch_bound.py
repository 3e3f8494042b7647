"""The batch bounded by the inter-token target (sluice/policy/batch_bound.py) and the gate that reads it."""

from __future__ import annotations

import pytest

from sluice.policy.batch_bound import BatchBound, next_running_cap, num_slow_windows
from sluice.policy.dispatch import (
    DispatchConfig,
    EnginePriority,
    PriorityLoad,
    ReplicaLoad,
    Standing,
    accepts,
)

BOUND = BatchBound(itl_target_ms=40.0, grow_below_fraction=0.9)


def _next(cap: int | None, num_running: int, p95_ms: float, num_slow_windows: int = 2) -> int | None:
    return next_running_cap(cap, num_running, p95_ms, BOUND, num_slow_windows=num_slow_windows)


def test_over_the_target_the_cap_drops_at_once_towards_the_batch_that_would_have_met_it() -> None:
    assert _next(None, 64, 50.0) == 51  # 64 x 40 / 50
    assert _next(None, 64, 80.0) == 48  # 64 x 40 / 80 = 32, but at most a quarter off
    assert _next(50, 64, 45.0) == 50  # 64 x 40 / 45 = 56: never up while over
    assert _next(None, 1, 4000.0) == 1  # at least one


def test_an_unbounded_replica_is_bounded_only_by_slow_windows_in_a_row() -> None:
    """One slow window is what a wave of arrivals leaves; the second in a row bounds the replica. A
    replica already bounded is cut on the first."""
    assert _next(None, 64, 80.0, num_slow_windows=1) is None
    assert _next(None, 64, 80.0, num_slow_windows=2) == 48
    assert _next(50, 64, 80.0, num_slow_windows=1) == 48
    assert [num_slow_windows(0, 41.0, BOUND), num_slow_windows(1, 41.0, BOUND)] == [1, 2]  # in a row
    assert num_slow_windows(5, 40.0, BOUND) == 0  # a window at the target is not slow: the row ends
    three = BatchBound(itl_target_ms=40.0, num_slow_windows_to_bound=3)
    assert next_running_cap(None, 64, 80.0, three, num_slow_windows=2) is None
    assert next_running_cap(None, 64, 80.0, three, num_slow_windows=3) == 48


def test_under_the_target_the_cap_grows_only_while_it_holds_the_batch_back() -> None:
    assert _next(32, 32, 18.0) == 40  # far under: by the growth factor (x1.25) at most
    assert _next(32, 32, 34.0) == 33  # just under 90 %: 32 x 36 / 34 = 33.9
    assert _next(3, 3, 35.9) == 4  # at least one
    assert _next(32, 20, 18.0) == 32  # not what holds the batch back
    assert _next(32, 32, 37.0) == 32  # between 90 % of the target and the target: hold
    assert _next(None, 64, 10.0) is None  # never bounded: nothing to grow


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        BatchBound(itl_target_ms=0)
    with pytest.raises(ValueError):
        BatchBound(grow_below_fraction=1.5)
    with pytest.raises(ValueError):
        BatchBound(num_gaps_between_moves=0)
    with pytest.raises(ValueError):
        BatchBound(max_growth_factor=0.5)
    with pytest.raises(ValueError):
        BatchBound(max_cut_fraction=1.0)
    with pytest.raises(ValueError):
        BatchBound(num_slow_windows_to_bound=0)


def _load(num_running: int, cap: int | None, itl_ms: float | None = 80.0, **kw: object) -> ReplicaLoad:
    return ReplicaLoad("r", 90_000, 100_000, 0, num_running, itl_ms, running_cap=cap, **kw)  # type: ignore[arg-type]


CONFIG = DispatchConfig(itl_target_ms=40.0, max_waiting_per_replica=4)


def test_a_capped_replica_takes_work_up_to_its_cap_whatever_its_latency() -> None:
    assert accepts(_load(9, 10), 100, Standing.UNDER_SHARE, CONFIG)  # over the target, under its cap
    assert not accepts(_load(10, 10, itl_ms=5.0), 100, Standing.UNDER_SHARE, CONFIG)  # at its cap
    # Without a cap, the latency alone decides (the simulator's replicas).
    assert not accepts(_load(9, None), 100, Standing.UNDER_SHARE, CONFIG)
    assert accepts(_load(9, None, itl_ms=39.0), 100, Standing.UNDER_SHARE, CONFIG)


def test_work_that_yields_fills_only_its_share_of_the_cap() -> None:
    # batch: 90 % of 20 = 18; over its share: 75 % of 20 = 15.
    assert accepts(_load(17, 20), 100, Standing.BATCH, CONFIG)
    assert not accepts(_load(18, 20), 100, Standing.BATCH, CONFIG)
    assert accepts(_load(14, 20), 100, Standing.OVER_SHARE, CONFIG)
    assert not accepts(_load(15, 20), 100, Standing.OVER_SHARE, CONFIG)


def test_lower_priority_work_does_not_count_against_the_cap_of_work_that_preempts_it() -> None:
    """A quiet tenant's request next to another tenant's flood at a lower engine priority: the flood fills
    the cap, the quiet request still goes (the engine preempts the flood for it)."""
    flood = (PriorityLoad(), PriorityLoad(num_in_flight=20, kv_tokens=5_000), PriorityLoad())
    full = _load(20, 20, by_priority=flood)
    assert accepts(full, 100, Standing.UNDER_SHARE, CONFIG, EnginePriority.UNDER_SHARE)
    assert not accepts(full, 100, Standing.OVER_SHARE, CONFIG, EnginePriority.OVER_SHARE)
