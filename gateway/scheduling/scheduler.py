"""One model version's scheduler in the gateway: the fair queue, the drain rate, this gateway's view of
each replica's load, and the dispatch decisions, all owned here and touched only from the event loop.

Its replicas all serve the same version (the router picked the version before the request queued here):
``add_replica`` puts one in rotation under a key (one per admission: a replica re-admitted with a new
client while its old requests finish is two entries); ``drain_replica`` takes one out of it (nothing new
is dispatched to it, what it holds finishes) and hands its engine client to ``on_drained`` once its last
request ended.

``wait_for_dispatch(job)`` admits a request to the queue (or refuses it: 429 ``service_overloaded`` with
a Retry-After from the measured drain rate) and returns once it is dispatched; a request that can no
longer meet its deadline is dropped at the head instead and never reaches a replica. Decisions are the
pure policies in ``sluice.policy``, the same code the fleet simulator runs.

The replica's load combines its metrics (read every ``replica_poll_interval_ms``) with what this gateway
knows sooner: requests it dispatched since the last read, requests dispatched that have no first token
yet (waiting or in prefill inside the replica), and the inter-token gaps it observes.

Failover: a replica a request could not reach (a connection-level error) is ``suspend``ed at once: out of
the dispatch pass until it answers a readiness check (``gateway.scheduling.replicas``). A request that
lost its replica before sending any output comes back through ``wait_for_dispatch(..., redispatch=True)``:
it goes ahead of the fair queue (with its arrival, tenant, class and deadline) and on to another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from gateway.errors import refused
from gateway.metrics import GatewayMetrics
from gateway.scheduling.replicas import ReplicaView, Slot
from sluice.domain import RequestClass
from sluice.engine_client import EngineClient, ReplicaStats
from sluice.policy.affinity import AffinityMemory
from sluice.policy.batch_bound import BatchBound
from sluice.policy.dispatch import DispatchConfig
from sluice.policy.dispatch_pass import DispatchPass
from sluice.policy.fair_queue import FairQueue, FairQueueConfig, QueueEntry, Waiting
from sluice.policy.placement import PlacementRule, ScoreWeights, prefix_key
from sluice.policy.queue_depth import QueueDepthConfig, check_queue, min_service_s
from sluice.policy.rate import RateMeter
from sluice.policy.share import InFlight
from sluice.settings import Settings

log = logging.getLogger(__name__)

_EXPIRE_PERIOD_S = 0.05  # how often waiting requests are checked against their deadlines

__all__ = ["ModelScheduler", "Slot"]


class ModelScheduler:
    def __init__(
        self,
        model: str,
        engines: Iterable[EngineClient],
        settings: Settings,
        metrics: GatewayMetrics,
        *,
        version: str = "1",
        pool: str = "general",  # the version's replica pool it queues for (a registry ReplicaPool)
        fair: bool = True,
        on_drained: Callable[[EngineClient], None] | None = None,
    ) -> None:
        self.model = model
        self.version = version
        self.pool = pool
        self._settings = settings
        self._metrics = metrics
        self._queue: FairQueue[asyncio.Future[Slot]] = FairQueue(
            FairQueueConfig(
                batch_floor_share=settings.batch_floor_share, batch_max_wait_s=settings.batch_max_wait_s
            ),
            fair=fair,
        )
        # Requests whose replica lost them before a first token: dispatched ahead of ``_queue``.
        self._redispatched: FairQueue[asyncio.Future[Slot]] = FairQueue(self._queue.config, fair=fair)
        self._queue_depth = QueueDepthConfig()
        self._dispatch = DispatchConfig(
            itl_target_ms=settings.itl_setpoint_ms,
            max_waiting_per_replica=settings.max_waiting_per_replica,
            yield_kv_reserve_fraction=settings.yield_kv_reserve_fraction,
            batch_itl_fraction=settings.batch_itl_fraction,
            over_share_itl_fraction=settings.over_share_itl_fraction,
            weights=ScoreWeights(
                kv_headroom=settings.router_weight_kv_headroom,
                waiting=settings.router_weight_waiting,
                itl=settings.router_weight_itl,
                prefix=settings.router_weight_prefix,
            ),
            placement=PlacementRule(settings.router_placement),
        )
        self._affinity = AffinityMemory(ttl_s=settings.router_affinity_ttl_s)
        self._drain = RateMeter(window_s=10.0)
        self._task: asyncio.Task[None] | None = None
        self._on_drained = on_drained
        self._bound = BatchBound(itl_target_ms=settings.itl_setpoint_ms)
        self._replicas = {e.replica: ReplicaView(e, bound=self._bound) for e in engines}
        self._num_in_flight = InFlight()  # dispatched, not yet released
        self._weights: dict[str, float] = {}

    # ----- life -----
    async def start(self) -> None:
        await self._read_replicas()
        self._task = asyncio.create_task(self._background(), name=f"scheduler-{self.model}-{self.version}")

    async def close(self) -> None:
        """Stop its background work; requests still waiting fail with 503 ``model_unavailable`` (their
        version left routing with them queued) rather than wait for a dispatch that will not come."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.refuse_waiting()

    def refuse_waiting(self) -> int:
        """Fail every request still waiting for dispatch with 503 ``model_unavailable`` (Retry-After 1 s):
        its version left routing, so no replica of it will take them; a retry is routed afresh (the
        official SDKs retry a 503 by themselves). Returns how many."""
        num_refused = 0
        for queue in (self._redispatched, self._queue):
            for entry in queue.drain():
                if not entry.payload.done():
                    num_refused += 1
                    entry.payload.set_exception(
                        refused(
                            503,
                            "model_unavailable",
                            f"Model '{self.model}' version {self.version} left routing while this request "
                            "waited for a replica. Retry shortly.",
                            1.0,
                            error_type="server_error",
                        )
                    )
        self._update_depth()
        return num_refused

    # ----- replicas -----
    async def add_replica(self, engine: EngineClient, key: str | None = None) -> None:
        """Put ``engine``'s replica in rotation under ``key`` (default: ``engine.replica``), its load read
        first; a key already draining comes back into rotation."""
        key = key or engine.replica
        view = self._replicas.get(key)
        if view is None:
            view = self._replicas[key] = ReplicaView(engine, draining=True, bound=self._bound)
            await self._read_replica(key, view)
        elif view.engine is not engine:
            raise ValueError(f"replica key {key!r} is held by another engine client")
        view.draining = False
        self._dispatch_pass(time.monotonic())

    def drain_replica(self, replica_id: str) -> None:
        """Take a replica out of rotation: its requests finish, nothing new goes to it. Once it holds none,
        it is forgotten and its engine client handed to ``on_drained`` (to close)."""
        view = self._replicas.get(replica_id)
        if view is not None:
            view.draining = True
            self._forget_if_drained(replica_id)

    def suspend(self, slot: Slot) -> None:
        """A request on ``slot``'s replica failed to reach it (a connection-level error): the replica takes
        nothing new from this gateway until it answers a readiness check, the first one
        ``replica_suspension_ms`` from now (a repeat failure restarts that wait). NOTE: not the last
        replica taking work: with none to steer to, requests keep failing fast (503) instead of queueing
        until their deadline."""
        view = self._replicas.get(slot.replica_key)
        if view is None or not self.takes_work_besides(slot):
            return
        if view.suspend(time.monotonic(), self._settings.replica_suspension_ms / 1000):
            log.warning(
                "replica %s (%s version %s) suspended: a request could not reach it",
                slot.replica_key, self.model, self.version,
            )  # fmt: skip
            self._metrics.replica_suspensions.labels(self.model, self.version).inc()

    def takes_work_besides(self, slot: Slot) -> bool:
        """Another replica than ``slot``'s is in the dispatch pass (neither draining nor suspended)."""
        return any(view.takes_work for key, view in self._replicas.items() if key != slot.replica_key)

    @property
    def replica_ids(self) -> list[str]:
        """The replicas in rotation (not draining)."""
        return [rid for rid, view in self._replicas.items() if not view.draining]

    @property
    def num_in_flight(self) -> int:
        return sum(len(view.slots) for view in self._replicas.values())

    def in_flight_at(self, endpoint: str) -> tuple[frozenset[str], frozenset[str]]:
        """The ids of the requests dispatched to the replica at ``endpoint`` (its engine client's
        ``replica``) and not released: (with a first token, without)."""
        views = [view for view in list(self._replicas.values()) if view.engine.replica == endpoint]
        slots = [slot for view in views for slot in list(view.slots.values())]
        started = frozenset(s.request_id for s in slots if s.has_first_token)
        return started, frozenset(s.request_id for s in slots) - started

    def _forget_if_drained(self, replica_id: str) -> None:
        view = self._replicas[replica_id]
        if view.draining and not view.slots:
            del self._replicas[replica_id]
            self._metrics.forget_replica(self.model, self.version, view.engine.replica)
            if self._on_drained is not None:
                self._on_drained(view.engine)

    # ----- the request path -----
    def min_service_s(self, prompt_tokens: int) -> float:
        """The least time a request needs to START once dispatched: its prefill and a first token. The
        deadline cuts generation short, so max_tokens is a ceiling, not something to refuse over."""
        settings = self._settings
        return min_service_s(prompt_tokens, 1, settings.prefill_tokens_per_s, settings.itl_target_ms)

    def prefix_key(self, tenant_id: str, prompt_token_ids: Sequence[int]) -> int | None:
        """The key this scheduler's prefix affinity places a request by (``placement.prefix_key`` over
        ``router_prefix_blocks`` blocks); None: the prompt is shorter than one KV block."""
        return prefix_key(tenant_id, prompt_token_ids, num_blocks=self._settings.router_prefix_blocks)

    async def wait_for_dispatch(
        self, req: Waiting, *, prefix_key: int | None = None, redispatch: bool = False
    ) -> Slot:
        """Queue the request (held by reference: the gateway's ``Job``) and return its slot once
        dispatched; ``prefix_key``: this scheduler's ``prefix_key`` of its tenant and prompt. Raises
        ``OpenAIError`` (429) if it is refused or dropped; if the caller is cancelled while waiting, the
        request leaves the queue.

        ``redispatch``: its replica lost it before it sent any output (released, and suspended by the
        caller). It waits ahead of the fair queue, is never refused for the queue's length, and is counted
        in ``sluice_gateway_redispatches``; a deadline it can no longer meet still drops it (429)."""
        now = time.monotonic()
        if redispatch:
            queue = self._redispatched
            self._metrics.redispatches.labels(self.model, self.version).inc()
        else:
            self._refuse_if_full(req, now)
            queue = self._queue
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        queue.push(QueueEntry(req, future, prefix_key))
        self._dispatch_pass(now)
        self._update_depth()
        try:
            return await future
        except asyncio.CancelledError:
            queue.remove(req.request_id)
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result())  # dispatched in the same instant the caller left
            self._update_depth()
            raise

    def _refuse_if_full(self, req: Waiting, now: float) -> None:
        """429 ``service_overloaded`` when the queue ahead leaves too little time before its deadline."""
        position = self._queue.position(req.tenant_id, req.weight, req.request_class)
        refusal = check_queue(
            position,
            self._drain.rate_per_s(now),
            now,
            req.deadline_s,
            self.min_service_s(req.prompt_tokens),
            self._queue_depth,
        )
        if refusal is not None:
            self._metrics.count_refused(self.model, "service_overloaded")
            raise refused(
                429,
                "service_overloaded",
                f"Model '{self.model}' is at capacity: about {refusal.expected_wait_s:.1f} s of queue ahead "
                f"of this request leaves too little time before its deadline. Retry after "
                f"{refusal.retry_after_s:.1f} s.",
                refusal.retry_after_s,
            )

    def on_tokens(self, slot: Slot, num_tokens: int, gap_s: float | None) -> None:
        """A delta of ``num_tokens`` arrived for ``slot``, ``gap_s`` after the previous one (None: first)."""
        now = time.monotonic()
        self._queue.charge_output(slot.tenant_id, slot.request_class, num_tokens, now)
        view = self._replicas.get(slot.replica_key)
        grew = False
        if view is not None and gap_s is not None and num_tokens > 0 and not view.paced(slot):
            grew = view.observe_gap(gap_s, num_tokens)
        if not slot.has_first_token:
            if view is not None:
                view.first_token(slot)
            else:  # its replica left the table: nothing counts it
                slot.has_first_token = True
            self._dispatch_pass(now)  # one fewer request waiting inside the replica
        elif grew:
            self._dispatch_pass(now)  # its running cap grew: room for one more

    def release(self, slot: Slot) -> None:
        """The request ended (however): its claim on the replica goes."""
        view = self._replicas.get(slot.replica_key)
        if view is not None and view.remove(slot.request_id) is not None:
            self._num_in_flight.remove(slot.request_class, slot.tenant_id)
            self._forget_if_drained(slot.replica_key)
            self._dispatch_pass(time.monotonic())
            self._update_depth()

    # ----- decisions -----
    def _dispatch_pass(self, now: float) -> None:
        """Re-dispatched requests first (they were at the head), then the fair queue, unless an interactive
        re-dispatched request still waits: nothing behind it overtakes it (a batch one does not hold the
        fair queue back: it may yield for a long time)."""
        for queue in (self._redispatched, self._queue):
            self._fail_dropped(queue.expire(now, self._entry_min_service_s))
        if len(self._redispatched):
            self._dispatch_from(self._redispatched, now)
        if self._redispatched.num_waiting(RequestClass.INTERACTIVE) == 0:
            self._dispatch_from(self._queue, now)

    def _dispatch_from(self, queue: FairQueue[asyncio.Future[Slot]], now: float) -> None:
        min_service = self._entry_min_service_s
        dispatch = DispatchPass(
            queue,
            now,
            self._dispatch,
            min_service,
            self._settings.fair_share_tolerance,
            affinity=self._affinity.view(now),
        )
        in_rotation = [(key, view) for key, view in self._replicas.items() if view.takes_work]
        num_placed = 0
        while (
            placed := dispatch.next([v.load(k) for k, v in in_rotation], self._num_in_flight, self._weights)
        ) is not None:
            head = placed.entry
            queue.take(head, now)
            if head.payload.done():  # its caller left between cancellation and removal
                continue
            self._drain.observe(now)
            key = placed.replica.replica_id
            view = self._replicas[key]
            slot = Slot(head.request, now, view.engine, key, placed.priority)
            view.add(slot)
            self._num_in_flight.add(head.request_class, head.tenant_id)
            self._weights[head.tenant_id] = head.weight
            view.dispatched_kv_tokens_since_read += slot.kv_tokens
            if head.prefix_key is not None:
                self._affinity.record(head.prefix_key, key, now)
            labels = (self.model, self.version, self.pool, head.request_class)
            self._metrics.queue_wait_s.labels(*labels).observe(now - head.arrival_s)
            if queue is self._queue:  # a re-dispatch was admitted before
                self._metrics.admitted.labels(*labels).inc()
            head.payload.set_result(slot)
            num_placed += 1
        self._fail_dropped(dispatch.dropped)
        if num_placed:
            self._update_depth()

    def _entry_min_service_s(self, entry: QueueEntry[asyncio.Future[Slot]]) -> float:
        return self.min_service_s(entry.prompt_tokens)

    def _fail_dropped(self, dropped: list[QueueEntry[asyncio.Future[Slot]]]) -> None:
        for entry in dropped:
            if entry.payload.done():
                continue
            self._metrics.count_refused(self.model, "deadline_unmeetable")
            rate = self._drain.rate_per_s(time.monotonic()) or self._queue_depth.min_drain_rate_per_s
            retry_after_s = max(1.0, self._queue.num_waiting(entry.request_class) / rate)
            entry.payload.set_exception(
                refused(
                    429,
                    "service_overloaded",
                    f"Model '{self.model}' is at capacity: this request waited "
                    f"{time.monotonic() - entry.arrival_s:.1f} s and can no longer start before its "
                    f"deadline, so it was not started. Retry after {retry_after_s:.1f} s.",
                    retry_after_s,
                )
            )
        if dropped:
            self._update_depth()

    def _update_depth(self) -> None:
        now = time.monotonic()
        for request_class in RequestClass:
            labels = (self.model, self.version, self.pool, request_class)
            depth = self._queue.num_waiting(request_class) + self._redispatched.num_waiting(request_class)
            self._metrics.queue_depth.labels(*labels).set(depth)
            self._metrics.queue_age_s.labels(*labels).set(self.oldest_wait_s(now, request_class))

    # ----- background: replica reads, deadline checks -----
    async def _background(self) -> None:
        period_s = self._settings.replica_poll_interval_ms / 1000
        next_read_s = time.monotonic() + period_s
        while True:
            await asyncio.sleep(_EXPIRE_PERIOD_S)
            now = time.monotonic()
            if now >= next_read_s:
                next_read_s = now + period_s
                await self._read_replicas()
            self._dispatch_pass(time.monotonic())
            self._update_depth()  # NOTE: the queue's age grows while nothing happens

    async def _read_replicas(self) -> None:
        for replica_id, view in list(self._replicas.items()):
            if view.due_for_check(time.monotonic()):
                await self._check_suspended(replica_id, view)
            await self._read_replica(replica_id, view)

    async def _check_suspended(self, replica_id: str, view: ReplicaView) -> None:
        if await view.recheck(self._settings.replica_suspension_ms / 1000):
            log.info(
                "replica %s (%s version %s) resumed: it answers ready", replica_id, self.model, self.version
            )

    async def _read_replica(self, replica_id: str, view: ReplicaView) -> None:
        try:
            stats: ReplicaStats | None = await view.engine.replica_stats()
        except Exception:  # a bad read must not stop dispatch
            log.exception("reading the load of replica %s failed", replica_id)
            return
        if stats is not None:
            self._apply_stats(view, stats)

    def _apply_stats(self, view: ReplicaView, stats: ReplicaStats) -> None:
        view.apply_stats(stats, time.monotonic())
        self._metrics.observe_replica_kv(
            self.model, self.version, view.engine.replica, stats.num_kv_tokens_free, stats.num_kv_tokens_total
        )
        # NOTE: with each read (not each move), so the per-token path stays free of metric calls.
        self._metrics.observe_replica_batch(
            self.model, self.version, view.engine.replica, view.running_cap, view.itl_ms
        )

    # ----- read by the gateway's overload detector (gateway/degradation.py) -----
    def oldest_wait_s(self, now: float, request_class: RequestClass = RequestClass.INTERACTIVE) -> float:
        """How long the longest-waiting request of ``request_class`` queued here (re-dispatches included)
        has waited (0: none)."""
        arrivals_s = [q.oldest_arrival_s(request_class) for q in (self._queue, self._redispatched)]
        known_s = [arrival_s for arrival_s in arrivals_s if arrival_s is not None]
        return now - min(known_s) if known_s else 0.0
