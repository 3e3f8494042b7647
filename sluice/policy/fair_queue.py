"""One model's waiting requests: two classes, weighted fair queueing between tenants inside each.

Fairness is by tokens served, with a virtual token counter per tenant (VTC: Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024): a tenant's counter grows by the tokens it is served divided
by its weight (prompt tokens when a request is dispatched, output tokens as the caller reports them,
each output token costing ``output_token_cost`` prompt tokens); the backlogged tenant with the smallest
counter goes next. A tenant that becomes backlogged has its counter lifted to the smallest backlogged
counter, so idle time cannot be banked as credit for a later burst.

Between the classes interactive goes first, except that batch is guaranteed ``batch_floor_share`` of the
tokens dispatched while both are waiting (a decayed count), and a batch request that has waited
``batch_max_wait_s`` goes first (ageing). The caller can also hold batch back entirely
(``allow_batch=False``) when replicas are under pressure.

``FairQueue(fair=False)`` is the baseline it is measured against: every tenant stands in one line per
class (first come, first served), with the same classes, floor and ageing.

A request whose deadline can no longer be met (``now + min_service_s(entry) > deadline``) is dropped when
it reaches the head of its tenant's line, and never dispatched.

Pure: no clock, no I/O; ``now_s`` comes in with every call. Not thread-safe: one owner.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from sluice.domain import RequestClass

T = TypeVar("T")


class Waiting(Protocol):
    """What the queue reads of a request. The gateway's ``Job`` and the simulator's ``SimRequest`` both
    have it, so the queue holds the caller's own request rather than a copy of its fields."""

    @property
    def request_id(self) -> str: ...

    @property
    def tenant_id(self) -> str: ...

    @property
    def weight(self) -> float: ...  # the tenant's

    @property
    def request_class(self) -> RequestClass: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def arrival_s(self) -> float: ...

    @property
    def deadline_s(self) -> float: ...


@dataclass(frozen=True)
class WaitingRequest:
    """A ``Waiting`` for callers without a request type of their own (tests, tools)."""

    request_id: str
    tenant_id: str
    weight: float
    request_class: RequestClass
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    deadline_s: float


@dataclass
class QueueEntry(Generic[T]):
    """A request in the queue, by reference, with what the caller waits on (``payload``: a future in the
    gateway, the simulated request in the simulator)."""

    request: Waiting
    payload: T
    # Tenant-scoped key of the prompt's leading KV blocks (``placement.prefix_key``); None: no full block.
    prefix_key: int | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def tenant_id(self) -> str:
        return self.request.tenant_id

    @property
    def weight(self) -> float:
        return self.request.weight

    @property
    def request_class(self) -> RequestClass:
        return self.request.request_class

    @property
    def prompt_tokens(self) -> int:
        return self.request.prompt_tokens

    @property
    def max_tokens(self) -> int:
        return self.request.max_tokens

    @property
    def arrival_s(self) -> float:
        return self.request.arrival_s

    @property
    def deadline_s(self) -> float:
        return self.request.deadline_s

    @property
    def kv_tokens(self) -> int:
        """What the request may occupy in KV memory at most."""
        return self.request.prompt_tokens + self.request.max_tokens


@dataclass(frozen=True)
class FairQueueConfig:
    output_token_cost: float = 2.0  # an output token costs this many prompt tokens (VTC's default)
    batch_floor_share: float = 0.1  # share of dispatched tokens batch gets while both classes wait
    batch_max_wait_s: float = 30.0  # ageing: a batch request waiting this long goes before interactive
    share_half_life_s: float = 10.0  # memory of the per-class dispatched-token counts

    def __post_init__(self) -> None:
        if not 0 <= self.batch_floor_share < 1:
            raise ValueError(f"batch_floor_share must be in [0, 1), got {self.batch_floor_share}")
        if self.output_token_cost <= 0 or self.batch_max_wait_s <= 0 or self.share_half_life_s <= 0:
            raise ValueError("output_token_cost, batch_max_wait_s and share_half_life_s must be > 0")


MinServiceFn = Callable[[QueueEntry[T]], float]


