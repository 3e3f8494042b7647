"""The CPU engine as a decoupled Triton Python-backend model: a thin shell around the converters beside
it (replica_converters.py, send_schedule.py; the renderer copies this whole folder, and the Python
backend puts it on sys.path).

Threads and what they own:
- Triton's thread calls ``execute``: it converts each request and submits it to the engine, never waits.
- The engine thread (``EngineThread``) owns the engine; a stream it updates is marked dirty in a queue.
- A small pool of ``_Sender`` threads, each with its own requests (map, lock, dirty queue), sends for
  each dirty stream the tokens produced since its last response, higher engine priority first and,
  within one, streams still owed their first token first (``SendQueue``). A stream that has its first
  token waits up to its send budget (``SendBudget``: one response per inter-token budget at load, each
  token at once nearly alone) so that a response carries every token its stream made meanwhile. Tokens
  are made at step ends only, so a held stream due before the next step ends leaves with this step's
  sends: it would carry nothing more by waiting, and the responses of a step leave together (each hop
  then reads and writes them in fewer wake-ups). Once per engine step it asks Triton
  whether its requests were cancelled, all of them or a rotating slice (``CancelSweep``), aborting
  those in the engine.
- One metrics thread copies engine stats into Triton's metrics every ``stats_interval_ms`` (a gauge only
  when its value changed: each set is an IPC to the server).

Every request ends with a response flagged ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``: its last tokens
(the one with the finish reason; python_backend's ResponseSender::Send takes a response and the flag
together, src/response_sender.cc), or, for a request
refused or failed, one carrying ``error_kind`` and ``error_message`` (the kind as a field, so clients
never parse the text). Only a stream that has nothing left to carry it (cancelled: nobody reads it) ends
with the flag alone, an empty final response that clients see only if they ask for it
(``enable_empty_final_response``). Either way the flag is what ends a one-request gRPC stream.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import triton_python_backend_utils as pb_utils

# Beside this file: Triton's Python backend puts the model's version folder on sys.path.
from replica_converters import (
    COUNTER_FAMILIES,
    EngineRequest,
    counter_totals,
    error_tensors,
    gauge_values,
    parameters_from_config,
    request_from_tensors,
    response_tensors,
)
from send_schedule import CancelSweep, SendBudget, SendQueue, StepClock, YieldPacer, top_of_other_tenants

from cpu_engine.engine import LLMEngine
from cpu_engine.engine_thread import EngineThread, RequestStream, StreamDelta, error_kind
from cpu_engine.stats import ENGINE_INFO_FAMILY, KV_CACHE_FAMILY, REQUEST_FAMILY, EngineStats
from cpu_engine.thread_names import METRICS_THREAD, SENDER_THREAD, name_this_thread
from sluice.weights_digest import weights_digest
from sluice.wire import EngineErrorKind, TokenLogprob

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# The sender wakes at least this often while requests are live, to check cancellation between tokens.
_BUSY_POLL_S = 0.005
_IDLE_POLL_S = 0.1
_DRAIN_TIMEOUT_S = 5.0
# Cancellation is checked between batches of sends, and at least this often while a backlog lasts.
_MAX_CHECK_GAP_S = 0.02
# Sender threads. A send waits ~0.3 ms on an IPC round trip with the GIL released, so more threads
# overlap their waits; on 2 cores a second one measured no gain (it competes with the engine thread).
_NUM_SENDERS = 1
_GAUGE_DESCRIPTIONS = {
    KV_CACHE_FAMILY: "KV cache blocks (max, free, used, tokens_per block, fraction used)",
    REQUEST_FAMILY: "Requests (active, scheduled, context, waiting, max running)",
}
_INFO_DESCRIPTION = "1, labelled with the engine's dtype and the CPU flags and kernel it was chosen from"


@dataclass
class _Live:
    """A request owed a final response. Only the sender thread touches it after ``execute``."""

    request: Any  # pb_utils.InferenceRequest: kept alive until the final response is sent
    sender: Any  # pb_utils.InferenceResponseSender
    stream: RequestStream
    streaming: bool
    priority: int  # the engine's EnginePriority: lower is sent first
    tenant: str  # its cache scope
    # Non-streaming: every token (and log-probability) so far, per answer.
    tokens: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    first_token_sent: bool = False
    # Streaming: when the update its last response carried was seen (see _Sender._seen_update_s).
    last_send_s: float | None = None
    cancelled: bool = False
    num_answers: int = 1  # n


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("the CPU engine model must be decoupled")
        params = parameters_from_config(config.get("parameters", {}))
        if params.weights_digest is not None:
            # NOTE: what the config says it serves is what it loads, or it does not load: health checks
            # read this parameter back and route by it.
            found = weights_digest(params.checkpoint_dir)
            if found != params.weights_digest:
                raise pb_utils.TritonModelException(
                    f"weights at {params.checkpoint_dir} digest to {found}, not the configured "
                    f"{params.weights_digest}: refusing to load"
                )
        engine = LLMEngine.from_checkpoint(params.checkpoint_dir, params.engine)
        self._dtype_choice = engine.dtype_choice
        self._vocab_size = engine.model_config.vocab_size
        self._max_context_tokens = engine.model_config.max_position_embeddings
        instance = args["model_instance_name"]
        self._engine = EngineThread(engine, name=f"engine-{instance}")
        self._id_prefix = f"{instance}-"
        self._next_id = itertools.count()
        check_period_s = params.cancellation_check_period_ms / 1000.0
        yield_interval_s = params.yield_send_interval_ms / 1000.0
        budget = SendBudget(params.send_budget_ms / 1000.0, params.max_responses_per_s)
        self._senders = [
            _Sender(self._engine, f"sender{i}-{instance}", check_period_s, yield_interval_s, budget)
            for i in range(_NUM_SENDERS)
        ]
        info_labels = self._dtype_choice.metric_labels()
        self._metrics = _MetricsExporter(
            args["model_name"], args["model_version"], self._engine.stats(), info_labels
        )
        self._stopping = threading.Event()
        self._metrics_thread = threading.Thread(
            target=self._metrics_loop, args=(params.stats_interval_ms / 1000.0,),
            name=f"metrics-{instance}", daemon=True,
        )  # fmt: skip
        self._metrics_thread.start()
        pb_utils.Logger.log_info(
            f"CPU engine loaded from {params.checkpoint_dir}: {params.engine.num_kv_blocks} KV blocks "
            f"of {params.engine.block_size_tokens} tokens; {self._dtype_choice.describe()}"
        )

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self._admit(request)
        return None  # decoupled: responses go through each request's sender

    def finalize(self) -> None:
        self._engine.close()  # fails the streams still running; the senders turn them into error responses
        deadline = time.monotonic() + _DRAIN_TIMEOUT_S
        while any(s.num_live for s in self._senders) and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stopping.set()
        for sender in self._senders:
            sender.stop()
        self._metrics_thread.join(timeout=2.0)

    def _admit(self, request: Any) -> None:
        response_sender = request.get_response_sender()
        try:
            # One pass over what arrived (pb_utils.get_input_tensor_by_name lists every input again for
            # each name it looks up); request_from_tensors refuses a name it does not know.
            tensors = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
            converted = request_from_tensors(tensors, self._vocab_size, self._max_context_tokens)
        except ValueError as exc:
            _send_error(response_sender, EngineErrorKind.INVALID_REQUEST, str(exc))
            return
        number = next(self._next_id)
        sender = self._senders[number % len(self._senders)]
        sender.submit(f"{self._id_prefix}{number}", converted, request, response_sender)

    def _metrics_loop(self, interval_s: float) -> None:
        name_this_thread(METRICS_THREAD)
        while not self._stopping.wait(interval_s):
            self._metrics.update(self._engine.stats())


class _Sender:
    """A sender thread and the requests assigned to it: their map, its lock, and their dirty queue.

    The thread sends, for each stream marked dirty, what it produced since its last response, in
    ``SendQueue`` order, and asks Triton whether its requests were cancelled once per engine step (and
    at every idle wake-up): every request when ``check_period_s`` is 0, else a rotating slice that asks
    each about once per ``check_period_s``.
    """

    def __init__(
        self,
        engine: EngineThread,
        name: str,
        check_period_s: float,
        yield_interval_s: float,
        budget: SendBudget,
    ) -> None:
        self._engine = engine
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()  # guards _live: Triton's thread adds, this sender removes
        self._dirty: queue.SimpleQueue[str] = queue.SimpleQueue()
        # Owned by this sender's thread:
        self._send_queue = SendQueue()
        self._cancel_sweep = CancelSweep(check_period_s)
        self._pacer = YieldPacer(yield_interval_s)
        self._budget = budget
        self._held: list[tuple[float, str]] = []  # (due_s, request_id): a heap of streams the pacer holds
        self._held_ids: set[str] = set()
        self._released_ids: set[str] = set()  # let go of before their due time: sent as they are
        self._steps = StepClock()  # how far ahead a hold is let go; how many steps a response spans
        # When this thread last took an update from the dirty queue: a step end, as this thread sees it.
        # A response's hold is timed from it rather than from its send, which comes later the further
        # back in a step's batch of sends it is: holds then end at step ends whatever a stream's place.
        self._seen_update_s = 0.0
        self._last_check_step, self._last_check_s = -1, 0.0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def num_live(self) -> int:
        return len(self._live)

    def submit(self, request_id: str, converted: EngineRequest, request: Any, response_sender: Any) -> None:
        # Held across submit so this thread, woken by the stream's first update, finds the entry.
        with self._lock:
            stream = self._engine.submit(
                request_id,
                converted.prompt_token_ids,
                converted.params,
                converted.priority,
                converted.cache_scope,
                on_update=functools.partial(self._dirty.put, request_id),
            )
            self._live[request_id] = _Live(
                request,
                response_sender,
                stream,
                converted.streaming,
                int(converted.priority),
                converted.cache_scope,
                num_answers=converted.params.n,
            )

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        name_this_thread(SENDER_THREAD)
        while not self._stopping.is_set():
            timeout_s = _BUSY_POLL_S if self._live else _IDLE_POLL_S
            if self._held:
                timeout_s = max(0.0, min(timeout_s, self._held[0][0] - time.monotonic()))
            try:
                first = self._dirty.get(timeout=timeout_s)
            except queue.Empty:
                first = None
            else:
                self._seen_update_s = time.monotonic()
            released = self._release_held()
            if first is None and not released:
                self._abort_cancelled(idle=True)
                continue
            self._queue_dirty(released if first is None else [first, *released])
            top_of_others = self._top_of_other_tenants()
            # NOTE: what became dirty during a send is queued before the next pick, so a high-priority
            # stream waits for at most one send, not for the whole batch it arrived behind.
            while (request_id := self._send_queue.pop()) is not None:
                self._flush(request_id, top_of_others)
                if not self._dirty.empty():
                    self._queue_dirty()
                if time.monotonic() - self._last_check_s >= _MAX_CHECK_GAP_S:
                    self._abort_cancelled(idle=True)  # a backlog that never empties must not hide a cancel
            self._abort_cancelled(idle=False)  # between batches: the checks never delay a batch's sends

    def _queue_dirty(self, request_ids: list[str] | None = None) -> None:
        """Move ``request_ids``, then the ids marked dirty that are waiting, into the send queue."""
        request_ids = [] if request_ids is None else request_ids
        if not self._dirty.empty():
            self._seen_update_s = time.monotonic()
        while not self._dirty.empty():  # only this thread takes from the queue
            request_ids.append(self._dirty.get_nowait())
        with self._lock:
            lives = [(request_id, self._live.get(request_id)) for request_id in request_ids]
        for request_id, live in lives:
            # NOTE: a held stream's new tokens leave when its hold ends; only its end goes at once.
            if live is not None and (request_id not in self._held_ids or live.stream.has_ended()):
                self._send_queue.push(request_id, live.priority, live.first_token_sent)

    def _top_of_other_tenants(self) -> Callable[[str], int | None]:
        with self._lock:
            live = [(entry.tenant, entry.priority) for entry in self._live.values() if not entry.cancelled]
        return top_of_other_tenants(live)

    def _release_held(self) -> list[str]:
        """The held streams due before the engine's next step would end, no longer held."""
        horizon_s, released = time.monotonic() + self._recent_step_s(), []
        while self._held and self._held[0][0] <= horizon_s:
            request_id = heapq.heappop(self._held)[1]
            if request_id in self._held_ids:
                self._held_ids.discard(request_id)
                self._released_ids.add(request_id)
                released.append(request_id)
        return released

    def _recent_step_s(self) -> float:
        """The engine's mean step time over the steps since the last look (kept while none ran)."""
        stats = self._engine.stats()
        self._steps.observe(stats.num_steps_total, stats.step_ms_sum)
        return self._steps.last_s

    def _flush(self, request_id: str, top_of_others: Callable[[str], int | None]) -> None:
        with self._lock:
            live = self._live.get(request_id)
        if live is None:
            return
        if live.streaming and not live.stream.has_ended():
            if request_id in self._held_ids:
                return  # it leaves when its hold ends, with what it makes until then
            released = request_id in self._released_ids
            self._released_ids.discard(request_id)
            due_s = None if released else self._hold_until(live, top_of_others(live.tenant))
            if due_s is not None:
                self._held_ids.add(request_id)
                heapq.heappush(self._held, (due_s, request_id))
                return
        else:
            self._held_ids.discard(request_id)  # its end leaves now (its heap entry finds it gone)
            self._released_ids.discard(request_id)
        # NOTE: at most one read per answer (n > 1 answers are read one at a time): what an answer makes
        # while this sends waits for its next turn in the send queue.
        for _ in range(live.num_answers):
            delta = live.stream.take_nowait()
            if delta is None:
                return
            done = delta.finished  # an error delta is finished too
            try:
                if delta.error is not None:
                    _send_error(live.sender, error_kind(delta.error_kind), delta.error)
                elif not self._send_tokens(live, delta, _FINAL if done else 0) and done:
                    live.sender.send(flags=_FINAL)  # no response to carry the flag (a cancelled stream)
            except Exception as exc:  # Triton refused the response: stop the work and end the request
                pb_utils.Logger.log_warn(f"{request_id}: sending failed ({exc}); aborting")
                self._engine.abort(request_id)
                done = True
                with contextlib.suppress(Exception):  # it may be the final send itself that failed
                    live.sender.send(flags=_FINAL)
            if done:
                with self._lock:
                    self._live.pop(request_id, None)
                return

    def _hold_until(self, live: _Live, top_other_priority: int | None) -> float | None:
        """When streaming ``live`` may be sent next, if not now: the later of its send budget and, while
        another tenant's higher-priority work is live, the yield pacer."""
        now_s = time.monotonic()
        dues = (
            self._budget.hold_until(live.last_send_s, len(self._live), now_s, self._steps.typical_s),
            self._pacer.hold_until(live.priority, top_other_priority, live.last_send_s, now_s),
        )
        return max((due for due in dues if due is not None), default=None)

    def _send_tokens(self, live: _Live, delta: StreamDelta, flags: int) -> bool:
        """Send what ``delta`` releases, with ``flags`` (the final flag rides on the last response: one
        IPC round trip to the server fewer per request); False when nothing was sent."""
        if live.cancelled:
            return False  # nobody is listening
        if live.streaming:
            if not (delta.token_ids or delta.answer_finished):
                return False
            live.sender.send(_response(response_tensors(delta, delta.token_ids, delta.logprobs)), flags=flags)
            live.first_token_sent = True
            live.last_send_s = self._seen_update_s
            return True
        tokens = live.tokens.setdefault(delta.index, [])
        tokens.extend(delta.token_ids)
        logprobs = live.logprobs.setdefault(delta.index, [])
        logprobs.extend(delta.logprobs or ())
        if not delta.answer_finished:
            return False
        live.sender.send(_response(response_tensors(delta, tokens, logprobs or None)), flags=flags)
        return True

    def _abort_cancelled(self, idle: bool) -> None:
        """Ask Triton about the requests due (see ``CancelSweep``); abort the cancelled ones.

        While sending, at most once per engine step: is_cancelled() is an IPC round trip per request.
        """
        step = self._engine.stats().num_steps_total
        if not idle and step == self._last_check_step:
            return
        self._last_check_step, self._last_check_s = step, time.monotonic()
        with self._lock:
            live = dict(self._live)
        for request_id in self._cancel_sweep.due(live.keys(), self._last_check_s):
            entry = live[request_id]
            if not entry.cancelled and entry.request.is_cancelled():
                entry.cancelled = True
                self._engine.abort(request_id)  # the engine's final ABORT delta closes the request


