"""The one owner of an LLMEngine: a thread that steps it; everything else talks to it through queues.

Callers ``submit`` a request and read its ``RequestStream``; tokens accumulate in the stream between
reads, so a slow reader gets several tokens per read instead of a growing backlog of messages.
``abort`` reaches the engine at the next step boundary.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from cpu_engine.engine import LLMEngine, RequestOutput
from cpu_engine.sampling import SamplingParams
from cpu_engine.stats import EngineStats
from cpu_engine.thread_names import ENGINE_THREAD, name_this_thread
from sluice.wire import EngineErrorKind, EnginePriority, FinishReason, TokenLogprob

log = logging.getLogger(__name__)


class StreamError(StrEnum):
    """Why a stream ended without finishing: the caller's fault, or the engine's."""

    INVALID_REQUEST = "invalid_request"  # refused at add (bad token ids, too long for the model or pool)
    ENGINE_ERROR = "engine_error"  # a step failed; the request may be retried
    ENGINE_STOPPED = "engine_stopped"


def error_kind(stream_error: StreamError | None) -> EngineErrorKind:
    """The wire's kind of an engine stream's error: only a request the engine refused is the caller's
    fault; a failed step, the engine stopping, or an error it did not classify is the engine's."""
    if stream_error is StreamError.INVALID_REQUEST:
        return EngineErrorKind.INVALID_REQUEST
    return EngineErrorKind.ENGINE_ERROR


@dataclass
class StreamDelta:
    """One answer's tokens produced since the previous read (``index``: 0 unless n > 1), with their
    log-probabilities where asked; ``answer_finished`` when that answer has ended (its ``finish_reason``),
    ``finished`` on the request's last delta (every answer ended, or an error)."""

    token_ids: list[int]
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_prompt_tokens: int
    error: str | None = None
    error_kind: StreamError | None = None
    index: int = 0
    logprobs: list[TokenLogprob] | None = None
    answer_finished: bool = False
    prompt_logprobs: list[TokenLogprob] | None = None  # with the answer's first tokens, when asked