@dataclass
class _ClassQueue(Generic[T]):
    """One class's lines (a FIFO per tenant) and the tenants' virtual token counters."""

    lines: dict[str, deque[QueueEntry[T]]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    last_counter: float = 0.0  # counter of the tenant served last: the floor when nobody is backlogged
    num_waiting: int = 0

    def push(self, entry: QueueEntry[T], tenant: str) -> None:
        line = self.lines.get(tenant)
        if not line:  # becoming backlogged: no banked credit
            backlogged = [self.counters[t] for t, q in self.lines.items() if q]
            floor = min(backlogged) if backlogged else self.last_counter
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)
            if line is None:
                line = self.lines[tenant] = deque()
        self.weights[tenant] = entry.weight
        line.append(entry)
        self.num_waiting += 1

    def next_tenant(self, skip: Collection[str] = ()) -> str | None:
        best: tuple[float, float] | None = None
        chosen = None
        for tenant, line in self.lines.items():
            if line and tenant not in skip:
                key = (self.counters[tenant], line[0].arrival_s)
                if best is None or key < best:
                    best, chosen = key, tenant
        return chosen

    def pop_head(self, tenant: str) -> QueueEntry[T]:
        self.num_waiting -= 1
        return self.lines[tenant].popleft()

    def charge(self, tenant: str, tokens: float) -> None:
        weight = self.weights.get(tenant, 1.0)
        self.counters[tenant] = self.counters.get(tenant, 0.0) + tokens / weight

    def oldest_arrival_s(self) -> float | None:
        heads = [line[0].arrival_s for line in self.lines.values() if line]
        return min(heads) if heads else None


