"""The replica's send path, decided without Triton: which dirty stream to send next, and which live
requests to ask about cancellation now. Pure bookkeeping (no threads, no I/O, no clock: ``now_s`` in).

Both are owned by the one sender thread of model.py, beside this file (replica-side code: the gateway
never imports it).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Collection, Iterable


class SendQueue:
    """Streams with something to send, popped in the order they should be sent.

    Lower engine priority first (0 = interactive under its tenant's share); within a priority, streams
    still owed their first token first; then in the order they became dirty. A stream queued twice is
    kept once, at its first position: its next send carries everything it made since the last one.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, bool, int, str]] = []
        self._queued: set[str] = set()
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, request_id: str, priority: int, first_token_sent: bool) -> None:
        if request_id in self._queued:
            return
        self._queued.add(request_id)
        heapq.heappush(self._heap, (priority, first_token_sent, next(self._seq), request_id))

    def pop(self) -> str | None:
        """The next stream to send, or None when none is queued."""
        if not self._heap:
            return None
        request_id = heapq.heappop(self._heap)[3]
        self._queued.discard(request_id)
        return request_id


class CancelSweep:
    """Which live requests to ask ``is_cancelled()`` on this pass (each ask is an IPC round trip).

    With ``period_s`` 0, every live request on every pass. Otherwise a rotating slice, sized by the time
    since the previous pass, so that each live request is asked about once per ``period_s`` (a new one
    within one period of its first pass) and the asks are spread over the period instead of bunched.
    """

    def __init__(self, period_s: float) -> None:
        if period_s < 0:
            raise ValueError("period_s must be >= 0")
        self._period_s = period_s
        self._order: dict[str, None] = {}  # the rotation: asked least recently first
        self._credit = 0.0  # asks owed, in requests
        self._last_s: float | None = None

    def due(self, live_ids: Collection[str], now_s: float) -> list[str]:
        """The ids of ``live_ids`` (a set or a mapping's keys) to ask now; ids no longer live are dropped."""
        if not live_ids:
            self._order.clear()
        for request_id in live_ids:
            self._order.setdefault(request_id)  # a new request joins the end of the rotation
        if self._period_s == 0:
            num_due = len(live_ids)
        else:
            elapsed_s = 0.0 if self._last_s is None else max(0.0, now_s - self._last_s)
            self._credit = min(len(live_ids), self._credit + len(live_ids) * elapsed_s / self._period_s)
            num_due = math.floor(self._credit + 1e-9)  # NOTE: 0.9999... from rounding is one ask
            self._credit -= num_due
        self._last_s = now_s
        due: list[str] = []
        while len(due) < num_due and self._order:
            request_id = next(iter(self._order))
            del self._order[request_id]
            if request_id in live_ids:
                due.append(request_id)
                self._order[request_id] = None  # to the back of the rotation
        return due


class SendBudget:
    """How long a stream's tokens may wait to leave together: one response per inter-token budget, not
    one per token.

    Every response costs the whole serving path the same whatever it carries (this process's IPC to
    Triton, Triton's gRPC frame, the gateway's decode, detokenise and SSE write, the client's read), so
    at load, responses per token is what decides how much of the cores is left to make tokens. A stream
    that has had its first token is sent about once per ``interval_s(num_live)``: the live streams over
    ``max_responses_per_s``, capped at ``max_interval_s``. Nearly alone, that is shorter than a step and
    every token leaves as it is made; at load the replica's responses stay near ``max_responses_per_s``
    however many tokens a step makes. First tokens and ends are never held (the caller's rule, as for
    ``YieldPacer``).

    Tokens are made at step ends, so once the step time is known a response spans a whole number of
    steps (``steps_per_response``): the interval rounded down to steps, so a gap stays within it, except
    when a step takes over half the interval: then two steps, not one. Rounded down there, every token
    would leave alone just when steps are long (long prompts at load) and the cores are scarcest; two
    steps keep a gap under the interval plus a step, the ITL target's two halves (a step is bounded by
    the running cap's ``target_step_ms``), and the first token made after a send waits one step, under
    the interval. Rounding up everywhere was measured too: at short steps the longer gaps take the
    headroom the batch bound keeps under the ITL target, and the smaller batch cost more than the
    fewer messages saved (docs/benchmarks.md, issue 22 on the Xeon, 2026-12-05 evening).
    """

    def __init__(self, max_interval_s: float, max_responses_per_s: float) -> None:
        if max_interval_s < 0 or max_responses_per_s <= 0:
            raise ValueError("max_interval_s must be >= 0 and max_responses_per_s > 0")
        self.max_interval_s = max_interval_s
        self.max_responses_per_s = max_responses_per_s

    def interval_s(self, num_live: int) -> float:
        """The least time between two responses of one stream while ``num_live`` streams are live."""
        return min(self.max_interval_s, num_live / self.max_responses_per_s)

    def steps_per_response(self, num_live: int, step_s: float) -> int:
        """How many engine steps of ``step_s`` (> 0) a stream's response spans while ``num_live`` streams
        are live: ``interval_s`` rounded down to whole steps; two if that is one but the interval is
        longer than a step; one if it is not."""
        if step_s <= 0:
            raise ValueError("step_s must be positive")
        # NOTE: the epsilon keeps an exact multiple (a 20 ms interval over 5 ms steps) at 4 steps, not 3.
        steps = self.interval_s(num_live) / step_s
        if steps <= 1 + 1e-9:
            return 1
        return max(2, math.floor(steps + 1e-9))

    def hold_until(
        self, last_send_s: float | None, num_live: int, now_s: float, step_s: float = 0.0
    ) -> float | None:
        """When a stream last sent at ``last_send_s`` (None: never) may be sent next, if later than
        ``now_s``; else None (send now). ``step_s``: the engine's recent step time (0: not known yet, the
        interval alone decides); ``last_send_s`` is then best the time the step end whose tokens the last
        response carried was seen, not the send's own (which comes later the further back in a step's
        batch of sends it is).

        The sender lets a hold go at the last step end before its due time, so the due time for a
        response of k steps is half a step past the k-th step end after the last send: the k-th step
        end is then the one it leaves at whatever the jitter, up to half a step either way."""
        if last_send_s is None:
            return None
        if step_s > 0:
            num_steps = self.steps_per_response(num_live, step_s)
            if num_steps == 1:
                return None
            due_s = last_send_s + (num_steps + 0.5) * step_s
        else:
            due_s = last_send_s + self.interval_s(num_live)
        return due_s if due_s > now_s else None


