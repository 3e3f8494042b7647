"""How many requests a replica may run at once: the batch bounded by the inter-token target (the seed: "an
adaptive batch size bounded by a target inter-token latency").

More sequences make every step, and every stream's gaps, longer; on shared cores they also make more
responses for the serving path to carry. So a replica's running cap follows the p95 of the gaps its
streams leave (``ReplicaLoad.itl_ms``): when it is over the target, the cap drops at once to the running
count scaled by target / p95 (the batch that would have met it, were gaps proportional to the batch), but
by at most ``max_cut_fraction`` at a time (a window's p95 is noisy on shared cores: one bad window must
not halve the batch); while it is under ``grow_below_fraction`` of the target and the cap is what holds
the batch back, the cap grows towards the batch that would just meet that fraction, by at most
``max_growth_factor`` and at least one (a cut made on a burst of long gaps, a batch of prefills say, is
won back in a few windows, not one request at a time). What does not fit waits in the fair queue, where
the order is decided, instead of every stream slowing together. Both moves wait until the gaps they are
judged on were left after the previous move (``BatchBound.num_gaps_between_moves``), so one slow window
is not cut twice.

A judgement reads every gap left since the previous move, up to ``num_windows_judged`` windows of them:
right after a move, the one window that shows whether it worked; while the cap holds, a longer record.
So one slow step (a burst of prefills makes every running stream's gap long at once: at 16 streams that
is 6% of a 256-gap window, enough to put its p95 over) does not cut a cap that the windows before it
showed sound, and the requests that cut would have queued do not wait windows for it to grow back (their
TTFT); slow steps that keep coming still cut it.

A replica starts unbounded (``None``) until ``num_slow_windows_to_bound`` judged windows in a row are over
the target: one slow window is what a wave of arrivals leaves (16 requests at once on a quiet replica: the
prefills and the serving path's own per-request work make every running stream's gaps long for a moment,
whatever the batch), and a cap set on it outlived it (seen on 2 cores: a bench's warm-up wave cut the cap
to 9, and the 16 streams after it queued behind the cap for the ~1.5 s its windows took to grow it back,
TTFT p95 730 ms against ~100 at steady state). While it is unbounded, and its
inter-token estimate is over the target, it is held at the batch it ran (``held_cap``): it takes no
more, but each request that ends is replaced, and once the estimate is back under it is free again. A
gate that took nothing while the estimate was over let a steady 16-stream load drain from 10 running to
1 in ~400 ms (one slow step put the p95 of 256 gaps 0.3 ms over), its arrivals queued behind it (the TTFT
tail of 8-16 streams). The hold is not a cap: a cap set on such a moment outlives it, and at 8-16
streams its windows are slow to fill, so growing it back took seconds of queued arrivals.

Pure: the owner of a replica's view keeps the cap (``None``: not bounded yet) and feeds it each new p95.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchBound:
    itl_target_ms: float = 40.0
    grow_below_fraction: float = 0.9  # the cap grows only while the p95 is under this share of the target
    max_growth_factor: float = 1.25  # per judgement
    max_cut_fraction: float = 0.25  # per judgement
    # The cap is judged once per this many gaps (a window): about 0.1-0.3 s of a busy replica.
    num_gaps_between_moves: int = 256
    # A judgement reads the gaps since the previous move, at most this many windows of them (see above).
    num_windows_judged: int = 2
    # An unbounded replica is bounded once this many windows in a row are each over the target (above).
    num_slow_windows_to_bound: int = 2

    def __post_init__(self) -> None:
        if self.itl_target_ms <= 0 or not 0 < self.grow_below_fraction <= 1:
            raise ValueError("itl_target_ms must be > 0 and grow_below_fraction in (0, 1]")
        if min(self.num_gaps_between_moves, self.num_windows_judged, self.num_slow_windows_to_bound) < 1:
            raise ValueError("num_gaps_between_moves, num_windows_judged and num_slow_windows_to_bound: >= 1")
        if self.max_growth_factor < 1 or not 0 < self.max_cut_fraction < 1:
            raise ValueError("max_growth_factor must be >= 1 and max_cut_fraction in (0, 1)")


def next_running_cap(
    cap: int | None, num_running: int, itl_p95_ms: float, bound: BatchBound, *, num_slow_windows: int
) -> int | None:
    """The replica's running cap after a p95 of ``itl_p95_ms`` over gaps left while up to ``num_running``
    requests ran (the gaps judged: since the previous move, at most ``bound.num_windows_judged`` windows;
    ``num_running``, the most while they were left, not the count at the moment of judging: a window
    that ends as a burst drains would otherwise cut the cap to the few still running; seen after a wave
    of 64 short requests, the cap fell to 1 and took seconds of windows to grow back).
    ``num_slow_windows``: how many windows in a row, the one just judged included, each had its own p95
    over the target; an unbounded replica is bounded only from ``bound.num_slow_windows_to_bound``."""
    if itl_p95_ms > bound.itl_target_ms:
        if cap is None and num_slow_windows < bound.num_slow_windows_to_bound:
            return None  # one wave's slow window: held (held_cap), not bounded
        factor = max(1 - bound.max_cut_fraction, bound.itl_target_ms / itl_p95_ms)
        scaled = max(1, math.floor(num_running * factor))
        return scaled if cap is None else min(cap, scaled)
    grow_below_ms = bound.grow_below_fraction * bound.itl_target_ms
    if cap is not None and num_running >= cap and itl_p95_ms < grow_below_ms:
        scaled = math.floor(cap * min(bound.max_growth_factor, grow_below_ms / max(itl_p95_ms, 1e-9)))
        return max(cap + 1, scaled)
    return cap


def num_slow_windows(num_before: int, window_p95_ms: float, bound: BatchBound) -> int:
    """Windows in a row over the target, once a window whose own gaps' p95 is ``window_p95_ms`` is judged
    after ``num_before`` such windows (``next_running_cap``'s ``num_slow_windows``)."""
    return num_before + 1 if window_p95_ms > bound.itl_target_ms else 0


def held_cap(most_running: int, itl_p95_ms: float, bound: BatchBound) -> int | None:
    """What a replica not bounded yet, whose inter-token estimate is now ``itl_p95_ms`` with up to
    ``most_running`` requests running since its last judgement, is held at: that batch while the estimate
    is over the target, else None (it takes work by its latency alone)."""
    return most_running if most_running > 0 and itl_p95_ms > bound.itl_target_ms else None
