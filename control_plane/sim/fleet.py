"""The event loop and the gateway side of the simulated fleet, driving the real policies on simulated time.

Per arriving request, in the gateway's order: quota acquire (``InProcessQuotaStore.acquire_now``, tokens =
prompt + max_tokens, lease TTL = the time to its deadline) -> queue admission (``check_queue`` with
``FairQueue.position`` and the ``RateMeter``'s drain rate) -> ``FairQueue.push``.

After every event, one dispatch pass (only when something is queued): ``expire``, then ``peek`` ->
``pick_replica`` over the replicas' ``ReplicaLoad`` -> ``take`` and hand over, until nothing is placed.
Requests dropped on the way (deadline no longer reachable) never reach a replica.

With ``FleetConfig.autoscale``, every ``interval_s`` the autoscaler (``autoscaling.py``: the control
plane's policy) decides from the queue and the window's TTFT and queue waits; only its ``ready`` replicas
are routed, replicas it adds are created when ordered and become routable when their start completes.

On finish: ``settle_now`` with the tokens used. Output tokens are charged to the fair queue
(``charge_output``) every ``sample_period_s`` (1 s) for every decoding request, and the remainder at
finish. NOTE: not token by token as the gateway streams them (that would cost O(running) per step), but
not only at finish either: a tenant's 1 000-token generations would then run 40 s before its counter saw
them, and WFQ would keep dispatching its backlog meanwhile.
"""

from __future__ import annotations

import heapq
import random
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from control_plane.sim.autoscaling import FleetScaler, SimAutoscale
from control_plane.sim.calibration import Calibration
from control_plane.sim.progress import Tick
from control_plane.sim.replica import Replica, ReplicaConfig, StepResult
from control_plane.sim.workload import (
    BATCH_DEADLINE_S,
    DEADLINE_AT_HEAD,
    Arrivals,
    SimRequest,
    Stream,
    interactive_deadline_s,
)
from sluice.domain import Outcome, RequestClass, Tenant
from sluice.policy.dispatch import DispatchConfig
from sluice.policy.dispatch_pass import DispatchPass
from sluice.policy.fair_queue import FairQueue, FairQueueConfig, QueueEntry
from sluice.policy.queue_depth import QueueDepthConfig, check_queue, min_service_s
from sluice.policy.rate import RateMeter
from sluice.policy.share import InFlight
from sluice.stores.quota.base import QuotaDenied
from sluice.stores.quota.inprocess import InProcessQuotaStore

