"""One simulated replica: continuous batching with chunked prefill over the roofline step time.

Each step decodes one token for every sequence whose prefill is done, then fills the rest of the step's
token budget (``step_token_budget``, 512 as the engine ships) with prefill chunks, oldest sequence first.
The step that processes a sequence's last prompt chunk also emits its first output token (its TTFT).

NOTE: the engine holds its step time under ``step_time_cap_s`` while anything is decoding, by shrinking
the prefill chunk (the seed: "The engine holds a target inter-token latency ... and admits sequences while
the measured step time stays under it"). It matters here: with the seed's 10 k prefill tokens/s a full
512-token step costs 51.2 ms of compute, over the 40 ms ITL target. The cap is a scheduler setting, like
the budget; the calibration is untouched. ``step_time_cap_s=None`` turns it off.

KV: a sequence handed over reserves prompt + max_tokens at once and returns it when it finishes. The
gateway's dispatch hands over what fits, except a request that may go ahead of lower-priority work
(``ReplicaLoad.by_priority``): as the engine does, the replica then preempts the lowest-priority, most
recently admitted sequences of a strictly lower priority at the next step boundary, if that makes room.
A victim goes back to the front of its priority's line and is recomputed (its prompt and its output so
far: a full prefill, where the engine's prefix cache would make it cheaper) before it decodes again.

Cost per step is O(prefill chunks + log n per finishing sequence): the decoding sequences are kept as two
counters (how many, and the sum of their context offsets: a sequence that joined decoding after step k
holds ``prompt + (j - k)`` tokens during step j) and a heap of the steps they finish on.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from control_plane.sim.calibration import Calibration
from control_plane.sim.workload import SimRequest
from sluice.policy.batch_bound import BatchBound, held_cap, next_running_cap, num_slow_windows
from sluice.policy.dispatch import EnginePriority, PriorityLoad, ReplicaLoad


@dataclass(frozen=True)
class ReplicaConfig:
    step_token_budget: int = 512
    step_time_cap_s: float | None = 0.038  # 5 % under the 40 ms ITL target, so the p95 lands under it
    # The gateway's batch bound, judged on the gaps the replica's decoding sequences leave (each decode
    # token one gap of its step's length), as the gateway judges the gaps it reads.
    batch_bound: BatchBound = field(default_factory=BatchBound)


@dataclass
class StepResult:
    duration_s: float
    num_decode_tokens: int  # tokens from sequences already decoding: each one an inter-token gap
    first_tokens: list[SimRequest]  # finished their prefill this step: TTFT
    finished: list[SimRequest]


class Replica:
    def __init__(self, replica_id: str, calibration: Calibration, config: ReplicaConfig) -> None:
        self.replica_id = replica_id
        self.cal = calibration
        self.config = config
        self.capacity_tokens = calibration.kv_capacity_tokens
        self.reserved_tokens = 0
        self.blocked: deque[SimRequest] = deque()  # handed over, KV did not fit yet (rare)
        self.prefill_queue: deque[SimRequest] = deque()  # KV reserved, prompt not done; oldest first
        self.num_unscheduled = 0  # in prefill_queue with no chunk scheduled yet: "waiting"
        self.num_decoding = 0
        self.sum_offsets = 0
        self._finish_heap: list[tuple[int, int, SimRequest]] = []
        self._num_pushed = 0
        self.num_steps = 0
        self.busy = False
        self.last_step_s: float | None = None
        self.running_cap: int | None = None  # the batch bound (sluice.policy.batch_bound)
        self._unjudged_gaps: list[tuple[float, int]] = []  # (gap ms, how many) since the cap was judged
        self._num_unjudged_gaps = 0
        self._most_running_unjudged = 0  # the most requests running while those gaps were left
        self._num_slow_windows = 0  # judged windows in a row each with its own p95 over the target
        # The windows judged since the cap last moved (at most batch_bound.num_windows_judged): each one's
        # gaps, their number and the most requests running while they were left.
        self._windows_since_move: deque[tuple[list[tuple[float, int]], int, int]] = deque(
            maxlen=config.batch_bound.num_windows_judged
        )
        self.busy_s = 0.0
        self._step: tuple[int, list[tuple[SimRequest, int]], float] | None = None
        self._load: ReplicaLoad | None = None
        self._admitted: dict[str, SimRequest] = {}  # KV reserved, not finished; oldest admitted first
        self._heap_ids: dict[str, int] = {}  # decoding request -> its entry in _finish_heap
        self._stale: set[int] = set()  # heap entries of preempted requests, skipped when popped
        self.preempted: list[SimRequest] = []  # since the caller last took them (take_preempted)
        # Handed over and not finished, per EnginePriority: [requests, of which without a first token, KV].
        self._by_priority = [[0, 0, 0] for _ in EnginePriority]

    # ----- the gateway's view -----
    @property
    def _num_handed_over(self) -> int:
        """Requests handed over and not finished: what the gateway counts as running here."""
        return sum(counts[0] for counts in self._by_priority)

    def load(self) -> ReplicaLoad:
        if self._load is None:
            blocked_kv = sum(r.kv_tokens for r in self.blocked)
            num_partial = len(self.prefill_queue) - self.num_unscheduled
            itl_ms = None if self.last_step_s is None else self.last_step_s * 1000.0  # the last step's
            # Not bounded yet but over the target: held at the batch it runs, as the gateway holds it.
            num_running = self._num_handed_over
            held = None if itl_ms is None else held_cap(num_running, itl_ms, self.config.batch_bound)
            self._load = ReplicaLoad(
                replica_id=self.replica_id,
                free_kv_tokens=max(0, self.capacity_tokens - self.reserved_tokens - blocked_kv),
                total_kv_tokens=self.capacity_tokens,
                num_waiting=self.num_unscheduled + len(self.blocked),
                num_running=self.num_decoding + num_partial,
                itl_ms=itl_ms,
                by_priority=tuple(PriorityLoad(*counts) for counts in self._by_priority),
                running_cap=self.running_cap if self.running_cap is not None else held,
            )
        return self._load

    def submit(self, request: SimRequest) -> None:
        counts = self._by_priority[request.priority]
        counts[0] += 1
        counts[1] += 1
        counts[2] += request.kv_tokens
        self._enqueue_blocked(request)
        self._admit()
        self._load = None

    def take_preempted(self) -> list[SimRequest]:
        preempted, self.preempted = self.preempted, []
        return preempted

    def _enqueue_blocked(self, request: SimRequest, front: bool = False) -> None:
        """Into ``blocked`` by priority: behind its priority's line, or at its front (a preempted one)."""
        behind = (
            i
            for i, queued in enumerate(self.blocked)
            if queued.priority > request.priority or (front and queued.priority == request.priority)
        )
        self.blocked.insert(next(behind, len(self.blocked)), request)

    def _admit(self) -> None:
        while self.blocked and self.capacity_tokens - self.reserved_tokens >= self.blocked[0].kv_tokens:
            request = self.blocked.popleft()
            self.reserved_tokens += request.kv_tokens
            self.prefill_queue.append(request)
            self.num_unscheduled += 1
            self._admitted[request.request_id] = request

    def _preempt_for_blocked(self) -> None:
        """Preempt lower-priority sequences for the head of ``blocked`` while that makes room for it."""
        while self.blocked:
            head = self.blocked[0]
            deficit = head.kv_tokens - (self.capacity_tokens - self.reserved_tokens)
            if deficit <= 0:
                return
            eligible = [r for r in self._admitted.values() if r.priority > head.priority]
            if sum(r.kv_tokens for r in eligible) < deficit:
                return
            # Lowest priority first, then the most recently admitted (dict order is admission order).
            order = sorted(range(len(eligible)), key=lambda i: (eligible[i].priority, i), reverse=True)
            for i in order:
                self._preempt(eligible[i])
                deficit -= eligible[i].kv_tokens
                if deficit <= 0:
                    break
            self._admit()

    def _preempt(self, request: SimRequest) -> None:
        del self._admitted[request.request_id]
        push_id = self._heap_ids.pop(request.request_id, None)
        if push_id is not None:  # decoding: it keeps the tokens it made, recomputed when it comes back
            self._stale.add(push_id)
            self.num_decoding -= 1
            self.sum_offsets -= request.offset
            request.num_output_before = request.num_output_at(self.num_steps)
        else:
            self.prefill_queue.remove(request)
            if request.prefilled_tokens == 0:
                self.num_unscheduled -= 1
        request.prefilled_tokens = 0
        request.num_preemptions += 1
        self.reserved_tokens -= request.kv_tokens
        self._enqueue_blocked(request, front=True)
        self.preempted.append(request)

    # ----- steps -----
    def start_step(self) -> float | None:
        """Compose the next step; its duration, or None when there is nothing to run (idle)."""
        if self.blocked:
            self._preempt_for_blocked()
        num_decode = self.num_decoding
        budget = self.config.step_token_budget - num_decode
        cap_s = self.config.step_time_cap_s
        if cap_s is not None and num_decode > 0:
            budget = min(budget, math.floor(cap_s / self.cal.compute_s_per_token + 1e-9) - num_decode)
        chunks: list[tuple[SimRequest, int]] = []
        prefill_context = 0
        for request in self.prefill_queue:
            if budget <= 0:
                break
            chunk = min(request.prefill_tokens - request.prefilled_tokens, budget)
            if request.prefilled_tokens == 0:
                self.num_unscheduled -= 1
            chunks.append((request, chunk))
            prefill_context += request.prefilled_tokens + chunk
            budget -= chunk
        num_tokens = num_decode + sum(chunk for _, chunk in chunks)
        if num_tokens == 0:
            self.busy = False
            return None
        context = self.sum_offsets + num_decode * self.num_steps + prefill_context
        duration_s = self.cal.step_time_s(num_tokens, context)
        self._step = (num_decode, chunks, duration_s)
        self.busy = True
        self._load = None
        return duration_s

    def _judge_cap(self, gap_ms: float, num_gaps: int) -> None:
        """The batch bound, as the gateway keeps it: judged once per window of new gaps, on the gaps since
        the cap last moved (at most ``num_windows_judged`` windows)."""
        if num_gaps == 0:
            return
        self._unjudged_gaps.append((gap_ms, num_gaps))
        self._num_unjudged_gaps += num_gaps
        self._most_running_unjudged = max(self._most_running_unjudged, self._num_handed_over)
        bound = self.config.batch_bound
        if self._num_unjudged_gaps < bound.num_gaps_between_moves:
            return
        windows = self._windows_since_move
        windows.append((self._unjudged_gaps, self._num_unjudged_gaps, self._most_running_unjudged))
        window_p95_ms = _weighted_p95(self._unjudged_gaps, self._num_unjudged_gaps)
        self._num_slow_windows = num_slow_windows(self._num_slow_windows, window_p95_ms, bound)
        self._unjudged_gaps, self._num_unjudged_gaps, self._most_running_unjudged = [], 0, 0
        gaps = [pair for window_gaps, _, _ in windows for pair in window_gaps]
        p95_ms = _weighted_p95(gaps, sum(num for _, num, _ in windows))
        num_running = max(most for _, _, most in windows)
        cap = next_running_cap(
            self.running_cap, num_running, p95_ms, bound, num_slow_windows=self._num_slow_windows
        )
        if cap != self.running_cap:
            windows.clear()
        self.running_cap = cap

    def end_step(self) -> StepResult:
        assert self._step is not None
        num_decode, chunks, duration_s = self._step
        self._step = None
        j = self.num_steps
        finished: list[SimRequest] = []
        while self._finish_heap and self._finish_heap[0][0] <= j:
            _, push_id, request = heapq.heappop(self._finish_heap)
            if push_id in self._stale:  # preempted since
                self._stale.discard(push_id)
                continue
            del self._heap_ids[request.request_id]
            self.num_decoding -= 1
            self.sum_offsets -= request.offset
            finished.append(request)
        first_tokens: list[SimRequest] = []
        for request, chunk in chunks:
            request.prefilled_tokens += chunk
            if request.prefilled_tokens < request.prefill_tokens:
                continue
            # NOTE: completed prefills are always a prefix of the queue (chunks go oldest first).
            assert self.prefill_queue[0] is request
            self.prefill_queue.popleft()
            first_tokens.append(request)
            if request.num_output_before == 0:
                self._by_priority[request.priority][1] -= 1  # its first token: no longer waiting
            num_left = request.max_tokens - request.num_output_before
            if num_left <= 1:
                finished.append(request)
                continue
            request.offset = request.prefill_tokens - j
            request.finish_step = j + num_left - 1
            self.num_decoding += 1
            self.sum_offsets += request.offset
            self._num_pushed += 1
            self._heap_ids[request.request_id] = self._num_pushed
            heapq.heappush(self._finish_heap, (request.finish_step, self._num_pushed, request))
        for request in finished:
            self.reserved_tokens -= request.kv_tokens
            del self._admitted[request.request_id]
            counts = self._by_priority[request.priority]
            counts[0] -= 1
            counts[2] -= request.kv_tokens
        self.num_steps += 1
        self.last_step_s = duration_s
        self.busy_s += duration_s
        self._judge_cap(duration_s * 1000.0, num_decode)
        self._admit()
        self._load = None
        return StepResult(duration_s, num_decode, first_tokens, finished)


def _weighted_p95(values: list[tuple[float, int]], num_values: int) -> float:
    """The p95 (nearest rank) of ``num_values`` values given as (value, how many) pairs."""
    rank, seen = math.ceil(0.95 * num_values), 0
    for value, count in sorted(values):
        seen += count
        if seen >= rank:
            return value
    raise ValueError("num_values is more than the pairs hold")