class StepClock:
    """The engine's step time as the sender sees it, from the engine's running totals: the mean of the
    steps since the last look (``last_s``: how far off the next step end is) and a moving average over
    about the last ``window`` steps (``typical_s``: how many steps a response spans, ``SendBudget``).
    One long step (a prompt's chunk rides on it) must not make every stream it ends send alone."""

    def __init__(self, window_steps: int = 8) -> None:
        if window_steps < 1:
            raise ValueError("window_steps must be at least 1")
        self._keep = 1.0 - 1.0 / window_steps  # the old average's weight per new step
        self._seen_steps = 0
        self._seen_ms_sum = 0.0
        self.last_s = 0.0  # 0 until a step is seen
        self.typical_s = 0.0

    def observe(self, num_steps_total: int, step_ms_sum: float) -> None:
        """The engine's step count and summed step time now; nothing changes while no step ran."""
        num_steps = num_steps_total - self._seen_steps
        if num_steps <= 0:
            return
        self.last_s = (step_ms_sum - self._seen_ms_sum) / num_steps / 1000.0
        if self.typical_s == 0.0:
            self.typical_s = self.last_s
        else:
            self.typical_s += (1.0 - self._keep**num_steps) * (self.last_s - self.typical_s)
        self._seen_steps, self._seen_ms_sum = num_steps_total, step_ms_sum


class YieldPacer:
    """How often a stream of work that yields is sent while higher-priority work shares the replica.

    Every response costs the whole serving path (this process, Triton, the gateway, the client) the same
    whatever it carries. While a stream of a higher engine priority is live (a tenant under its share next
    to one over it, or interactive next to batch), a stream of lower priority is sent at most once per
    ``interval_s``: its tokens wait in the stream and leave together, so the flood costs a fraction of the
    messages and the cores go to the interactive stream. Its first token and its end are never held, and
    only another tenant's stream holds it (``top_of_other_tenants``): one tenant's own requests of
    different priorities, alone on the replica, are all sent as soon as they have tokens.
    """

    def __init__(self, interval_s: float) -> None:
        if interval_s < 0:
            raise ValueError("interval_s must be >= 0")
        self.interval_s = interval_s

    def hold_until(
        self, priority: int, top_other_priority: int | None, last_send_s: float | None, now_s: float
    ) -> float | None:
        """When a stream of ``priority``, last sent at ``last_send_s`` (None: never), may be sent next, if
        that is later than ``now_s``; else None (send now). ``top_other_priority``: the highest priority
        (lowest number) of the other tenants' live streams, None if there are none."""
        if self.interval_s == 0 or last_send_s is None:
            return None
        if top_other_priority is None or priority <= top_other_priority:
            return None
        due_s = last_send_s + self.interval_s
        return due_s if due_s > now_s else None


def top_of_other_tenants(streams: Iterable[tuple[str, int]]) -> Callable[[str], int | None]:
    """From the live streams' (tenant, priority): for a tenant, the highest priority (lowest number) among
    the other tenants' streams, or None when no other tenant has one."""
    best: dict[str, int] = {}
    for tenant, priority in streams:
        if tenant not in best or priority < best[tenant]:
            best[tenant] = priority
    first_two = sorted(best.items(), key=lambda item: item[1])[:2]

    def top(tenant: str) -> int | None:
        return next((priority for other, priority in first_two if other != tenant), None)

    return top
