"""This gateway's view of one replica of a model version, owned by its ``ModelScheduler`` (event loop only):
the engine client that reaches it, whether it takes new work, its load as last read plus what this gateway
knows sooner, and the requests it holds (``Slot``s, one per dispatched request until released).

A replica takes new work unless it is draining (the routing table dropped it: for good) or suspended (a
request to it failed with a connection-level error: ``suspend``). A suspension is local to this gateway
and short: once ``suspension_s`` has passed, the scheduler asks the replica whether it is ready
(``due_for_check``, ``recheck``), which resumes it or suspends it again; so a transient blip does not take
a replica out for good, while a dead one stays out until the control plane's health check fails it in the
registry and the routing table drains it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from sluice.domain import RequestClass
from sluice.engine_client import EngineClient, ReplicaStats
from sluice.policy.batch_bound import BatchBound, held_cap, next_running_cap, num_slow_windows
from sluice.policy.dispatch import EnginePriority, PriorityLoad, ReplicaLoad
from sluice.policy.fair_queue import Waiting

# The replica's inter-token latency is the p95 of its last BatchBound.num_gaps_between_moves gaps between
# the deltas of its requests, as this gateway reads them (a client sees the same gaps), recomputed after
# this many new gaps (a sort of the window), not on every dispatch.
_GAPS_PER_ESTIMATE = 16

log = logging.getLogger(__name__)
_UNKNOWN_KV_TOKENS = 2**62
_READY_CHECK_TIMEOUT_S = 1.0  # a suspended replica's readiness check; no answer: suspended again


@dataclass
class Slot:
    """A dispatched request's claim on one replica, until ``release``; ``engine`` is how to reach it."""

    request: Waiting  # by reference: the gateway's ``Job``
    dispatched_s: float
    engine: EngineClient
    replica_key: str  # the scheduler's key of the replica it was dispatched to
    # Decided at dispatch from the tenant's standing (sluice.policy.dispatch_pass); sent to the engine.
    priority: EnginePriority = EnginePriority.UNDER_SHARE
    has_first_token: bool = False  # set by ``ReplicaView.first_token`` (it counts the ones without)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def tenant_id(self) -> str:
        return self.request.tenant_id

    @property
    def request_class(self) -> RequestClass:
        return self.request.request_class

    @property
    def kv_tokens(self) -> int:
        """What the request may occupy in KV memory at most (its prompt and every token it may make)."""
        return self.request.prompt_tokens + self.request.max_tokens


