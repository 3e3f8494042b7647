"""Progress lines while a scenario runs, e.g.::

    [sim steady] 30% (t=36 s of 120): 10,112 requests, queue 12, replicas 56
    [sim noisy-tenant: fcfs-noisy] 50% (t=60 s of 120): 17,004 requests, queue 3,210, replicas 56

The fleet reports a ``Tick`` every simulated sample (1 s); a ``ProgressLines`` prints one line each time a
run crosses the next ``every_fraction`` of its arrival window (10 % by default, and once at 100 %), so a
run prints the same lines whatever its length or the machine's speed. A scenario with several fleet runs
(the replica search, noisy-tenant's three) labels each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TextIO


@dataclass(frozen=True)
class Tick:
    """The fleet at one sample: simulated time, arrivals so far, what waits in the gateway's queue."""

    t_s: float
    duration_s: float  # arrivals stop here
    num_arrived: int
    queue_depth: int
    num_replicas: int


class ProgressSink(Protocol):
    """Told of every ``Tick`` of the fleet run called ``label`` ("" for a scenario's only run)."""

    def __call__(self, label: str, tick: Tick) -> None: ...


class ProgressLines:
    """A ``ProgressSink`` writing readable lines to ``stream``; see the module docstring."""

    def __init__(self, stream: TextIO, scenario: str, every_fraction: float = 0.10) -> None:
        if not 0 < every_fraction <= 1:
            raise ValueError(f"every_fraction must be in (0, 1], got {every_fraction}")
        self._stream = stream
        self._scenario = scenario
        self._every_fraction = every_fraction
        self._label: str | None = None
        self._num_shown = 0  # tenths (every_fractions) of the current run already shown

    def __call__(self, label: str, tick: Tick) -> None:
        if label != self._label or tick.t_s == 0.0:  # a new fleet run starts (labels may repeat)
            self._label, self._num_shown = label, 0
        # NOTE: 1e-9 so that 36 s of 120 counts as 3 tenths (0.3 / 0.1 is 2.9999999999999996).
        num_reached = int(min(1.0, tick.t_s / tick.duration_s) / self._every_fraction + 1e-9)
        if num_reached <= self._num_shown:
            return
        self._num_shown = num_reached
        self._stream.write(format_tick(self._scenario, label, tick) + "\n")
        self._stream.flush()


def format_tick(scenario: str, label: str, tick: Tick) -> str:
    name = f"{scenario}: {label}" if label else scenario
    percent = min(100.0, 100.0 * tick.t_s / tick.duration_s)
    t_s = round(min(tick.t_s, tick.duration_s), 1)
    return (
        f"[sim {name}] {percent:.0f}% (t={t_s:g} s of {tick.duration_s:g}): "
        f"{tick.num_arrived:,} requests, queue {tick.queue_depth:,}, replicas {tick.num_replicas}"
    )