_STEP, _ARRIVAL, _SAMPLE, _READY, _AUTOSCALE = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class FleetConfig:
    num_replicas: int
    duration_s: float  # arrivals stop here
    warmup_s: float  # arrivals before this are left out of the statistics
    drain_s: float = 60.0  # after duration_s: no arrivals, in-flight work finishes; then the rest is open
    seed: int = 0
    fair: bool = True  # False: FairQueue(fair=False), the FCFS baseline
    itl_target_s: float = 0.040
    # What the gateway assumes a prompt's prefill runs at when it judges whether a request can still
    # meet its deadline: half the calibrated 10 k tokens/s, since a prompt shares its steps with the
    # decodes (the gateway's default, SLUICE_PREFILL_TOKENS_PER_S, is the same kind of estimate).
    prefill_estimate_tokens_per_s: float = 5_000.0
    fair_share_tolerance: float = 0.25
    sample_period_s: float = 1.0
    drain_window_s: float = 10.0  # the RateMeter's window
    replica: ReplicaConfig = field(default_factory=ReplicaConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    queue_depth: QueueDepthConfig = field(default_factory=QueueDepthConfig)
    queue: FairQueueConfig = field(default_factory=FairQueueConfig)
    autoscale: SimAutoscale | None = None  # None: num_replicas, all routed, all run long


@dataclass
class FleetRun:
    config: FleetConfig
    calibration: Calibration
    tenants: dict[str, Tenant]
    requests: list[SimRequest]
    step_end_s: array[float]  # per step of any replica
    step_duration_s: array[float]
    step_num_decode: array[float]  # inter-token gaps this step produced (one per decode token)
    step_num_emitted: array[float]  # output tokens this step produced (decode + first tokens)
    samples: list[tuple[float, int, int]]  # (t, queue depth, sequences on replicas)
    busy_s: float  # replica-seconds spent stepping
    scaler: FleetScaler | None = None  # the autoscaler's samples and decisions, when it ran


class Fleet:
    def __init__(
        self,
        config: FleetConfig,
        calibration: Calibration,
        tenants: dict[str, Tenant],
        streams: list[Stream],
        on_sample: Callable[[Tick], None] | None = None,
    ) -> None:
        """``on_sample`` (progress) is told of the fleet at every sample, arrivals' end included."""
        self.config = config
        self._on_sample = on_sample
        self.cal = calibration
        self.tenants = tenants
        self.scaler = None
        if (
            config.autoscale is not None
        ):  # it decides from the warm-up's end: an empty fleet filling is no signal
            first_tick_s = max(config.warmup_s, config.autoscale.interval_s)
            self.scaler = FleetScaler(config.autoscale, config.num_replicas, first_tick_s)
        num_initial = config.num_replicas if self.scaler is None else len(self.scaler.lives)
        self.replicas = [Replica(f"r{i}", calibration, config.replica) for i in range(num_initial)]
        self._index = {r.replica_id: i for i, r in enumerate(self.replicas)}
        self.queue: FairQueue[SimRequest] = FairQueue(config.queue, fair=config.fair)
        self.quota = InProcessQuotaStore(clock=lambda: self.now_s)
        self.meter = RateMeter(config.drain_window_s)
        self.now_s = 0.0
        self.streams = [replace(s, end_s=min(s.end_s, config.duration_s)) for s in streams]
        self._arrivals = [Arrivals(s, random.Random(f"{config.seed}:{s.name}")) for s in self.streams]
        self._rngs = [random.Random(f"{config.seed}:{s.name}:tenant") for s in self.streams]
        self._num_arrived = [0] * len(self.streams)
        self._events: list[tuple[float, int, int, int]] = []
        self._num_events = 0
        self.requests: list[SimRequest] = []
        self._steps: tuple[array[float], ...] = tuple(array("d") for _ in range(4))
        self._samples: list[tuple[float, int, int]] = []
        self._decoding: dict[str, tuple[SimRequest, Replica]] = {}  # output not yet fully charged
        self._num_in_flight = InFlight()  # handed to a replica, not finished
        self._weights = {t.tenant_id: t.weight for t in tenants.values()}

    # ----- the loop -----
    def run(self) -> FleetRun:
        for i, arrivals in enumerate(self._arrivals):
            self._schedule_arrival(i, arrivals)
        self._push(0.0, _SAMPLE, 0)
        if self.scaler is not None:
            self._push(self.scaler.first_tick_s, _AUTOSCALE, 0)
        end_s = self.config.duration_s + self.config.drain_s
        while self._events:
            t, _, kind, arg = heapq.heappop(self._events)
            if t > end_s:
                break
            self.now_s = t
            if kind == _STEP:
                self._end_step(self.replicas[arg])
            elif kind == _ARRIVAL:
                self._arrive(arg)
            elif kind == _SAMPLE:
                self._sample()
            elif kind == _READY:
                assert self.scaler is not None
                self.scaler.complete(arg)
            else:
                self._autoscale(end_s)
            if len(self.queue):
                self._dispatch()
        step_end_s, step_duration_s, step_num_decode, step_num_emitted = self._steps
        return FleetRun(
            self.config,
            self.cal,
            self.tenants,
            self.requests,
            step_end_s,
            step_duration_s,
            step_num_decode,
            step_num_emitted,
            self._samples,
            sum(r.busy_s for r in self.replicas),
            self.scaler,
        )

    def _push(self, t: float, kind: int, arg: int) -> None:
        self._num_events += 1
        heapq.heappush(self._events, (t, self._num_events, kind, arg))

    def _schedule_arrival(self, i: int, arrivals: Arrivals) -> None:
        limit = self.streams[i].max_requests
        if limit is not None and self._num_arrived[i] >= limit:
            return
        t = arrivals.next_s()
        if t is not None:
            self._push(t, _ARRIVAL, i)

    def _charge_decoding(self) -> None:
        for request, replica in self._decoding.values():
            self._charge(request, request.num_output_at(replica.num_steps))

    def _charge(self, request: SimRequest, produced: int) -> None:
        if produced > request.charged_tokens:
            tokens = produced - request.charged_tokens
            self.queue.charge_output(request.tenant_id, request.request_class, tokens, self.now_s)
            request.charged_tokens = produced

    def _sample(self) -> None:
        self._charge_decoding()
        on_replicas = sum(r.load().num_running + r.load().num_waiting for r in self.replicas)
        self._samples.append((self.now_s, len(self.queue), on_replicas))
        if self.scaler is not None:
            self.scaler.sample(self.now_s)
        if self._on_sample is not None:
            num_routed = len(self._routable())
            tick = Tick(self.now_s, self.config.duration_s, len(self.requests), len(self.queue), num_routed)
            self._on_sample(tick)
        if self.now_s < self.config.duration_s:  # the last sample is at the arrivals' end exactly
            next_s = min(self.now_s + self.config.sample_period_s, self.config.duration_s)
            self._push(next_s, _SAMPLE, 0)

    # ----- gateway: admission -----
    def _arrive(self, i: int) -> None:
        now_s = self.now_s
        stream = self.streams[i]
        self._num_arrived[i] += 1
        tenant = self.tenants[self._rngs[i].choice(stream.tenant_ids)]
        if stream.request_class is RequestClass.INTERACTIVE:
            deadline_s = now_s + interactive_deadline_s(stream.output_tokens, self.config.itl_target_s)
        else:
            deadline_s = now_s + BATCH_DEADLINE_S
        request = SimRequest(
            request_id=f"{stream.name}-{self._num_arrived[i]}",
            tenant_id=tenant.tenant_id,
            request_class=stream.request_class,
            prompt_tokens=stream.prompt_tokens,
            max_tokens=stream.output_tokens,
            arrival_s=now_s,
            deadline_s=deadline_s,
            weight=tenant.weight,
        )
        self.requests.append(request)
        self._schedule_arrival(i, self._arrivals[i])
        grant = self.quota.acquire_now(tenant, request.kv_tokens, deadline_s - now_s, now_s)
        if isinstance(grant, QuotaDenied):
            self._refuse(request, f"quota_{grant.limit.value}", grant.retry_after_s)
            return
        request.grant = grant
        position = self.queue.position(tenant.tenant_id, tenant.weight, request.request_class)
        refusal = check_queue(
            position,
            self.meter.rate_per_s(now_s),
            now_s,
            deadline_s,
            self._min_service_s(request),
            self.config.queue_depth,
        )
        if refusal is not None:
            self.quota.settle_now(grant, 0, now_s)
            self._refuse(request, "queue_depth", refusal.retry_after_s)
            return
        entry = QueueEntry(request, payload=request)
        self.queue.push(entry)

    def _min_service_s(self, request: SimRequest) -> float:
        """The least time serving it takes, with the gateway's policy function: the requests here must
        FINISH by their deadline (the statistic checked is "finished past its deadline"), so every
        output token counts, at the ITL target."""
        return min_service_s(
            request.prompt_tokens,
            request.max_tokens,
            self.config.prefill_estimate_tokens_per_s,
            self.config.itl_target_s * 1000,
        )

    def _entry_min_service_s(self, entry: QueueEntry[SimRequest]) -> float:
        return self._min_service_s(entry.payload)

    def _refuse(self, request: SimRequest, reason: str, retry_after_s: float | None) -> None:
        request.outcome = Outcome.REFUSED
        request.reason = reason
        request.retry_after_s = retry_after_s

    def _drop(self, entry: QueueEntry[SimRequest]) -> None:
        request = entry.payload
        assert request.grant is not None
        self.quota.settle_now(request.grant, 0, self.now_s)
        request.outcome = Outcome.REFUSED  # as the gateway's 429: never reached a replica
        request.reason = DEADLINE_AT_HEAD  # no Retry-After

    # ----- gateway: dispatch -----
    def _dispatch(self) -> None:
        now_s = self.now_s
        for entry in self.queue.expire(now_s, self._entry_min_service_s):
            self._drop(entry)
        routable = self._routable()
        position = {i: k for k, i in enumerate(routable)}
        loads = [self.replicas[i].load() for i in routable]
        dispatch = DispatchPass(
            self.queue,
            now_s,
            self.config.dispatch,
            self._entry_min_service_s,
            self.config.fair_share_tolerance,
            share_aware=self.config.fair,
        )
        while (placed := dispatch.next(loads, self._num_in_flight, self._weights)) is not None:
            head = placed.entry
            self.queue.take(head, now_s)
            self.meter.observe(now_s)
            index = self._index[placed.replica.replica_id]
            replica = self.replicas[index]
            head.payload.dispatch_s = now_s
            if self.scaler is not None and head.request_class is RequestClass.INTERACTIVE:
                self.scaler.observe_wait(now_s, now_s - head.payload.arrival_s)
            head.payload.priority = placed.priority
            self._num_in_flight.add(head.request_class, head.tenant_id)
            replica.submit(head.payload)
            if not replica.busy:
                self._start_step(index)
            loads[position[index]] = replica.load()
        for entry in dispatch.dropped:
            self._drop(entry)

    # ----- replicas -----
    def _start_step(self, index: int) -> None:
        replica = self.replicas[index]
        duration_s = replica.start_step()
        for request in replica.take_preempted():  # recomputed before it decodes (and is charged) again
            self._decoding.pop(request.request_id, None)
        if duration_s is not None:
            self._push(self.now_s + duration_s, _STEP, index)

    def _end_step(self, replica: Replica) -> None:
        now_s = self.now_s
        result: StepResult = replica.end_step()
        for request in result.first_tokens:
            if request.first_token_s is None:  # not a recompute after a preemption
                request.first_token_s = now_s
                if self.scaler is not None and request.request_class is RequestClass.INTERACTIVE:
                    self.scaler.observe_ttft(now_s, now_s - request.arrival_s)
            self._decoding[request.request_id] = (request, replica)
        for request in result.finished:
            request.finish_s = now_s
            request.outcome = Outcome.FINISHED
            assert request.grant is not None
            self.quota.settle_now(request.grant, request.prompt_tokens + request.max_tokens, now_s)
            self._charge(request, request.max_tokens)
            self._decoding.pop(request.request_id, None)
            self._num_in_flight.remove(request.request_class, request.tenant_id)
        end_s, duration_s, num_decode, num_emitted = self._steps
        end_s.append(now_s)
        duration_s.append(result.duration_s)
        num_decode.append(result.num_decode_tokens)
        num_emitted.append(result.num_decode_tokens + len(result.first_tokens))
        index = self._index[replica.replica_id]
        self._start_step(index)
        if self.scaler is not None and not replica.busy:
            self.scaler.idle(index)

    # ----- the autoscaler -----
    def _routable(self) -> list[int]:
        if self.scaler is None:
            return list(range(len(self.replicas)))
        return [i for i in range(len(self.replicas)) if self.scaler.routable(i)]

    def _autoscale(self, end_s: float) -> None:
        assert self.scaler is not None and self.config.autoscale is not None
        for index, at_s in self.scaler.tick(self.now_s, len(self.queue)):
            while index >= len(self.replicas):  # a new replica: it exists (and costs) from now on
                replica = Replica(f"r{len(self.replicas)}", self.cal, self.config.replica)
                self._index[replica.replica_id] = len(self.replicas)
                self.replicas.append(replica)
            self._push(at_s, _READY, index)
        for index, replica in enumerate(self.replicas):
            if not replica.busy:
                self.scaler.idle(index)  # a replica drained with nothing in flight stops now
        if self.now_s + self.config.autoscale.interval_s <= end_s:
            self._push(self.now_s + self.config.autoscale.interval_s, _AUTOSCALE, 0)
