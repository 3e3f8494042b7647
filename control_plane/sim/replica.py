"""One simulated replica: continuous batching with chunked prefill over the roofline step time.

Each step decodes one token for every sequence whose prefill is done, then fills the rest of the step's
token budget (``step_token_budget``, 512 as the engine ships) with prefill chunks, oldest sequence first.
The step that processes a sequence's last prompt chunk also emits its first output token (its TTFT).

NOTE: the engine holds its step time under ``step_time_cap_s`` while anything is decoding, by shrinking
the prefill chunk (the seed: "The engine holds a target inter-token latency ... and admits sequences while
the measured step time stays under it"). It matters here: with the seed's 10 k prefill tokens/s a full
512-token step costs 51.2 ms of compute, over the 40 ms ITL target. The cap is a scheduler setting, like
the budget; the calibration is untouched. ``step_time_cap_s=None`` turns it off.

KV: a sequence handed over reserves prompt + max_tokens at once (the gateway's dispatch only hands over
what fits) and returns it when it finishes, so no preemption is ever needed (and none is modelled).

Cost per step is O(prefill chunks + log n per finishing sequence): the decoding sequences are kept as two
counters (how many, and the sum of their context offsets: a sequence that joined decoding after step k
holds ``prompt + (j - k)`` tokens during step j) and a heap of the steps they finish on.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from control_plane.sim.calibration import Calibration
from control_plane.sim.workload import SimRequest
from sluice.policy.dispatch import ReplicaLoad


@dataclass(frozen=True)
class ReplicaConfig:
    step_token_budget: int = 512
    step_time_cap_s: float | None = 0.038  # 5 % under the 40 ms ITL target, so the p95 lands under it


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
        self.busy_s = 0.0
        self._step: tuple[int, list[tuple[SimRequest, int]], float] | None = None
        self._load: ReplicaLoad | None = None

    # ----- the gateway's view -----
    def load(self) -> ReplicaLoad:
        if self._load is None:
            blocked_kv = sum(r.kv_tokens for r in self.blocked)
            num_partial = len(self.prefill_queue) - self.num_unscheduled
            self._load = ReplicaLoad(
                replica_id=self.replica_id,
                free_kv_tokens=max(0, self.capacity_tokens - self.reserved_tokens - blocked_kv),
                total_kv_tokens=self.capacity_tokens,
                num_waiting=self.num_unscheduled + len(self.blocked),
                num_running=self.num_decoding + num_partial,
                itl_ms=None if self.last_step_s is None else self.last_step_s * 1000.0,  # the last step's
            )
        return self._load

    def submit(self, request: SimRequest) -> None:
        self.blocked.append(request)
        self._admit()
        self._load = None

    def _admit(self) -> None:
        while self.blocked and self.capacity_tokens - self.reserved_tokens >= self.blocked[0].kv_tokens:
            request = self.blocked.popleft()
            self.reserved_tokens += request.kv_tokens
            self.prefill_queue.append(request)
            self.num_unscheduled += 1

    # ----- steps -----
    def start_step(self) -> float | None:
        """Compose the next step; its duration, or None when there is nothing to run (idle)."""
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
            chunk = min(request.prompt_tokens - request.prefilled_tokens, budget)
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

    def end_step(self) -> StepResult:
        assert self._step is not None
        num_decode, chunks, duration_s = self._step
        self._step = None
        j = self.num_steps
        finished: list[SimRequest] = []
        while self._finish_heap and self._finish_heap[0][0] <= j:
            request = heapq.heappop(self._finish_heap)[2]
            self.num_decoding -= 1
            self.sum_offsets -= request.offset
            finished.append(request)
        first_tokens: list[SimRequest] = []
        for request, chunk in chunks:
            request.prefilled_tokens += chunk
            if request.prefilled_tokens < request.prompt_tokens:
                continue
            # NOTE: completed prefills are always a prefix of the queue (chunks go oldest first).
            assert self.prefill_queue[0] is request
            self.prefill_queue.popleft()
            first_tokens.append(request)
            if request.max_tokens <= 1:
                finished.append(request)
                continue
            request.offset = request.prompt_tokens - j
            request.finish_step = j + request.max_tokens - 1
            self.num_decoding += 1
            self.sum_offsets += request.offset
            self._num_pushed += 1
            heapq.heappush(self._finish_heap, (request.finish_step, self._num_pushed, request))
        for request in finished:
            self.reserved_tokens -= request.kv_tokens
        self.num_steps += 1
        self.last_step_s = duration_s
        self.busy_s += duration_s
        self._admit()
        self._load = None
        return StepResult(duration_s, num_decode, first_tokens, finished)