class _MetricsExporter:
    """Engine stats as Triton custom metrics: TensorRT-LLM's gauge families plus Sluice's counters."""

    def __init__(
        self, model_name: str, model_version: str, stats: EngineStats, info_labels: dict[str, str]
    ) -> None:
        labels = {"model": model_name, "version": model_version}
        gauge = pb_utils.MetricFamily.GAUGE
        counter = pb_utils.MetricFamily.COUNTER
        # NOTE: families must stay referenced: Triton drops a family whose Python object is collected.
        self._families = {
            name: pb_utils.MetricFamily(name=name, description=text, kind=gauge)
            for name, text in _GAUGE_DESCRIPTIONS.items()
        }
        self._families.update(
            {
                name: pb_utils.MetricFamily(name=name, description=text, kind=counter)
                for name, text in COUNTER_FAMILIES.items()
            }
        )
        self._gauges = {
            key: self._families[key[0]].Metric(labels={**labels, key[1]: key[2]})
            for key in gauge_values(stats)
        }
        self._counters = {name: self._families[name].Metric(labels=labels) for name in COUNTER_FAMILIES}
        # Always 1: the labels carry the engine's dtype and the CPU flags it was chosen from.
        self._families[ENGINE_INFO_FAMILY] = pb_utils.MetricFamily(
            name=ENGINE_INFO_FAMILY, description=_INFO_DESCRIPTION, kind=gauge
        )
        self._info = self._families[ENGINE_INFO_FAMILY].Metric(labels={**labels, **info_labels})
        self._info.set(1.0)
        self._last_totals = dict.fromkeys(COUNTER_FAMILIES, 0.0)
        self._last_gauges: dict[tuple[str, str, str], float] = {}
        self.update(stats)

    def update(self, stats: EngineStats) -> None:
        # NOTE: each set() and increment() is an IPC to the server, so only changes are sent.
        for key, value in gauge_values(stats).items():
            if self._last_gauges.get(key) != value:
                self._gauges[key].set(value)
                self._last_gauges[key] = value
        for name, total in counter_totals(stats).items():
            if total > self._last_totals[name]:
                self._counters[name].increment(total - self._last_totals[name])
                self._last_totals[name] = total


def _response(tensors: dict[str, Any]) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])


def _send_error(sender: Any, kind: EngineErrorKind, message: str) -> None:
    # NOTE: a response with outputs, not a Triton error: a stream's error response reaches the client as
    # text only, without its code, and the kind must not be guessed from the text.
    sender.send(_response(error_tensors(kind, message)), flags=_FINAL)