@dataclass
class _Answer:
    """What one answer of a request has made that was not read yet."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    last: RequestOutput | None = None
    end_read: bool = False
    prompt_logprobs: list[TokenLogprob] | None = None

    def has_news(self) -> bool:
        return bool(self.tokens) or (self.last is not None and self.last.finished and not self.end_read)


@dataclass
class RequestStream:
    """A request's output as the engine makes it, read by one consumer: each read takes one answer's
    tokens (the lowest index with any), so a slow reader gets several tokens per read instead of a
    growing backlog of messages."""

    request_id: str
    on_update: Callable[[], None] | None = None
    submitted_s: float = field(default_factory=time.monotonic)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _answers: dict[int, _Answer] = field(default_factory=dict)
    _request_finished: bool = False
    _error: str | None = None
    _error_kind: StreamError | None = None
    _taken_final: bool = False

    def _push(self, out: RequestOutput) -> None:
        with self._cond:
            answer = self._answers.setdefault(out.index, _Answer())
            answer.tokens.extend(out.new_token_ids)
            if out.new_logprobs:
                answer.logprobs.extend(out.new_logprobs)
            if out.prompt_logprobs is not None:
                answer.prompt_logprobs = out.prompt_logprobs
            answer.last = out
            self._request_finished = self._request_finished or out.request_finished
            self._cond.notify_all()
        if self.on_update is not None:
            self.on_update()

    def _fail(self, kind: StreamError, error: str) -> None:
        with self._cond:
            self._error = error
            self._error_kind = kind
            self._cond.notify_all()
        if self.on_update is not None:
            self.on_update()

    def _ready(self) -> bool:
        return (
            self._error is not None
            or self._request_finished
            or any(a.has_news() for a in self._answers.values())
        )

    def take(self, timeout_s: float | None = None) -> StreamDelta | None:
        """Block until there are new tokens or an end; None on timeout or after the final delta."""
        with self._cond:
            if self._taken_final:
                return None
            ready = self._cond.wait_for(self._ready, timeout_s)
            return self._take_locked() if ready else None

    def has_ended(self) -> bool:
        """The request finished or failed: its final delta is ready (or taken)."""
        with self._cond:
            return self._error is not None or self._request_finished

    def take_nowait(self) -> StreamDelta | None:
        with self._cond:
            if self._taken_final or not self._ready():
                return None
            return self._take_locked()

    def _take_locked(self) -> StreamDelta:
        news = sorted(i for i, a in self._answers.items() if a.has_news())
        index = news[0] if news else 0
        answer = self._answers.get(index) or _Answer()
        last = answer.last
        answer_finished = bool(news) and bool(last and last.finished)
        if answer_finished:
            answer.end_read = True
        # The request's last delta: it ended, and no other answer has anything left to read.
        finished = self._error is not None or (self._request_finished and len(news) <= 1)
        delta = StreamDelta(
            token_ids=answer.tokens,
            finished=finished,
            finish_reason=last.finish_reason if last else None,
            num_prompt_tokens=last.num_prompt_tokens if last else 0,
            num_output_tokens=last.num_output_tokens if last else 0,
            num_cached_prompt_tokens=last.num_cached_prompt_tokens if last else 0,
            error=self._error,
            error_kind=self._error_kind,
            index=index,
            logprobs=answer.logprobs or None,
            answer_finished=answer_finished,
            prompt_logprobs=answer.prompt_logprobs,
        )
        answer.tokens, answer.logprobs, answer.prompt_logprobs = [], [], None
        self._taken_final = finished
        return delta


@dataclass(frozen=True)
class _Add:
    stream: RequestStream
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: EnginePriority
    cache_scope: str


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Stop:
    pass


_Command = _Add | _Abort | _Stop


class EngineThread:
    def __init__(self, engine: LLMEngine, name: str = "sluice-engine") -> None:
        self._engine = engine
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # owned by the engine thread
        self._stats = engine.stats()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        log.info("%s started: %s", name, engine.dtype_choice.describe())

    # ----- callers' side (any thread) -----
    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: EnginePriority = EnginePriority.UNDER_SHARE,
        cache_scope: str = "",
        on_update: Callable[[], None] | None = None,
    ) -> RequestStream:
        stream = RequestStream(request_id, on_update)
        self._commands.put(_Add(stream, prompt_token_ids, params, priority, cache_scope))
        return stream

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step (never blocks the engine)."""
        return self._stats

    def close(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        self._commands.put(_Stop())
        self._thread.join(timeout_s)

    # ----- the engine thread -----
    def _run(self) -> None:
        # NOTE: first, before any kernel: the OpenMP workers this thread starts take its name.
        name_this_thread(ENGINE_THREAD)
        engine = self._engine
        while not self._stopping.is_set():
            # Block for work only when idle; otherwise apply what arrived and step again.
            block = not engine.has_unfinished()
            try:
                self._apply(self._commands.get(block=block))
                while True:
                    self._apply(self._commands.get_nowait())
            except queue.Empty:
                pass
            if self._stopping.is_set():
                break
            try:
                outputs = engine.step()
            except Exception as exc:  # a bug or a bad tensor: fail what is in flight, keep serving
                log.exception("engine step failed; failing %d in-flight requests", len(self._streams))
                self._fail_all(StreamError.ENGINE_ERROR, f"engine error: {exc}")
                continue
            for out in outputs:
                self._deliver(out)
            self._stats = engine.stats()
        self._fail_all(StreamError.ENGINE_STOPPED, "engine stopped")

    def _fail_all(self, kind: StreamError, error: str) -> None:
        for request_id, stream in list(self._streams.items()):
            self._engine.abort_request(request_id)
            stream._fail(kind, error)
        self._streams.clear()
        self._stats = self._engine.stats()

    def _apply(self, command: _Command) -> None:
        if isinstance(command, _Add):
            stream = command.stream
            try:
                self._engine.add_request(
                    stream.request_id,
                    command.prompt_token_ids,
                    command.params,
                    command.priority,
                    command.cache_scope,
                )
            except ValueError as exc:
                stream._fail(StreamError.INVALID_REQUEST, str(exc))
                return
            self._streams[stream.request_id] = stream
        elif isinstance(command, _Abort):
            for out in self._engine.abort_request(command.request_id):
                self._deliver(out)
            self._stats = self._engine.stats()

    def _deliver(self, out: RequestOutput) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None:
            return
        if out.request_finished:
            del self._streams[out.request_id]
        stream._push(out)