class FairQueue(Generic[T]):
    def __init__(self, config: FairQueueConfig | None = None, *, fair: bool = True) -> None:
        self.config = config or FairQueueConfig()
        self.fair = fair
        self._classes: dict[RequestClass, _ClassQueue[T]] = {c: _ClassQueue() for c in RequestClass}
        self._served_tokens = dict.fromkeys(RequestClass, 0.0)  # decayed, for the batch floor
        self._served_at_s = 0.0
        self._by_id: dict[str, QueueEntry[T]] = {}

    # ----- state -----
    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def num_waiting(self, request_class: RequestClass | None = None) -> int:
        if request_class is None:
            return len(self._by_id)
        return self._classes[request_class].num_waiting

    def waiting_tenants(self, request_class: RequestClass) -> dict[str, float]:
        """The tenants with a request of ``request_class`` waiting, and their weights."""
        queue = self._classes[request_class]
        if self.fair:
            return {t: queue.weights[t] for t, line in queue.lines.items() if line}
        return {e.tenant_id: e.weight for line in queue.lines.values() for e in line}

    def counter(self, tenant_id: str, request_class: RequestClass) -> float:
        return self._classes[request_class].counters.get(self._line(tenant_id), 0.0)

    def oldest_arrival_s(self, request_class: RequestClass) -> float | None:
        """When the longest-waiting request of ``request_class`` arrived; None: none waits."""
        return self._classes[request_class].oldest_arrival_s()

    # ----- verbs -----
    def push(self, entry: QueueEntry[T]) -> None:
        if entry.request_id in self._by_id:
            raise ValueError(f"request {entry.request_id!r} is already queued")
        if entry.weight <= 0:
            raise ValueError(f"weight must be > 0, got {entry.weight}")
        self._classes[entry.request_class].push(entry, self._line(entry.tenant_id))
        self._by_id[entry.request_id] = entry

    def remove(self, request_id: str) -> QueueEntry[T] | None:
        """Take a waiting request out (its caller went away). None if it is not waiting."""
        entry = self._by_id.pop(request_id, None)
        if entry is not None:
            queue = self._classes[entry.request_class]
            queue.lines[self._line(entry.tenant_id)].remove(entry)
            queue.num_waiting -= 1
        return entry

    def peek(
        self,
        now_s: float,
        *,
        allow_batch: bool = True,
        min_service_s: MinServiceFn[T] | None = None,
        skip_tenants: Collection[str] = (),
    ) -> tuple[QueueEntry[T] | None, list[QueueEntry[T]]]:
        """The request to dispatch next (left in the queue; ``take`` it once it is placed), and the
        requests dropped on the way because they could no longer meet their deadline.

        ``skip_tenants``: lines not to consider this time (a dispatcher whose head request could not be
        placed because its tenant yields asks for the next one; under FCFS there is one line, so a
        blocked head blocks everyone, as FCFS does)."""
        dropped: list[QueueEntry[T]] = []
        skip = {self._line(t) for t in skip_tenants}
        while True:
            candidates = {c: self._classes[c].next_tenant(skip) for c in RequestClass}
            request_class = self._choose_class(
                now_s,
                allow_batch and candidates[RequestClass.BATCH] is not None,
                candidates[RequestClass.INTERACTIVE] is not None,
            )
            if request_class is None:
                return None, dropped
            queue = self._classes[request_class]
            tenant = candidates[request_class]
            assert tenant is not None
            head = queue.lines[tenant][0]
            if min_service_s is not None and now_s + min_service_s(head) > head.deadline_s:
                dropped.append(self._pop(queue, tenant))
                continue
            return head, dropped

    def take(self, entry: QueueEntry[T], now_s: float) -> None:
        """Dispatch ``entry``, which ``peek`` just returned: out of the queue, its prompt charged."""
        queue = self._classes[entry.request_class]
        key = self._line(entry.tenant_id)
        line = queue.lines.get(key)
        if not line or line[0] is not entry:
            raise ValueError(f"request {entry.request_id!r} is not at the head of its line")
        self._pop(queue, key)
        queue.last_counter = queue.counters[key]
        queue.charge(key, entry.prompt_tokens)
        self._note_served(entry.request_class, entry.prompt_tokens, now_s)

    def charge_output(
        self, tenant_id: str, request_class: RequestClass, num_tokens: int, now_s: float
    ) -> None:
        """Output tokens a dispatched request of this tenant produced."""
        cost = num_tokens * self.config.output_token_cost
        self._classes[request_class].charge(self._line(tenant_id), cost)
        self._note_served(request_class, cost, now_s)

    def expire(self, now_s: float, min_service_s: MinServiceFn[T]) -> list[QueueEntry[T]]:
        """Drop every line's head requests that can no longer meet their deadline."""
        dropped = []
        for queue in self._classes.values():
            for tenant, line in queue.lines.items():
                while line and now_s + min_service_s(line[0]) > line[0].deadline_s:
                    dropped.append(self._pop(queue, tenant))
        return dropped

    def position(self, tenant_id: str, weight: float, request_class: RequestClass) -> int:
        """About how many waiting requests would be dispatched before a new one from this tenant:
        its own line, each other backlogged tenant's share of the same number of turns (by weight), and,
        for batch, every waiting interactive request."""
        queue = self._classes[request_class]
        if not self.fair:
            ahead = queue.num_waiting
            if request_class is RequestClass.BATCH:
                ahead += self._classes[RequestClass.INTERACTIVE].num_waiting
            return ahead
        own = len(queue.lines.get(tenant_id) or ())
        ahead = own
        for tenant, line in queue.lines.items():
            if tenant != tenant_id and line:
                turns = math.ceil((own + 1) * queue.weights.get(tenant, 1.0) / weight)
                ahead += min(len(line), turns)
        if request_class is RequestClass.BATCH:
            ahead += self._classes[RequestClass.INTERACTIVE].num_waiting
        return ahead

    def drain(self) -> list[QueueEntry[T]]:
        """Remove and return every waiting request (its queue is closing)."""
        drained = []
        for queue in self._classes.values():
            for tenant, line in queue.lines.items():
                while line:
                    drained.append(self._pop(queue, tenant))
        return drained

    # ----- internals -----
    def _line(self, tenant_id: str) -> str:
        return tenant_id if self.fair else "*"  # FCFS: one line for everybody

    def _pop(self, queue: _ClassQueue[T], tenant: str) -> QueueEntry[T]:
        entry = queue.pop_head(tenant)
        del self._by_id[entry.request_id]
        return entry

    def _choose_class(self, now_s: float, batch_ready: bool, interactive_ready: bool) -> RequestClass | None:
        if not batch_ready:
            return RequestClass.INTERACTIVE if interactive_ready else None
        if not interactive_ready:
            return RequestClass.BATCH
        oldest = self._classes[RequestClass.BATCH].oldest_arrival_s()
        if oldest is not None and now_s - oldest >= self.config.batch_max_wait_s:
            return RequestClass.BATCH  # ageing
        self._decay(now_s)
        served_batch = self._served_tokens[RequestClass.BATCH]
        served_total = served_batch + self._served_tokens[RequestClass.INTERACTIVE]
        if served_total > 0 and served_batch / served_total < self.config.batch_floor_share:
            return RequestClass.BATCH  # the floor
        return RequestClass.INTERACTIVE

    def _note_served(self, request_class: RequestClass, tokens: float, now_s: float) -> None:
        self._decay(now_s)
        self._served_tokens[request_class] += tokens

    def _decay(self, now_s: float) -> None:
        elapsed_s = now_s - self._served_at_s
        if elapsed_s > 0:
            factor = 0.5 ** (elapsed_s / self.config.share_half_life_s)
            for c in self._served_tokens:
                self._served_tokens[c] *= factor
            self._served_at_s = now_s