@dataclass
class ReplicaView:
    engine: EngineClient
    draining: bool = False  # out of rotation for good: nothing new is dispatched to it
    suspended_until_s: float | None = None  # None: not suspended; else when to ask it whether it is ready
    total_kv_tokens: int = 0  # 0: not read yet
    free_kv_tokens: int = 0
    num_waiting: int = 0
    read_at_s: float = -1.0
    dispatched_kv_tokens_since_read: int = 0
    itl_ms: float | None = None  # the p95 of the recent gaps (``observe_gap``); None: none yet
    # The batch bounded by the inter-token target (sluice.policy.batch_bound); None: not bounded yet.
    bound: BatchBound = field(default_factory=BatchBound)
    running_cap: int | None = None
    # Not bounded yet, but its estimate is over the target: held at the batch it ran (batch_bound.held_cap).
    held_at: int | None = None
    slots: dict[str, Slot] = field(default_factory=dict)  # through add and remove only
    # Kept as slots come and go, so a dispatch's reads cost the same with 10 streams or 1,000: per engine
    # priority [requests, of them without a first token, their KV tokens]; per tenant, its requests at
    # each priority; per priority, how many tenants have it as their highest (lowest number) live.
    _by_priority: list[list[int]] = field(init=False)
    _tenant_priorities: dict[str, list[int]] = field(default_factory=dict)
    _num_tenants_topped_at: list[int] = field(init=False)
    _recent_gaps_ms: deque[float] = field(init=False)
    _num_gaps_unestimated: int = 0
    _num_gaps_unjudged: int = 0  # since the cap was last judged: a window of them judges it again
    _most_running_unjudged: int = 0  # the most requests held while those gaps were left
    _num_slow_windows: int = 0  # judged windows in a row each with its own p95 over the target
    # What the next judgement reads: the gaps since the cap last moved (at most bound.num_windows_judged
    # windows), and the most requests held during each of those windows.
    _gaps_since_move_ms: deque[float] = field(init=False)
    _most_running_since_move: deque[int] = field(init=False)

    def __post_init__(self) -> None:
        self._recent_gaps_ms = deque(maxlen=self.bound.num_gaps_between_moves)
        window, num_windows = self.bound.num_gaps_between_moves, self.bound.num_windows_judged
        self._gaps_since_move_ms = deque(maxlen=window * num_windows)
        self._most_running_since_move = deque(maxlen=num_windows)
        self._by_priority = [[0, 0, 0] for _ in EnginePriority]
        self._num_tenants_topped_at = [0 for _ in EnginePriority]

    # ----- taking work -----
    @property
    def takes_work(self) -> bool:
        """In the dispatch pass: neither draining nor suspended."""
        return not self.draining and self.suspended_until_s is None

    def suspend(self, now_s: float, suspension_s: float) -> bool:
        """Out of the dispatch pass until a readiness check after ``suspension_s`` passes; True when it was
        taking work until now (a new suspension, not a repeat from another failed request)."""
        was_suspended = self.suspended_until_s is not None
        self.suspended_until_s = now_s + suspension_s
        return not was_suspended

    def due_for_check(self, now_s: float) -> bool:
        return self.suspended_until_s is not None and now_s >= self.suspended_until_s

    async def recheck(self, suspension_s: float) -> bool:
        """Ask the suspended replica whether it is ready: resume it (True) or suspend it again."""
        try:
            async with asyncio.timeout(_READY_CHECK_TIMEOUT_S):
                ready = await self.engine.ready()
        except Exception:  # TimeoutError included: no answer is not ready
            ready = False
        if ready:
            self.suspended_until_s = None
        else:
            self.suspend(time.monotonic(), suspension_s)
        return ready

    # ----- the requests it holds -----
    def add(self, slot: Slot) -> None:
        assert slot.request_id not in self.slots
        self.slots[slot.request_id] = slot
        self._count(slot, +1)

    def remove(self, request_id: str) -> Slot | None:
        slot = self.slots.pop(request_id, None)
        if slot is not None:
            self._count(slot, -1)
        return slot

    def first_token(self, slot: Slot) -> None:
        """``slot``'s request has its first token (it no longer waits inside the replica)."""
        if not slot.has_first_token:
            slot.has_first_token = True
            if self.slots.get(slot.request_id) is slot:
                self._by_priority[slot.priority][1] -= 1

    def paced(self, slot: Slot) -> bool:
        """Whether the replica paces ``slot``'s stream, by its own rule: another tenant has live work of a
        higher priority (a lower number), so the replica sends this stream at most once per its yield
        interval (the CPU engine's ``YieldPacer``). Its gaps are then the replica's choice, not its pace,
        and do not count towards its inter-token latency."""
        own = self._tenant_priorities.get(slot.tenant_id)
        own_top = _top(own) if own is not None else None
        return any(self._num_tenants_topped_at[p] > (1 if own_top == p else 0) for p in range(slot.priority))

    def _count(self, slot: Slot, sign: int) -> None:
        counts = self._by_priority[slot.priority]
        counts[0] += sign
        counts[1] += sign * (not slot.has_first_token)
        counts[2] += sign * slot.kv_tokens
        tenant = self._tenant_priorities.setdefault(slot.tenant_id, [0 for _ in EnginePriority])
        top_before = _top(tenant)
        tenant[slot.priority] += sign
        top_after = _top(tenant)
        if top_after != top_before:
            if top_before is not None:
                self._num_tenants_topped_at[top_before] -= 1
            if top_after is not None:
                self._num_tenants_topped_at[top_after] += 1
        if top_after is None:
            del self._tenant_priorities[slot.tenant_id]

    # ----- load -----
    def load(self, key: str) -> ReplicaLoad:
        """The replica's load for the dispatch policy: its last read, corrected by what this gateway
        dispatched since and by the requests it holds that have no first token yet."""
        total = self.total_kv_tokens
        if total:
            reserved = sum(counts[2] for counts in self._by_priority)
            free = self.free_kv_tokens - self.dispatched_kv_tokens_since_read
            free = min(free, total - reserved)  # never promise more than this gateway has not reserved
        else:  # not read yet: the KV gate is open (the replica's own admission still applies)
            free = _UNKNOWN_KV_TOKENS
        num_prefilling = sum(counts[1] for counts in self._by_priority)
        return ReplicaLoad(
            replica_id=key,
            free_kv_tokens=free,
            total_kv_tokens=total,
            num_waiting=max(self.num_waiting, num_prefilling),
            num_running=len(self.slots),
            itl_ms=self.itl_ms if self.slots else None,
            by_priority=tuple(PriorityLoad(*counts) for counts in self._by_priority),
            running_cap=self.running_cap if self.running_cap is not None else self.held_at,
        )

    def observe_gap(self, gap_s: float, num_tokens: int) -> bool:
        """``num_tokens`` arrived ``gap_s`` after the previous delta of one of its requests (not a paced
        one: ``paced``). True when the running cap grew or a hold ended (the caller may dispatch more).

        NOTE: the gap itself, not the gap per token: a replica that sends a stream's tokens together once
        per send budget is as smooth as its gaps, and the target is the gap a client waits."""
        del num_tokens  # what the gap carried does not shorten the wait
        self._recent_gaps_ms.append(gap_s * 1000)
        self._gaps_since_move_ms.append(gap_s * 1000)
        self._num_gaps_unestimated += 1
        self._num_gaps_unjudged += 1
        self._most_running_unjudged = max(self._most_running_unjudged, len(self.slots))
        judge = self._num_gaps_unjudged >= self.bound.num_gaps_between_moves
        if self.itl_ms is None or judge or self._num_gaps_unestimated >= _GAPS_PER_ESTIMATE:
            self.itl_ms = p95(self._recent_gaps_ms)
            self._num_gaps_unestimated = 0
            held_before, self.held_at = self.held_at, None
            if self.running_cap is None:  # _most_running_unjudged counts this gap's slots already
                self.held_at = held_cap(self._most_running_unjudged, self.itl_ms, self.bound)
            released = held_before is not None and self.held_at is None and self.running_cap is None
        else:
            released = False
        if not judge:
            return released
        # NOTE: judged on gaps all left since the last move, so one slow window is not cut twice, and a cut
        # is seen to work (or not) before the next; while the cap holds, on up to num_windows_judged windows.
        self._most_running_since_move.append(self._most_running_unjudged)
        self._num_gaps_unjudged, self._most_running_unjudged = 0, 0
        # itl_ms was just estimated on the last window of gaps, the one being judged
        self._num_slow_windows = num_slow_windows(self._num_slow_windows, self.itl_ms, self.bound)
        num_running, judged_p95_ms = max(self._most_running_since_move), p95(self._gaps_since_move_ms)
        cap = next_running_cap(
            self.running_cap, num_running, judged_p95_ms, self.bound, num_slow_windows=self._num_slow_windows
        )
        grew = released or (self.running_cap is not None and cap is not None and cap > self.running_cap)
        if cap != self.running_cap:
            log.debug(
                "replica %s: running cap %s -> %s (up to %d running, inter-token p95 %.1f ms over %d gaps)",
                self.engine.replica, self.running_cap, cap, num_running, judged_p95_ms,
                len(self._gaps_since_move_ms),
            )  # fmt: skip
            self._gaps_since_move_ms.clear()
            self._most_running_since_move.clear()
        self.running_cap = cap
        if cap is not None:
            self.held_at = None  # bounded: the cap holds it now
        return grew

    def apply_stats(self, stats: ReplicaStats, now_s: float) -> None:
        self.total_kv_tokens = stats.num_kv_tokens_total
        self.free_kv_tokens = stats.num_kv_tokens_free
        self.num_waiting = stats.num_waiting
        self.read_at_s = now_s
        self.dispatched_kv_tokens_since_read = 0


def _top(counts_by_priority: list[int]) -> int | None:
    """The highest priority (lowest number) with a request, None for none."""
    return next((p for p, n in enumerate(counts_by_priority) if n), None)


def p95(values_ms: Iterable[float]) -> float:
    """The 95th percentile (nearest rank) of a non-empty collection."""
    ordered = sorted(values_ms)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
